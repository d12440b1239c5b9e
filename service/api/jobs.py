"""/v1/jobs: submit, list, get, lifecycle actions, metrics, events (+SSE), checkpoints, rollouts."""
from __future__ import annotations

import asyncio
import base64
import datetime as dt
from pathlib import Path

from fastapi import HTTPException, Query, Request, status
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response, StreamingResponse

from trainer.config import JobSpec

from ..auth import Scope
from ..deps import ScopeDep, SettingsDep, StoreDep
from ..guard import INT64_MAX, api_router, parse_int, redact_paths, safe_json
from ..schemas import CheckpointOut, EventList, EventOut, JobList, JobOut, MetricsOut, RolloutOut, render_rows
from ..settings import Settings
from ..store import TERMINAL, IllegalTransition, JobNotFound, JobStatus, Store

router = api_router(prefix="/v1/jobs", tags=["jobs"])
MAX_ID = 2**31 - 1  # step and event-id columns are 32-bit integers


def _is_file(path: str | Path) -> bool:
    """False, not an exception, for names the OS refuses (too long, NUL bytes…)."""
    try:
        return Path(path).expanduser().is_file()
    except (OSError, ValueError):
        return False


def named_model(name: str, settings: Settings) -> Path | None:
    """A model pulled into the models directory, by name (never a path that leaves it)."""
    rel = Path(name)
    if not name.strip() or rel.is_absolute() or ".." in rel.parts:
        return None
    d = settings.models_dir / rel
    return d if _is_file(d / "config.json") else None


def _err(loc: tuple, msg: str) -> dict:
    return {"loc": loc, "type": "value_error", "msg": msg}


def _model_errors(mp: str, loc: tuple, settings: Settings) -> list[dict]:
    """A model a job names (the policy, a PPO critic): built-in, pulled by name, or (auth off) a server path."""
    if mp.startswith("builtin:"):
        known = "builtin:tiny-arith"
        return [] if mp == known else [_err(loc, f"unknown built-in model {mp!r}; known: {known}")]
    if not settings.local_paths_allowed:
        # One answer whether the path exists, is refused or is outside the models dir: no file oracle.
        return [] if named_model(mp, settings) else [_err(loc, (
            f"model {mp!r} not found: use builtin:tiny-arith or the name of a model in the server's models "
            "directory (server paths are disabled)"))]
    if settings.validate_paths and not (_is_file(Path(mp) / "config.json") or named_model(mp, settings)):
        return [_err(loc, f"{mp!r} is not an HF checkpoint directory (no config.json)")]
    return []


def _data_errors(value: str, loc: tuple, settings: Settings, store: Store, owner: str, what: str) -> list[dict]:
    """A dataset / pairs reference: a built-in, an uploaded file id of the job's owner, or (auth off) a path."""
    from ..files import FileNotFound, get_file

    if value.startswith("builtin:"):
        return [] if value == "builtin:arithmetic" else [
            _err(loc, f"unknown built-in dataset {value!r}; known: builtin:arithmetic")]
    if value.startswith("file-"):
        try:
            get_file(store, value, owner)  # the worker reads it as the job's tenant
        except FileNotFound:
            return [_err(loc, f"file {value!r} not found")]
        return []
    if not settings.local_paths_allowed:  # the same answer for every path: no file oracle
        return [_err(loc, "server paths are disabled: upload the file (POST /v1/files) and use its id")]
    if settings.validate_paths and not _is_file(value):
        return [_err(loc, f"{what} {value!r} not found")]
    return []


def check_spec(spec: JobSpec, settings: Settings, store: Store, scope: Scope) -> JobSpec:
    """Checks pydantic cannot do alone (registry, files, models); 422 naming the field, before queueing."""
    from ..verifier_store import pin_job_spec

    # registered names, stored (HTTP) verifiers the scope may use, pinned to a version, and their configs
    pinned, errors = pin_job_spec(spec, store.engine, scope)
    errors += _model_errors(spec.model.path, ("body", "model", "path"), settings)
    if spec.ppo is not None and spec.ppo.critic:
        errors += _model_errors(spec.ppo.critic, ("body", "ppo", "critic"), settings)
    for field in ("dataset", "eval_dataset"):
        d = getattr(spec.data, field)
        if d is not None:
            errors += _data_errors(d, ("body", "data", field), settings, store, scope.tenant, "dataset file")
    if spec.dpo is not None and spec.dpo.pairs != "online":
        errors += _data_errors(spec.dpo.pairs, ("body", "dpo", "pairs"), settings, store, scope.tenant,
                               "pairs file (or use `online`)")
    if errors:
        raise RequestValidationError(errors)
    return pinned


def _enqueue_or_fail(store: Store, settings: Settings, job_id: str) -> None:
    from ..tasks import enqueue

    try:
        enqueue(job_id, settings)
    except Exception as e:  # the broker is down: say so; the reaper re-sends queued jobs when it is back
        store.add_event(job_id, "warning", redact_paths(f"could not reach the broker yet: {e}"), level="warning")


def _job(store: Store, job_id: str, scope: Scope):
    try:
        return store.get_job(job_id, scope.only)
    except JobNotFound:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"job {job_id!r} not found") from None


@router.post("", status_code=status.HTTP_201_CREATED, response_model=JobOut)
def create_job(spec: JobSpec, store: StoreDep, settings: SettingsDep, scope: ScopeDep) -> JobOut:
    pinned = check_spec(spec, settings, store, scope)
    job = store.create_job(pinned.model_dump(mode="json"), tenant=scope.tenant)
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
def list_jobs(store: StoreDep, scope: ScopeDep,
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
    jobs = store.list_jobs(scope.only, status_.value if status_ else None, limit + 1,
                           _decode_cursor(after) if after else None, meta or None)
    page = jobs[:limit]
    data, unreadable = render_rows(page, JobOut.of)
    return JobList(data=data, unreadable=unreadable, has_more=len(jobs) > limit,
                   next_cursor=_encode_cursor(page[-1]) if len(jobs) > limit else None)


@router.get("/{job_id}", response_model=JobOut)
def get_job(job_id: str, store: StoreDep, scope: ScopeDep) -> JobOut:
    return JobOut.of(_job(store, job_id, scope))


def _action(action: str, job_id: str, store: Store, settings: Settings, scope: Scope) -> JobOut:
    try:
        job, enqueue = store.request(job_id, action, scope.only)
    except JobNotFound:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"job {job_id!r} not found") from None
    except IllegalTransition as e:
        raise HTTPException(status.HTTP_409_CONFLICT, str(e)) from None
    if enqueue:
        _enqueue_or_fail(store, settings, job_id)
    return JobOut.of(store.get_job(job_id))


@router.post("/{job_id}/cancel", response_model=JobOut)
def cancel_job(job_id: str, store: StoreDep, settings: SettingsDep, scope: ScopeDep) -> JobOut:
    """Queued/paused: cancelled now. Running: stops at the next step boundary."""
    return _action("cancel", job_id, store, settings, scope)


@router.post("/{job_id}/pause", response_model=JobOut)
def pause_job(job_id: str, store: StoreDep, settings: SettingsDep, scope: ScopeDep) -> JobOut:
    """Running: checkpoint at the next step, then release the worker. Queued: paused now."""
    return _action("pause", job_id, store, settings, scope)


@router.post("/{job_id}/resume", response_model=JobOut)
def resume_job(job_id: str, store: StoreDep, settings: SettingsDep, scope: ScopeDep) -> JobOut:
    """Paused only: re-queued, continuing from its last checkpoint."""
    return _action("resume", job_id, store, settings, scope)


@router.delete("/{job_id}", status_code=status.HTTP_204_NO_CONTENT)
def delete_job(job_id: str, store: StoreDep, scope: ScopeDep) -> Response:
    try:
        job = store.delete_job(job_id, scope.only)
    except JobNotFound:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"job {job_id!r} not found") from None
    except IllegalTransition as e:
        raise HTTPException(status.HTTP_409_CONFLICT, str(e)) from None
    if job.run_dir:
        import shutil

        shutil.rmtree(job.run_dir, ignore_errors=True)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.get("/{job_id}/metrics", response_model=MetricsOut)
def get_metrics(job_id: str, store: StoreDep, scope: ScopeDep,
                keys: str | None = Query(None, max_length=4096, description="Comma-separated metric names."),
                after: int = Query(-1, ge=-1, le=MAX_ID, description="Only steps greater than this.")) -> MetricsOut:
    _job(store, job_id, scope)
    wanted = {k.strip() for k in keys.split(",") if k.strip()} if keys else None
    return MetricsOut.of(job_id, store.get_metrics(job_id, after), wanted)


@router.get("/{job_id}/events", response_model=EventList)
def get_events(job_id: str, store: StoreDep, scope: ScopeDep,
               after: int = Query(0, ge=0, le=INT64_MAX, description="Only events after this id (`next_after`)."),
               limit: int = Query(100, ge=1, le=1000)) -> EventList:
    _job(store, job_id, scope)
    rows = store.get_events(job_id, after, limit + 1)
    page = rows[:limit]
    return EventList(data=[EventOut.of(e) for e in page], has_more=len(rows) > limit,
                     next_after=page[-1].id if page else after)


@router.get("/{job_id}/events/stream", response_class=StreamingResponse,
            responses={200: {"content": {"text/event-stream": {}}}})
async def stream_events(job_id: str, request: Request, store: StoreDep, scope: ScopeDep,
                        after: int = Query(0, ge=0, le=INT64_MAX),
                        timeout: float = Query(3600, gt=0, le=86_400, description="Close after this many seconds.")):
    """Server-sent events: every event of the job as it happens; closes when the job ends (or is
    deleted). The ``Last-Event-ID`` header, when sent, resumes after that event id."""
    await run_in_threadpool(_job, store, job_id, scope)
    resumed = parse_int(request.headers.get("last-event-id"), ("header", "Last-Event-ID"))
    last = after if resumed is None else resumed

    async def gen():
        nonlocal last
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline and not await request.is_disconnected():
            rows = await run_in_threadpool(store.get_events, job_id, last, 500)
            for e in rows:
                last = e.id
                payload = safe_json(EventOut.of(e).model_dump(mode="json"))
                yield f"id: {e.id}\nevent: {e.type}\ndata: {payload}\n\n"
            if not rows:
                try:
                    job = await run_in_threadpool(store.get_job, job_id)
                except JobNotFound:  # deleted while we streamed: say so and end cleanly
                    yield 'event: end\ndata: {"reason": "deleted"}\n\n'
                    return
                if job.status in TERMINAL or job.status == "paused":
                    yield "event: end\ndata: {}\n\n"
                    return
                yield ": keep-alive\n\n"
                await asyncio.sleep(0.5)

    return StreamingResponse(gen(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


@router.get("/{job_id}/checkpoints", response_model=list[CheckpointOut])
def list_checkpoints(job_id: str, store: StoreDep, scope: ScopeDep) -> list[CheckpointOut]:
    _job(store, job_id, scope)
    return render_rows(store.get_checkpoints(job_id), CheckpointOut.of)[0]


@router.get("/{job_id}/checkpoints/{name}/download", response_class=Response,
            responses={200: {"content": {"application/x-tar": {}}}})
def download_checkpoint(job_id: str, name: str, store: StoreDep, scope: ScopeDep) -> Response:
    """The HF checkpoint folder (safetensors, config, tokenizer, trainer state) as a tar."""
    import io
    import tarfile

    _job(store, job_id, scope)
    ckpt = next((c for c in store.get_checkpoints(job_id) if c.name == name), None)
    if ckpt is None or not Path(ckpt.path).is_dir():
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"checkpoint {name!r} not found")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(ckpt.path, arcname=name)
    return Response(buf.getvalue(), media_type="application/x-tar",
                    headers={"Content-Disposition": f'attachment; filename="{job_id}-{name}.tar"'})


@router.get("/{job_id}/rollouts", response_model=list[RolloutOut])
def list_rollouts(job_id: str, store: StoreDep, scope: ScopeDep,
                  step: int | None = Query(None, ge=0, le=MAX_ID, description="One step (default: the latest ones)."),
                  limit: int = Query(5, ge=1, le=100)) -> list[RolloutOut]:
    """Sampled groups: prompt, reference, completions with rewards and per-verifier verdicts."""
    _job(store, job_id, scope)
    return [RolloutOut(step=r.step, groups=r.data) for r in store.get_rollouts(job_id, step, limit)]
