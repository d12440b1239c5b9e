"""Run one stored job with the trainer and record everything in the store.

Shared by the Celery task and by tests; the only place that maps trainer outcomes onto job status.
"""
from __future__ import annotations

import logging
import socket
import traceback
from typing import Any

from trainer.config import JobSpec

from .settings import Settings, get_settings
from .store import TERMINAL, JobStatus, Store

log = logging.getLogger("rlvr.runner")


def execute_job(job_id: str, settings: Settings | None = None, store: Store | None = None) -> str:
    settings = settings or get_settings()
    store = store or Store(settings.db_url)
    job = store.get_job(job_id)
    if JobStatus(job.status) in TERMINAL or job.status == JobStatus.paused.value:
        log.info("job %s is %s; nothing to do", job_id, job.status)
        return job.status
    run_dir = settings.runs_dir / job_id
    store.mark_running(job_id, worker=socket.gethostname(), run_dir=str(run_dir))
    try:
        from trainer.loop import train

        spec = JobSpec.model_validate(job.spec)
        if settings.worker_threads and not spec.train.threads:
            spec.train.threads = settings.worker_threads

        def on_step(step: int, metrics: dict[str, Any]) -> None:
            store.put_metrics(job_id, step, metrics)

        def should_stop() -> str | None:
            return store.get_job(job_id).stop_request

        result = train(spec, run_dir, models_dir=settings.models_dir, on_step=on_step,
                       should_stop=should_stop, log=lambda msg: log.info("%s: %s", job_id, msg))
        status = {"succeeded": JobStatus.succeeded, "paused": JobStatus.paused,
                  "cancelled": JobStatus.cancelled}[result.status]
        store.finish(job_id, status, result={
            "accuracy_before": result.accuracy_before, "accuracy_after": result.accuracy_after,
            "checkpoint": result.checkpoint, "steps": result.step,
        })
        return status.value
    except Exception as e:  # any failure ends the job `failed` with its message, never stuck running
        log.error("job %s failed: %s", job_id, traceback.format_exc())
        store.finish(job_id, JobStatus.failed, error_code=type(e).__name__, error_message=str(e)[:4000])
        return JobStatus.failed.value
