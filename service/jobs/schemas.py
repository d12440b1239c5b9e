"""HTTP response models. Requests use trainer.config.JobSpec directly (one source of truth)."""
from __future__ import annotations

import datetime as dt
import json
import logging
import math
from pathlib import PurePosixPath
from typing import Any, Callable, Iterable, Literal, TypeVar

from pydantic import BaseModel, Field, ValidationError

from trainer.config import JobSpec
from verifiers import Status, Verdict
from verifiers.remote import ERROR_KINDS

from ..access.redact import redact_paths
from ..store.tables import Checkpoint, Event, File, Job, Metric
from .catalog import fine_tuned_id

log = logging.getLogger("rlvr.api")
T = TypeVar("T")


def render_rows(rows: Iterable[Any], render: Callable[[Any], T]) -> tuple[list[T], list[str]]:
    """Render each stored row; one that cannot be rendered is left out and named (by id), so one bad
    row never breaks a list."""
    out, bad = [], []
    for row in rows:
        try:
            out.append(render(row))
        except Exception as e:  # a stored row, not this request, is at fault: a warning, no traceback
            log.warning("row %s could not be rendered; left out of the list: %s: %s", getattr(row, "id", "?"),
                        type(e).__name__, str(e)[:300])
            bad.append(str(getattr(row, "id", "?")))
    return out, bad


def public_result(result: dict[str, Any] | None) -> dict[str, Any] | None:
    """A job's result as clients see it: the checkpoint by name, never its server path."""
    if not result or not isinstance(result.get("checkpoint"), str):
        return result
    return {**result, "checkpoint": PurePosixPath(result["checkpoint"]).name}


class JobError(BaseModel):
    code: str
    message: str


class Progress(BaseModel):
    step: int
    total_steps: int
    fraction: float


class JobOut(BaseModel):
    id: str
    object: str = "job"
    name: str
    status: str
    progress: Progress
    error: JobError | None = None
    result: dict[str, Any] | None = None
    metadata: dict[str, Any] = {}
    attempts: int = 0
    created_at: dt.datetime
    started_at: dt.datetime | None = None
    finished_at: dt.datetime | None = None
    estimated_finish: dt.datetime | None = None
    spec: JobSpec | None = Field(..., description="None only for a job stored by an older server whose spec "
                                 "this server's schema no longer accepts.")
    fine_tuned_model: str | None = Field(None, description="A succeeded job's final checkpoint as a model id "
                                         "(`ft:<base>:<job id>`): `GET /v1/models/{id}`, and a `model.path` its "
                                         "tenant's new jobs accept.")

    @classmethod
    def of(cls, job: Job) -> "JobOut":
        eta = None
        if job.status == "running" and job.started_at and job.step > 0:
            started = job.started_at if job.started_at.tzinfo else job.started_at.replace(tzinfo=dt.timezone.utc)
            per_step = (dt.datetime.now(dt.timezone.utc) - started) / max(job.step, 1)
            eta = dt.datetime.now(dt.timezone.utc) + per_step * (job.total_steps - job.step)
        try:
            spec = JobSpec.model_validate(job.spec)
        except ValidationError:
            spec = None
        return cls(
            id=job.id, name=job.name, status=job.status,
            progress=Progress(step=job.step, total_steps=job.total_steps,
                              fraction=round(job.step / max(job.total_steps, 1), 4)),
            error=JobError(code=job.error_code, message=redact_paths(job.error_message or ""))
            if job.error_code else None,
            result=public_result(job.result), metadata=job.meta or {}, attempts=job.attempts or 0,
            created_at=job.created_at, started_at=job.started_at, finished_at=job.finished_at, estimated_finish=eta,
            spec=spec, fine_tuned_model=fine_tuned_id(job),
        )


class JobList(BaseModel):
    data: list[JobOut]
    unreadable: list[str] = Field([], description="Ids of jobs on this page whose stored record could not be "
                                  "shown (left out of `data`, so one bad row never breaks the list).")
    has_more: bool = False
    next_cursor: str | None = None


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


class EventOut(BaseModel):
    id: int
    type: str
    level: str
    message: str
    data: dict[str, Any]
    created_at: dt.datetime

    @classmethod
    def of(cls, e: Event) -> "EventOut":
        return cls(id=e.id, type=e.type, level=e.level, message=redact_paths(e.message), data=e.data or {},
                   created_at=e.created_at)


class EventList(BaseModel):
    data: list[EventOut]
    has_more: bool
    next_after: int


class CheckpointOut(BaseModel):
    step: int
    name: str
    metrics: dict[str, Any]
    created_at: dt.datetime

    @classmethod
    def of(cls, c: Checkpoint) -> "CheckpointOut":
        m = {k: v for k, v in (c.metrics or {}).items() if not isinstance(v, (dict, list))}
        return cls(step=c.step, name=c.name, metrics=m, created_at=c.created_at)


class RolloutOut(BaseModel):
    step: int
    groups: list[Any]


class FileOut(BaseModel):
    id: str
    object: str = "file"
    bytes: int
    created_at: int
    filename: str
    purpose: str
    lines: int

    @classmethod
    def of(cls, f: File) -> "FileOut":
        created = f.created_at if f.created_at.tzinfo else f.created_at.replace(tzinfo=dt.timezone.utc)
        return cls(id=f.id, bytes=f.bytes, created_at=int(created.timestamp()), filename=f.filename,
                   purpose=f.purpose, lines=f.lines)


class DatasetOut(BaseModel):
    id: str = Field(description="What `data.dataset` (or `data.eval_dataset`) names: `builtin:<task>` or a file id.")
    kind: Literal["builtin", "file"]
    description: str = Field("", description="What the task's problems are (a file: its name and size).")
    params: dict[str, str] = Field(default_factory=dict,
                                   description="`data.params` the task reads, and what each means.")
    verifiers: list[dict[str, Any]] = Field(default_factory=list, description="The verifiers that judge this task's "
                                            "answers (a job names its own `verifiers`; these are the fitting ones).")
    instruction: str = Field("", description="Appended to every question: the answer format the task asks for.")
    eval_only: bool = Field(False, description="An evaluation set: name it as `data.eval_dataset` only.")
    file: FileOut | None = Field(None, description="For an uploaded file: its file object (GET /v1/files/{id}).")

    @classmethod
    def of_task(cls, name: str, task: Any) -> "DatasetOut":
        return cls(id=f"builtin:{name}", kind="builtin", description=task.description, params=dict(task.params),
                   verifiers=list(task.verifiers), instruction=task.instruction, eval_only=task.eval_only)

    @classmethod
    def of_file(cls, f: File) -> "DatasetOut":
        return cls(id=f.id, kind="file", description=f"{f.filename}: {f.lines} rows ({f.purpose})", file=FileOut.of(f))


class DatasetList(BaseModel):
    object: str = "list"
    data: list[DatasetOut]
    has_more_files: bool = Field(description="The caller has more uploaded files than `files_limit` (GET /v1/files "
                                             "pages them).")


class RunError(BaseModel):
    kind: Literal["runtime_error", "timeout", "unparseable", "invalid_return", "sandbox_error"]
    message: str


class RunResult(BaseModel):
    score: float
    status: Status
    reason: str
    error: RunError | None
    sub_scores: dict[str, float]
    elapsed_s: float
    details: dict[str, Any]


def _finite(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def result_of(v: Verdict, elapsed_s: float) -> RunResult:
    """A verdict as the API reports it. Plugins are trusted code but not trusted to be tidy: whatever
    they put in a verdict becomes valid JSON here (a NaN score is an invalid_return, not a 500)."""
    status_, reason = v.status, str(v.reason)
    kind = v.details.get("error_kind") or {Status.timeout: "timeout", Status.error: "runtime_error",
                                           Status.unparseable: "unparseable"}.get(status_)
    score = _finite(v.score)
    if score is None:
        score, status_, kind, reason = 0.0, Status.error, "invalid_return", f"score {v.score!r} is not a finite number"
    if kind is not None and kind not in ERROR_KINDS:
        kind = "runtime_error"
    subs = v.details.get("sub_scores")
    subs = {str(k): f for k, x in subs.items() if (f := _finite(x)) is not None} if isinstance(subs, dict) else {}
    details = {k: x for k, x in v.details.items() if k not in ("sub_scores", "elapsed_s", "error_kind")}
    details = json.loads(json.dumps(details, default=repr), parse_constant=lambda c: None)  # NaN -> null
    return RunResult(score=score, status=status_, reason=reason,
                     error=RunError(kind=kind, message=reason) if kind else None,
                     sub_scores=subs, details=details, elapsed_s=_finite(v.details.get("elapsed_s")) or elapsed_s)
