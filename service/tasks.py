"""Celery tasks: thin, they take ids and call plain functions."""
from __future__ import annotations

from .celery_app import celery_app


@celery_app.task(name="rlvr.run_job")
def run_job(job_id: str) -> None:
    from .runner import execute_job

    execute_job(job_id)


def enqueue(job_id: str) -> None:
    run_job.apply_async(args=[job_id], retry=True, retry_policy={"max_retries": 2, "interval_start": 0.2})
