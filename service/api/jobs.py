"""/v1/jobs: submit, list, get, lifecycle actions, metrics, events (+SSE), checkpoints, rollouts."""
from __future__ import annotations

import asyncio
import base64
import datetime as dt
import time
from pathlib import Path
from typing import Iterator

from fastapi import HTTPException, Query, Request, status
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response, StreamingResponse
from sse_starlette import EventSourceResponse, ServerSentEvent

from trainer.config import JobSpec

from ..access.keys import KEY_RECHECK_S, Scope, still_valid
from ..deps import PrincipalDep, ScopeDep, SettingsDep, StoreDep
from ..http.guard import INT64_MAX, api_router, parse_int, safe_json
from ..jobs.schemas import CheckpointOut, EventList, EventOut, JobList, JobOut, MetricsOut, RolloutOut, render_rows
from ..jobs.submit import check, submit
from ..settings import Settings
from ..store.jobs import TERMINAL, JobNotFound, JobStatus, Store
from ..worker.tasks import enqueue_or_warn

router = api_router(prefix="/v1/jobs", tags=["jobs"])
MAX_ID = 2**31 - 1  # step and event-id columns are 32-bit integers
SSE_RETRY_MS = 2000  # what the stream tells a client to wait before reconnecting


def _job(store: Store, job_id: str, scope: Scope):
    return store.get_job(job_id, scope.only)  # JobNotFound: a 404 (service/app.py)


@router.post("", status_code=status.HTTP_201_CREATED, response_model=JobOut)
def create_job(spec: JobSpec, store: StoreDep, settings: SettingsDep, scope: ScopeDep) -> JobOut:
    return JobOut.of(submit(check(spec, settings, store, scope), store, settings, scope))


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
              metadata: list[str] = Query([],
                                          description="key=value filters on job metadata (repeatable).")) -> JobList:
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
    job, enqueue = store.request(job_id, action, scope.only)  # JobNotFound 404, IllegalTransition 409
    if enqueue:
        enqueue_or_warn(store, settings, job_id)
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
    job = store.delete_job(job_id, scope.only)  # JobNotFound 404, IllegalTransition 409
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


@router.get("/{job_id}/events/stream", response_class=EventSourceResponse,
            responses={200: {"content": {"text/event-stream": {}}}})
async def stream_events(job_id: str, request: Request, store: StoreDep, scope: ScopeDep, settings: SettingsDep,
                        principal: PrincipalDep, after: int = Query(0, ge=0, le=INT64_MAX),
                        timeout: float = Query(3600, gt=0, le=86_400, description="Close after this many seconds.")):
    """Server-sent events (sse-starlette): every event of the job as it happens, each with its ``id``; closes
    with an ``end`` event when the job ends, pauses or is deleted. The stream opens with ``retry:`` (how long
    a client waits before reconnecting) and sends a keep-alive comment every ``RLVR_SSE_PING_S`` seconds; a
    reconnecting client's ``Last-Event-ID`` header resumes after that event. The key is checked again every
    second while idle and before every batch it delivers: a revoked key's stream ends with an ``end`` event
    (reason ``key revoked``) and delivers nothing written after the revocation."""
    await run_in_threadpool(_job, store, job_id, scope)
    resumed = parse_int(request.headers.get("last-event-id"), ("header", "Last-Event-ID"))
    last = after if resumed is None else resumed

    async def gen():
        nonlocal last
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        checked = loop.time()
        yield ServerSentEvent(comment="rlvr job events", retry=SSE_RETRY_MS)
        while loop.time() < deadline:  # a client gone is noticed by sse-starlette, which cancels this
            rows = await run_in_threadpool(store.get_events, job_id, last, 500)
            # The key is asked about before every batch (rows written after a revocation were fetched after it
            # committed, so none reaches this key) and once a second while idle.
            if rows or loop.time() - checked >= KEY_RECHECK_S:
                if not await run_in_threadpool(still_valid, store, principal):
                    yield ServerSentEvent('{"reason": "key revoked"}', event="end")
                    return
                checked = loop.time()
            for e in rows:
                last = e.id
                yield ServerSentEvent(safe_json(EventOut.of(e).model_dump(mode="json")), event=e.type, id=str(e.id))
            if not rows:
                try:
                    job = await run_in_threadpool(store.get_job, job_id)
                except JobNotFound:  # deleted while we streamed: say so and end cleanly
                    yield ServerSentEvent('{"reason": "deleted"}', event="end")
                    return
                if job.status in TERMINAL or job.status == "paused":
                    yield ServerSentEvent("{}", event="end")
                    return
                await asyncio.sleep(0.5)

    return EventSourceResponse(gen(), ping=settings.sse_ping_s, sep="\n", send_timeout=30,
                               headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


@router.get("/{job_id}/checkpoints", response_model=list[CheckpointOut])
def list_checkpoints(job_id: str, store: StoreDep, scope: ScopeDep) -> list[CheckpointOut]:
    _job(store, job_id, scope)
    return render_rows(store.get_checkpoints(job_id), CheckpointOut.of)[0]


@router.get("/{job_id}/checkpoints/{name}/download", response_class=StreamingResponse, response_model=None,
            responses={200: {"content": {"application/x-tar": {}}}})
def download_checkpoint(job_id: str, name: str, store: StoreDep, scope: ScopeDep, principal: PrincipalDep,
                        state: bool = Query(False, description="Also the trainer state (optimiser, RNG, data "
                                            "position: what a resume needs); default: the servable HF folder."),
                        merged: bool = Query(False, description="A LoRA job's final checkpoint: its adapters "
                                             "merged into the base weights (a plain HF folder).")
                        ) -> StreamingResponse:
    """The HF checkpoint folder (safetensors, config, tokenizer) as a tar, streamed as it is read."""
    from trainer.checkpoint import STATE_FILE

    from ..jobs.tarstream import tar_stream

    _job(store, job_id, scope)
    ckpt = next((c for c in store.get_checkpoints(job_id) if c.name == name), None)
    if ckpt is None or not Path(ckpt.path).is_dir():
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"checkpoint {name!r} not found")
    folder, arc, skip = Path(ckpt.path), name, set() if state else {STATE_FILE}
    if merged:
        folder, arc = folder / "merged", f"{name}-merged"
        if not folder.is_dir():
            raise HTTPException(status.HTTP_404_NOT_FOUND, f"checkpoint {name!r} has no merged weights (only a "
                                "LoRA job's final checkpoint does)")
    else:
        skip.add("merged")
    return StreamingResponse(_while_valid(tar_stream(folder, arc, skip), store, principal),
                             media_type="application/x-tar",
                             headers={"Content-Disposition": f'attachment; filename="{job_id}-{arc}.tar"'})


def _while_valid(chunks, store: Store, principal) -> Iterator[bytes]:
    """``chunks`` until the key is revoked (checked every KEY_RECHECK_S): a long download stops there."""
    checked = time.monotonic()
    for chunk in chunks:
        if time.monotonic() - checked >= KEY_RECHECK_S:
            if not still_valid(store, principal):
                return  # the client sees the archive cut short
            checked = time.monotonic()
        yield chunk


@router.get("/{job_id}/rollouts", response_model=list[RolloutOut])
def list_rollouts(job_id: str, store: StoreDep, scope: ScopeDep,
                  step: int | None = Query(None, ge=0, le=MAX_ID, description="One step (default: the latest ones)."),
                  limit: int = Query(5, ge=1, le=100)) -> list[RolloutOut]:
    """Sampled groups: prompt, reference, completions with rewards and per-verifier verdicts (an episode's
    token ledger, kept under ``episodes.keep_tokens``, is left to ``/rollouts/export``)."""
    _job(store, job_id, scope)
    return [RolloutOut(step=r.step, groups=[_without_ledgers(g) for g in r.data])
            for r in store.get_rollouts(job_id, step, limit)]


def _without_ledgers(g):
    if not isinstance(g, dict) or not isinstance(g.get("completions"), list):
        return g
    return {**g, "completions": [{k: v for k, v in c.items() if k != "ledger"} if isinstance(c, dict) else c
                                 for c in g["completions"]]}


@router.get("/{job_id}/rollouts/export", response_class=StreamingResponse, responses={200: {
    "content": {"application/x-ndjson": {}}, "description": "One JSON object per stored episode."}})
def export_rollouts(job_id: str, store: StoreDep, scope: ScopeDep,
                    step: int | None = Query(None, ge=0, le=MAX_ID, description="One step (default: the latest "
                                             "ones)."),
                    limit: int = Query(20, ge=1, le=100, description="Steps, newest first, when no step is "
                                       "given (at most 100: a reply holds every token of their stored "
                                       "groups).")) -> StreamingResponse:
    """The stored episodes (a few groups a step) with their whole token ledger, one JSON line each: ``step``,
    ``group``, ``index``, ``prompt``, ``reward`` (the one the update used), ``env_reward`` (an HTTP
    environment's own), ``advantage`` (what the update gave it; null for a group
    resampled away, never trained on), ``trained``, and trainer.episodes.export's ``calls`` (each engine call's
    prompt ids, completion ids, log-probs, policy version) and ``datums`` (Tinker datums: what this service's
    Tinker door, or Tinker's, trains on as it stands). Needs ``episodes.keep_tokens`` in the job's spec."""
    from trainer.episodes import export

    _job(store, job_id, scope)
    lines = []
    for r in sorted(store.get_rollouts(job_id, step, limit), key=lambda r: r.step):
        for gi, g in enumerate(r.data if isinstance(r.data, list) else []):
            for j, c in enumerate(g.get("completions", []) if isinstance(g, dict) else []):
                if not isinstance(c, dict) or "ledger" not in c:
                    continue
                trained = not g.get("resampled") and not c.get("excluded")
                adv = c.get("advantage") if not g.get("resampled") else None
                out = export(c["ledger"], float(adv or 0.0))
                out["env_reward"] = out.pop("reward")  # the environment's own; "reward" is what the update used
                lines.append(safe_json({"step": r.step, "group": gi, "index": j, "prompt": g.get("prompt"),
                                        "reward": c.get("reward"), "advantage": adv, "trained": trained,
                                        **out}) + "\n")
    if not lines:
        raise HTTPException(status.HTTP_404_NOT_FOUND, "no stored episode of this job keeps its tokens "
                            "(the job's spec needs episodes.keep_tokens: true)" if step is None else
                            f"no stored episode of step {step} keeps its tokens (episodes.keep_tokens)")
    return StreamingResponse(iter(lines), media_type="application/x-ndjson",
                             headers={"Content-Disposition": f'attachment; filename="{job_id}-episodes.jsonl"'})
