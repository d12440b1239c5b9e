"""/v1/jobs: submit, list, get, metrics."""
from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, HTTPException, Query, status
from fastapi.exceptions import RequestValidationError

from trainer.config import JobSpec
from verifiers import is_registered

from ..deps import SettingsDep, StoreDep
from ..schemas import JobList, JobOut, MetricsOut
from ..settings import Settings
from ..store import JobNotFound, JobStatus

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])


def check_spec(spec: JobSpec, settings: Settings) -> None:
    """Checks pydantic cannot do alone (registry, filesystem); 422 naming the field, before queueing."""
    errors = []
    for i, v in enumerate(spec.verifiers):
        if not is_registered(v.name):
            from verifiers import available

            errors.append({"loc": ("body", "verifiers", i, "name"), "type": "value_error",
                           "msg": f"unknown verifier {v.name!r}; known: {', '.join(available())}"})
    if settings.validate_paths:
        mp = spec.model.path
        if mp.startswith("builtin:"):
            if mp != "builtin:tiny-arith":
                errors.append({"loc": ("body", "model", "path"), "type": "value_error",
                               "msg": f"unknown built-in model {mp!r}; known: builtin:tiny-arith"})
        elif not (Path(mp).expanduser() / "config.json").is_file():
            errors.append({"loc": ("body", "model", "path"), "type": "value_error",
                           "msg": f"{mp!r} is not an HF checkpoint directory (no config.json)"})
        for field in ("dataset", "eval_dataset"):
            d = getattr(spec.data, field)
            if d is None:
                continue
            if d.startswith("builtin:"):
                if d != "builtin:arithmetic":
                    errors.append({"loc": ("body", "data", field), "type": "value_error",
                                   "msg": f"unknown built-in dataset {d!r}; known: builtin:arithmetic"})
            elif not Path(d).expanduser().is_file():
                errors.append({"loc": ("body", "data", field), "type": "value_error",
                               "msg": f"dataset file {d!r} not found"})
    if errors:
        raise RequestValidationError(errors)


@router.post("", status_code=status.HTTP_201_CREATED, response_model=JobOut)
def create_job(spec: JobSpec, store: StoreDep, settings: SettingsDep) -> JobOut:
    check_spec(spec, settings)
    job = store.create_job(spec.model_dump(mode="json"))
    from ..tasks import enqueue

    try:
        enqueue(job.id, settings)
    except Exception as e:  # the broker is down: say so, and don't leave a job that never runs
        store.finish(job.id, JobStatus.failed, error_code="enqueue_failed", error_message=str(e))
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, f"could not queue the job: {e}") from e
    return JobOut.of(store.get_job(job.id))


@router.get("", response_model=JobList)
def list_jobs(store: StoreDep, status_: JobStatus | None = Query(None, alias="status"),
              limit: int = Query(100, ge=1, le=1000)) -> JobList:
    return JobList(data=[JobOut.of(j) for j in store.list_jobs(status_.value if status_ else None, limit)])


@router.get("/{job_id}", response_model=JobOut)
def get_job(job_id: str, store: StoreDep) -> JobOut:
    try:
        return JobOut.of(store.get_job(job_id))
    except JobNotFound:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"job {job_id!r} not found") from None


@router.get("/{job_id}/metrics", response_model=MetricsOut)
def get_metrics(job_id: str, store: StoreDep, keys: str | None = Query(None, max_length=4096,
                description="Comma-separated metric names to return (default: all)."),
                after: int = Query(-1, ge=-1, description="Only steps greater than this.")) -> MetricsOut:
    try:
        store.get_job(job_id)
    except JobNotFound:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"job {job_id!r} not found") from None
    wanted = {k.strip() for k in keys.split(",") if k.strip()} if keys else None
    return MetricsOut.of(job_id, store.get_metrics(job_id, after), wanted)
