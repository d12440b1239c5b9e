"""/v1/jobs: submit, list, get, lifecycle actions, metrics, events (+SSE), checkpoints, rollouts."""
from __future__ import annotations

import asyncio
import base64
import datetime as dt
import json
from pathlib import Path

from fastapi import APIRouter, HTTPException, Query, Request, status
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response, StreamingResponse

from trainer.config import JobSpec

from ..deps import PrincipalDep, SettingsDep, StoreDep
from ..schemas import CheckpointOut, EventList, EventOut, JobList, JobOut, MetricsOut, RolloutOut
from ..settings import Settings
from ..store import TERMINAL, IllegalTransition, JobNotFound, JobStatus, Store

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])


def _is_file(path: str | Path) -> bool:
    """False, not an exception, for names the OS refuses (too long, NUL bytes…)."""
    try:
        return Path(path).expanduser().is_file()
    except (OSError, ValueError):
        return False


def _model_errors(mp: str, loc: tuple, settings: Settings) -> list[dict]:
    """A model a job names (the policy, a PPO critic): built-in, pulled by name, or a server path."""
    errors = []
    if not settings.local_paths_allowed:  # tenants must not make the server read its own files
        rel = Path(mp)
        inside = not rel.is_absolute() and ".." not in rel.parts and _is_file(settings.models_dir / rel / "config.json")
        if not mp.startswith("builtin:") and not inside:
            errors.append({"loc": loc, "type": "value_error",
                           "msg": "server paths are disabled: use a builtin: model or a name under the models dir"})
    if mp.startswith("builtin:"):
        if mp != "builtin:tiny-arith":
            errors.append({"loc": loc, "type": "value_error",
                           "msg": f"unknown built-in model {mp!r}; known: builtin:tiny-arith"})
    elif settings.validate_paths and not (_is_file(Path(mp) / "config.json")
                                          or _is_file(settings.models_dir / mp / "config.json")):
        errors.append({"loc": loc, "type": "value_error",
                       "msg": f"{mp!r} is not an HF checkpoint directory (no config.json)"})
    return errors


def check_spec(spec: JobSpec, settings: Settings, store: Store, tenant: str) -> JobSpec:
    """Checks pydantic cannot do alone (registry, filesystem); 422 naming the field, before queueing."""
    from ..files import FileNotFound, get_file

    from ..verifier_store import pin_job_spec

    # registered names, stored (HTTP) verifiers pinned to a version, and each verifier's config
    pinned, errors = pin_job_spec(spec, store.engine)
    models = [(("body", "model", "path"), spec.model.path)]
    if spec.ppo is not None and spec.ppo.critic:
        models.append((("body", "ppo", "critic"), spec.ppo.critic))
    for loc, mp in models:
        errors += _model_errors(mp, loc, settings)
    if not settings.local_paths_allowed:  # tenants must not make the server read its own files
        for field in ("dataset", "eval_dataset"):
            d = getattr(spec.data, field)
            if d and not (d.startswith("builtin:") or d.startswith("file-")):
                errors.append({"loc": ("body", "data", field), "type": "value_error",
                               "msg": "server paths are disabled: upload the file (POST /v1/files) and use its id"})
        if spec.dpo is not None and spec.dpo.pairs not in ("online",) and not spec.dpo.pairs.startswith("file-"):
            errors.append({"loc": ("body", "dpo", "pairs"), "type": "value_error",
                           "msg": "server paths are disabled: upload the pairs file and use its id"})
    for field in ("dataset", "eval_dataset"):
        d = getattr(spec.data, field)
        if d is None:
            continue
        if d.startswith("builtin:"):
            if d != "builtin:arithmetic":
                errors.append({"loc": ("body", "data", field), "type": "value_error",
                               "msg": f"unknown built-in dataset {d!r}; known: builtin:arithmetic"})
        elif d.startswith("file-"):
            try:
                get_file(store, d, tenant)
            except FileNotFound:
                errors.append({"loc": ("body", "data", field), "type": "value_error", "msg": f"file {d!r} not found"})
        elif settings.validate_paths and not _is_file(d):
            errors.append({"loc": ("body", "data", field), "type": "value_error",
                           "msg": f"dataset file {d!r} not found"})
    if spec.dpo is not None and spec.dpo.pairs != "online":
        p = spec.dpo.pairs
        if p.startswith("file-"):
            try:
                get_file(store, p, tenant)
            except FileNotFound:
                errors.append({"loc": ("body", "dpo", "pairs"), "type": "value_error", "msg": f"file {p!r} not found"})
        elif settings.validate_paths and not _is_file(p):
            errors.append({"loc": ("body", "dpo", "pairs"), "type": "value_error",
                           "msg": f"pairs file {p!r} not found (or use `online`)"})
    if errors:
        raise RequestValidationError(errors)
    return pinned


def _enqueue_or_fail(store: Store, settings: Settings, job_id: str) -> None:
    from ..tasks import enqueue

    try:
        enqueue(job_id, settings)
    except Exception as e:  # the broker is down: say so; the reaper re-sends queued jobs when it is back
        store.add_event(job_id, "warning", f"could not reach the broker yet: {e}", level="warning")


def _job(store: Store, job_id: str, tenant: str):
    try:
        return store.get_job(job_id, tenant)
    except JobNotFound:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"job {job_id!r} not found") from None


def _tenant(principal) -> str | None:
    return None if principal.tenant == "admin" else principal.tenant


@router.post("", status_code=status.HTTP_201_CREATED, response_model=JobOut)
def create_job(spec: JobSpec, store: StoreDep, settings: SettingsDep, principal: PrincipalDep) -> JobOut:
    pinned = check_spec(spec, settings, store, principal.tenant)
    job = store.create_job(pinned.model_dump(mode="json"), tenant=principal.tenant)
    _enqueue_or_fail(store, settings, job.id)
    return JobOut.of(store.get_job(job.id))


def _encode_cursor(job) -> str:
    return base64.urlsafe_b64encode(f"{job.created_at.isoformat()}|{job.id}".encode()).decode()


def _decode_cursor(cursor: str) -> tuple[dt.datetime, str]:
    try:
        ts, _, job_id = base64.urlsafe_b64decode(cursor.encode()).decode().partition("|")
        return dt.datetime.fromisoformat(ts), job_id
    except (ValueError, UnicodeDecodeError):
        raise RequestValidationError([{"loc": ("query", "after"), "type": "value_error",
                                       "msg": "not a cursor returned by this API"}]) from None


@router.get("", response_model=JobList)
def list_jobs(store: StoreDep, principal: PrincipalDep,
              status_: JobStatus | None = Query(None, alias="status"),
              limit: int = Query(50, ge=1, le=500),
              after: str | None = Query(None, max_length=512, description="`next_cursor` of the previous page."),
              metadata: list[str] = Query([], description="key=value filters on job metadata (repeatable).")) -> JobList:
    meta = {}
    for item in metadata:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise RequestValidationError([{"loc": ("query", "metadata"), "type": "value_error",
                                           "msg": f"expected key=value, got {item!r}"}])
        meta[k] = v
    jobs = store.list_jobs(_tenant(principal), status_.value if status_ else None, limit + 1,
                           _decode_cursor(after) if after else None, meta or None)
    page = jobs[:limit]
    return JobList(data=[JobOut.of(j) for j in page], has_more=len(jobs) > limit,
                   next_cursor=_encode_cursor(page[-1]) if len(jobs) > limit else None)


@router.get("/{job_id}", response_model=JobOut)
def get_job(job_id: str, store: StoreDep, principal: PrincipalDep) -> JobOut:
    return JobOut.of(_job(store, job_id, _tenant(principal)))


def _action(action: str, job_id: str, store: Store, settings: Settings, principal) -> JobOut:
    try:
        job, enqueue = store.request(job_id, action, _tenant(principal))
    except JobNotFound:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"job {job_id!r} not found") from None
    except IllegalTransition as e:
        raise HTTPException(status.HTTP_409_CONFLICT, str(e)) from None
    if enqueue:
        _enqueue_or_fail(store, settings, job_id)
    return JobOut.of(store.get_job(job_id))


@router.post("/{job_id}/cancel", response_model=JobOut)
def cancel_job(job_id: str, store: StoreDep, settings: SettingsDep, principal: PrincipalDep) -> JobOut:
    """Queued/paused: cancelled now. Running: stops at the next step boundary."""
    return _action("cancel", job_id, store, settings, principal)


@router.post("/{job_id}/pause", response_model=JobOut)
def pause_job(job_id: str, store: StoreDep, settings: SettingsDep, principal: PrincipalDep) -> JobOut:
    """Running: checkpoint at the next step, then release the worker. Queued: paused now."""
    return _action("pause", job_id, store, settings, principal)


@router.post("/{job_id}/resume", response_model=JobOut)
def resume_job(job_id: str, store: StoreDep, settings: SettingsDep, principal: PrincipalDep) -> JobOut:
    """Paused only: re-queued, continuing from its last checkpoint."""
    return _action("resume", job_id, store, settings, principal)


@router.delete("/{job_id}", status_code=status.HTTP_204_NO_CONTENT)
def delete_job(job_id: str, store: StoreDep, principal: PrincipalDep) -> Response:
    try:
        job = store.delete_job(job_id, _tenant(principal))
    except JobNotFound:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"job {job_id!r} not found") from None
    except IllegalTransition as e:
        raise HTTPException(status.HTTP_409_CONFLICT, str(e)) from None
    if job.run_dir:
        import shutil

        shutil.rmtree(job.run_dir, ignore_errors=True)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.get("/{job_id}/metrics", response_model=MetricsOut)
def get_metrics(job_id: str, store: StoreDep, principal: PrincipalDep,
                keys: str | None = Query(None, max_length=4096, description="Comma-separated metric names."),
                after: int = Query(-1, ge=-1, description="Only steps greater than this.")) -> MetricsOut:
    _job(store, job_id, _tenant(principal))
    wanted = {k.strip() for k in keys.split(",") if k.strip()} if keys else None
    return MetricsOut.of(job_id, store.get_metrics(job_id, after), wanted)


@router.get("/{job_id}/events", response_model=EventList)
def get_events(job_id: str, store: StoreDep, principal: PrincipalDep,
               after: int = Query(0, ge=0, description="Only events after this id (`next_after`)."),
               limit: int = Query(100, ge=1, le=1000)) -> EventList:
    _job(store, job_id, _tenant(principal))
    rows = store.get_events(job_id, after, limit + 1)
    page = rows[:limit]
    return EventList(data=[EventOut.of(e) for e in page], has_more=len(rows) > limit,
                     next_after=page[-1].id if page else after)


@router.get("/{job_id}/events/stream", response_class=StreamingResponse,
            responses={200: {"content": {"text/event-stream": {}}}})
async def stream_events(job_id: str, request: Request, store: StoreDep, principal: PrincipalDep,
                        after: int = Query(0, ge=0),
                        timeout: float = Query(3600, gt=0, le=86_400, description="Close after this many seconds.")):
    """Server-sent events: every event of the job as it happens; closes when the job ends."""
    await run_in_threadpool(_job, store, job_id, _tenant(principal))
    last = int(request.headers.get("last-event-id", after) or after)

    async def gen():
        nonlocal last
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline and not await request.is_disconnected():
            rows = await run_in_threadpool(store.get_events, job_id, last, 500)
            for e in rows:
                last = e.id
                payload = EventOut.of(e).model_dump_json()
                yield f"id: {e.id}\nevent: {e.type}\ndata: {payload}\n\n"
            if not rows:
                job = await run_in_threadpool(store.get_job, job_id)
                if job.status in TERMINAL or job.status == "paused":
                    yield "event: end\ndata: {}\n\n"
                    return
                yield ": keep-alive\n\n"
                await asyncio.sleep(0.5)

    return StreamingResponse(gen(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


@router.get("/{job_id}/checkpoints", response_model=list[CheckpointOut])
def list_checkpoints(job_id: str, store: StoreDep, principal: PrincipalDep) -> list[CheckpointOut]:
    _job(store, job_id, _tenant(principal))
    return [CheckpointOut.of(c) for c in store.get_checkpoints(job_id)]


@router.get("/{job_id}/checkpoints/{name}/download", response_class=Response,
            responses={200: {"content": {"application/x-tar": {}}}})
def download_checkpoint(job_id: str, name: str, store: StoreDep, principal: PrincipalDep) -> Response:
    """The HF checkpoint folder (safetensors, config, tokenizer, trainer state) as a tar."""
    import io
    import tarfile

    _job(store, job_id, _tenant(principal))
    ckpt = next((c for c in store.get_checkpoints(job_id) if c.name == name), None)
    if ckpt is None or not Path(ckpt.path).is_dir():
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"checkpoint {name!r} not found")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(ckpt.path, arcname=name)
    return Response(buf.getvalue(), media_type="application/x-tar",
                    headers={"Content-Disposition": f'attachment; filename="{job_id}-{name}.tar"'})


@router.get("/{job_id}/rollouts", response_model=list[RolloutOut])
def list_rollouts(job_id: str, store: StoreDep, principal: PrincipalDep,
                  step: int | None = Query(None, ge=0, description="One step (default: the latest ones)."),
                  limit: int = Query(5, ge=1, le=100)) -> list[RolloutOut]:
    """Sampled groups: prompt, reference, completions with rewards and per-verifier verdicts."""
    _job(store, job_id, _tenant(principal))
    return [RolloutOut(step=r.step, groups=r.data) for r in store.get_rollouts(job_id, step, limit)]
