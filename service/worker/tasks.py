"""Celery tasks: thin, they take ids and call plain functions."""
from __future__ import annotations

from ..settings import Settings
from .celery_app import celery_app, celery_for


@celery_app.task(name="rlvr.run_job")
def run_job(job_id: str) -> None:
    from ..jobs.runner import execute_job

    execute_job(job_id, hard_exit=True)  # a hung step ends this pool process (Celery starts a new one)


def enqueue(job_id: str, settings: Settings) -> None:
    """Send the job id to the train queue of the broker these settings name."""
    celery_for(settings).send_task("rlvr.run_job", args=[job_id], queue=settings.train_queue, retry=True,
                                   retry_policy={"max_retries": 2, "interval_start": 0.2, "interval_max": 1})


def enqueue_or_warn(store, settings: Settings, job_id: str) -> None:
    """Enqueue a stored job; if the broker is down, say so in the job's events (the reaper re-sends
    queued jobs when it is back), never fail the request that stored it."""
    from ..access.redact import redact_paths

    try:
        enqueue(job_id, settings)
    except Exception as e:
        store.add_event(job_id, "warning", redact_paths(f"could not reach the broker yet: {e}"), level="warning")


@celery_app.task(name="rlvr.run_session")
def run_session(session_id: str) -> None:
    """Hold a training session (service/tinker) until it ends or idles out."""
    from ..tinker.worker import serve_session

    serve_session(session_id, hard_exit=True)


def enqueue_session(session_id: str, settings: Settings) -> None:
    celery_for(settings).send_task("rlvr.run_session", args=[session_id], queue=settings.train_queue, retry=True,
                                   retry_policy={"max_retries": 2, "interval_start": 0.2, "interval_max": 1})
