"""Job store: every state change goes through here (one place for the status rules)."""
from __future__ import annotations

import enum
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from .db import Job, Metric, init_db, utcnow


class JobStatus(str, enum.Enum):
    queued = "queued"
    running = "running"
    paused = "paused"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"


TERMINAL = {JobStatus.succeeded, JobStatus.failed, JobStatus.cancelled}


class JobNotFound(KeyError):
    pass


class Store:
    def __init__(self, url: str):
        self.url = url
        if url.startswith("sqlite:///"):
            Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        self.engine, self.Session = init_db(url)

    # ------------------------------------------------------------------ jobs
    def create_job(self, spec: dict[str, Any]) -> Job:
        with self.Session.begin() as s:
            job = Job(name=spec["name"], status=JobStatus.queued.value, spec=spec,
                      total_steps=spec["train"]["steps"])
            s.add(job)
        return job

    def get_job(self, job_id: str) -> Job:
        with self.Session() as s:
            job = s.get(Job, job_id)
            if job is None:
                raise JobNotFound(job_id)
            return job

    def list_jobs(self, status: str | None = None, limit: int = 100) -> list[Job]:
        with self.Session() as s:
            q = select(Job).order_by(Job.created_at.desc()).limit(limit)
            if status:
                q = q.where(Job.status == status)
            return list(s.scalars(q))

    def update(self, job_id: str, **fields: Any) -> Job:
        with self.Session.begin() as s:
            job = s.get(Job, job_id)
            if job is None:
                raise JobNotFound(job_id)
            for k, v in fields.items():
                setattr(job, k, v.value if isinstance(v, enum.Enum) else v)
            return job

    def mark_running(self, job_id: str, worker: str, run_dir: str) -> Job:
        return self.update(job_id, status=JobStatus.running, worker=worker, run_dir=run_dir,
                           started_at=utcnow(), error_code=None, error_message=None)

    def finish(self, job_id: str, status: JobStatus, result: dict[str, Any] | None = None,
               error_code: str | None = None, error_message: str | None = None) -> Job:
        fields: dict[str, Any] = {"status": status, "result": result, "error_code": error_code,
                                  "error_message": error_message, "stop_request": None}
        if status in TERMINAL:
            fields["finished_at"] = utcnow()
        return self.update(job_id, **fields)

    # ------------------------------------------------------------------ metrics
    def put_metrics(self, job_id: str, step: int, data: dict[str, Any]) -> None:
        """Idempotent per (job, step): a step replayed after a crash overwrites, never duplicates."""
        ins = pg_insert if self.engine.dialect.name == "postgresql" else sqlite_insert
        stmt = ins(Metric).values(job_id=job_id, step=step, data=data, created_at=utcnow())
        stmt = stmt.on_conflict_do_update(index_elements=["job_id", "step"], set_={"data": data})
        with self.Session.begin() as s:
            s.execute(stmt)
            job = s.get(Job, job_id)
            if job is not None and step > job.step:
                job.step = step

    def get_metrics(self, job_id: str, after: int = -1) -> list[Metric]:
        with self.Session() as s:
            q = select(Metric).where(Metric.job_id == job_id, Metric.step > after).order_by(Metric.step)
            return list(s.scalars(q))
