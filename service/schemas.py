"""HTTP response models. Requests use trainer.config.JobSpec directly (one source of truth)."""
from __future__ import annotations

import datetime as dt
from typing import Any

from pydantic import BaseModel

from trainer.config import JobSpec

from .db import Job, Metric


class JobError(BaseModel):
    code: str
    message: str


class Progress(BaseModel):
    step: int
    total_steps: int
    fraction: float


class JobOut(BaseModel):
    id: str
    name: str
    status: str
    progress: Progress
    error: JobError | None = None
    result: dict[str, Any] | None = None
    created_at: dt.datetime
    started_at: dt.datetime | None = None
    finished_at: dt.datetime | None = None
    spec: JobSpec

    @classmethod
    def of(cls, job: Job) -> "JobOut":
        return cls(
            id=job.id, name=job.name, status=job.status,
            progress=Progress(step=job.step, total_steps=job.total_steps,
                              fraction=round(job.step / max(job.total_steps, 1), 4)),
            error=JobError(code=job.error_code, message=job.error_message or "") if job.error_code else None,
            result=job.result, created_at=job.created_at, started_at=job.started_at,
            finished_at=job.finished_at, spec=JobSpec.model_validate(job.spec),
        )


class JobList(BaseModel):
    data: list[JobOut]


class MetricPoint(BaseModel):
    step: int
    metrics: dict[str, Any]


class MetricsOut(BaseModel):
    job_id: str
    points: list[MetricPoint]

    @classmethod
    def of(cls, job_id: str, rows: list[Metric], keys: set[str] | None) -> "MetricsOut":
        pts = [MetricPoint(step=r.step, metrics={k: v for k, v in r.data.items() if keys is None or k in keys})
               for r in rows]
        return cls(job_id=job_id, points=pts)
