"""Job store: every state change goes through here, so the status rules live in one place.

Status model: queued → running → (paused) → succeeded | failed | cancelled. A worker *claims* a job
with a lease it must renew (heartbeat); a job whose lease expires is handed back by the reaper.
Writes from a worker that lost its lease are refused (``LeaseLost``), so a hung-then-revived
worker can never interleave with the one that took over.
"""
from __future__ import annotations

import datetime as dt
import enum
from pathlib import Path
from typing import Any, Iterable

from sqlalchemy import and_, or_, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from .tables import Checkpoint, EvalRecord, Event, Job, JobLive, Metric, Rollout, init_db, utcnow


class JobStatus(str, enum.Enum):
    queued = "queued"
    running = "running"
    paused = "paused"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"


TERMINAL = {JobStatus.succeeded.value, JobStatus.failed.value, JobStatus.cancelled.value}


class JobNotFound(KeyError):
    pass


class IllegalTransition(ValueError):
    """The request is not allowed in the job's current status (HTTP 409)."""


class LeaseLost(RuntimeError):
    """This worker no longer owns the job (it was handed to another worker or stopped)."""


class Store:
    def __init__(self, url: str):
        self.url = url
        if url.startswith("sqlite:///"):
            Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        self.engine, self.Session = init_db(url)
        self._insert = pg_insert if self.engine.dialect.name == "postgresql" else sqlite_insert

    # ------------------------------------------------------------------ jobs
    def create_job(self, spec: dict[str, Any], tenant: str = "default", meta: dict | None = None,
                   origin: dict | None = None) -> Job:
        with self.Session.begin() as s:
            job = Job(name=spec["name"], status=JobStatus.queued.value, spec=spec, tenant=tenant, origin=origin,
                      meta=meta or spec.get("metadata") or {}, total_steps=spec["train"]["steps"],
                      enqueued_at=utcnow(), step=0, attempts=0)
            s.add(job)
            s.flush()
            s.add(Event(job_id=job.id, type="status", message="queued", data={"status": "queued"}))
        return job

    def get_job(self, job_id: str, tenant: str | None = None) -> Job:
        with self.Session() as s:
            job = s.get(Job, job_id)
            if job is None or (tenant is not None and job.tenant != tenant):
                raise JobNotFound(job_id)  # another tenant's job is indistinguishable from none
            return job

    def list_jobs(self, tenant: str | None = None, status: str | None = None, limit: int = 100,
                  before: tuple[dt.datetime, str] | None = None, meta: dict[str, str] | None = None) -> list[Job]:
        """Newest first; ``before`` is the (created_at, id) cursor of the last job already seen."""
        with self.Session() as s:
            q = select(Job).order_by(Job.created_at.desc(), Job.id.desc())
            if tenant is not None:
                q = q.where(Job.tenant == tenant)
            if status:
                q = q.where(Job.status == status)
            if before:
                q = q.where(or_(Job.created_at < before[0], and_(Job.created_at == before[0], Job.id < before[1])))
            if not meta:
                return list(s.scalars(q.limit(limit)))
            out = []  # JSON filtering differs per dialect; filter in Python over a bounded scan
            for job in s.scalars(q.limit(10_000)):
                if all((job.meta or {}).get(k) == v for k, v in meta.items()):
                    out.append(job)
                    if len(out) >= limit:
                        break
            return out

    def _event(self, s, job_id: str, type_: str, message: str = "", level: str = "info", **data: Any) -> None:
        s.add(Event(job_id=job_id, type=type_, level=level, message=message, data=data))

    def add_event(self, job_id: str, type_: str, message: str = "", level: str = "info", **data: Any) -> None:
        with self.Session.begin() as s:
            self._event(s, job_id, type_, message, level, **data)

    def _set_status(self, s, job: Job, status: JobStatus, message: str = "", **fields: Any) -> None:
        job.status = status.value
        for k, v in fields.items():
            setattr(job, k, v)
        if status.value in TERMINAL:
            job.finished_at = utcnow()
            job.lease_owner = job.lease_expires_at = job.stop_request = None
        self._event(s, job.id, "status", message or status.value, status=status.value)

    # ------------------------------------------------------------------ user actions (409 when illegal)
    def request(self, job_id: str, action: str, tenant: str | None = None) -> tuple[Job, bool]:
        """cancel | pause | resume. Returns (job, needs_enqueue)."""
        with self.Session.begin() as s:
            job = s.get(Job, job_id, with_for_update=True)
            if job is None or (tenant is not None and job.tenant != tenant):
                raise JobNotFound(job_id)
            st, enqueue = job.status, False
            if action == "cancel":
                if st in (JobStatus.queued.value, JobStatus.paused.value):
                    self._set_status(s, job, JobStatus.cancelled, "cancelled by user")
                elif st == JobStatus.running.value:
                    job.stop_request = "cancel"
                    self._event(s, job.id, "cancel_requested", "cancel requested; stopping at the next step")
                else:
                    raise IllegalTransition(f"cannot cancel a {st} job")
            elif action == "pause":
                if st == JobStatus.queued.value:
                    self._set_status(s, job, JobStatus.paused, "paused before it started")
                elif st == JobStatus.running.value:
                    job.stop_request = "pause"
                    self._event(s, job.id, "pause_requested", "pause requested; checkpointing at the next step")
                else:
                    raise IllegalTransition(f"cannot pause a {st} job")
            elif action == "resume":
                if st != JobStatus.paused.value:
                    raise IllegalTransition(f"cannot resume a {st} job (only paused jobs resume)")
                self._set_status(s, job, JobStatus.queued, "resumed; queued from its last checkpoint",
                                 enqueued_at=utcnow(), stop_request=None)
                enqueue = True
            else:  # pragma: no cover - the router only passes the three actions
                raise ValueError(action)
            return job, enqueue

    def delete_job(self, job_id: str, tenant: str | None = None) -> Job:
        with self.Session.begin() as s:
            job = s.get(Job, job_id)
            if job is None or (tenant is not None and job.tenant != tenant):
                raise JobNotFound(job_id)
            if job.status == JobStatus.running.value:
                raise IllegalTransition("cannot delete a running job; cancel it first")
            s.delete(job)
            return job

    # ------------------------------------------------------------------ worker side
    def claim(self, job_id: str, owner: str, lease_s: float, run_dir: str) -> Job | None:
        """Atomically take a queued job (or one whose lease expired). None: someone else has it."""
        now = utcnow()
        with self.Session.begin() as s:
            res = s.execute(
                update(Job)
                .where(Job.id == job_id, or_(Job.status == JobStatus.queued.value,
                                             and_(Job.status == JobStatus.running.value, Job.lease_expires_at < now)))
                .values(status=JobStatus.running.value, lease_owner=owner, worker=owner, run_dir=run_dir,
                        lease_expires_at=now + dt.timedelta(seconds=lease_s), attempts=Job.attempts + 1,
                        started_at=now, error_code=None, error_message=None, updated_at=now)
            )
            if res.rowcount != 1:
                return None
            job = s.get(Job, job_id)
            self._event(s, job_id, "status", f"running on {owner} (attempt {job.attempts})",
                        status="running", worker=owner, attempt=job.attempts)
            return job

    def heartbeat(self, job_id: str, owner: str, lease_s: float) -> str | None:
        """Renew the lease; returns the pending stop request. Raises LeaseLost if it is gone."""
        now = utcnow()
        with self.Session.begin() as s:
            res = s.execute(update(Job).where(Job.id == job_id, Job.lease_owner == owner,
                                              Job.status == JobStatus.running.value)
                            .values(lease_expires_at=now + dt.timedelta(seconds=lease_s)))
            if res.rowcount != 1:
                raise LeaseLost(f"{owner} no longer holds job {job_id}")
            return s.scalar(select(Job.stop_request).where(Job.id == job_id))

    def _owned(self, s, job_id: str, owner: str) -> Job:
        job = s.get(Job, job_id, with_for_update=True)
        if job is None or job.lease_owner != owner or job.status != JobStatus.running.value:
            raise LeaseLost(f"{owner} no longer holds job {job_id}")
        return job

    def finish(self, job_id: str, owner: str, status: JobStatus, result: dict | None = None,
               error_code: str | None = None, error_message: str | None = None) -> None:
        with self.Session.begin() as s:
            job = self._owned(s, job_id, owner)
            msg = f"{status.value}" + (f": {error_code}: {error_message}" if error_code else "")
            self._set_status(s, job, status, msg, result=result, error_code=error_code,
                             error_message=error_message)
            if status == JobStatus.paused:
                job.lease_owner = job.lease_expires_at = job.stop_request = None

    # ------------------------------------------------------------------ reaper (runs in the API)
    def reap(self, requeue_after_s: float, max_attempts: int, on_lost: str = "requeue") -> list[str]:
        """Hand back jobs whose worker stopped heartbeating; re-send queued jobs the broker may
        have lost. Returns the ids to (re-)enqueue."""
        now, out = utcnow(), []
        with self.Session.begin() as s:
            lost = s.scalars(select(Job).where(Job.status == JobStatus.running.value,
                                               Job.lease_expires_at < now).with_for_update())
            for job in lost:
                why = f"worker {job.lease_owner} stopped heartbeating (lease expired)"
                if on_lost == "fail" or job.attempts >= max_attempts:
                    self._set_status(s, job, JobStatus.failed, why, error_code="worker_lost",
                                     error_message=f"{why} after {job.attempts} attempt(s)")
                else:
                    self._event(s, job.id, "warning", why + "; re-queued from its last checkpoint",
                                level="warning", reason="worker_lost")
                    self._set_status(s, job, JobStatus.queued, "re-queued after worker loss",
                                     lease_owner=None, lease_expires_at=None, enqueued_at=now)
                    out.append(job.id)
            stale = s.scalars(select(Job).where(Job.status == JobStatus.queued.value,
                                                Job.enqueued_at < now - dt.timedelta(seconds=requeue_after_s)))
            for job in stale:  # duplicates are harmless: claim() lets exactly one delivery run it
                job.enqueued_at = now
                out.append(job.id)
        return out

    # ------------------------------------------------------------------ per-step records (idempotent)
    def _upsert(self, s, model, values: dict[str, Any], update_cols: Iterable[str]) -> None:
        stmt = self._insert(model).values(**values)
        stmt = stmt.on_conflict_do_update(index_elements=["job_id", "step"],
                                          set_={c: values[c] for c in update_cols})
        s.execute(stmt)

    def put_metrics(self, job_id: str, step: int, data: dict[str, Any], owner: str | None = None) -> bool:
        """A step replayed after a crash overwrites its row, never duplicates it.

        Returns False when the row already held exactly ``data`` (a record delivered again on
        resume), so callers add no second event for it."""
        with self.Session.begin() as s:
            job = self._owned(s, job_id, owner) if owner else s.get(Job, job_id)
            old = s.scalar(select(Metric.data).where(Metric.job_id == job_id, Metric.step == step))
            if old == data:
                return False
            self._upsert(s, Metric, {"job_id": job_id, "step": step, "data": data, "created_at": utcnow()}, ["data"])
            if job is not None and step > job.step:
                job.step = step
            return True

    def put_live(self, job_id: str, step: int, data: dict[str, Any], owner: str) -> None:
        """Fold a new step record into the job's live state (service.store.live), under the worker's lease."""
        from .live import fold

        with self.Session.begin() as s:
            self._owned(s, job_id, owner)
            row = s.get(JobLive, job_id, with_for_update=True)
            if row is None:
                s.add(JobLive(job_id=job_id, step=step, data=fold(None, data), updated_at=utcnow()))
            else:
                row.data, row.step, row.updated_at = fold(row.data, data), max(row.step, step), utcnow()

    def running_live(self, tenant: str | None = None) -> list[tuple[str, int, dict[str, Any] | None]]:
        """(job id, step, live state or None) of every running job, in one query (GET /metrics)."""
        with self.Session() as s:
            q = (select(Job.id, Job.step, JobLive.data).outerjoin(JobLive, JobLive.job_id == Job.id)
                 .where(Job.status == JobStatus.running.value).order_by(Job.id))
            if tenant is not None:
                q = q.where(Job.tenant == tenant)
            return [(job_id, step, data) for job_id, step, data in s.execute(q)]

    def put_rollouts(self, job_id: str, step: int, groups: list[Any]) -> None:
        with self.Session.begin() as s:
            self._upsert(s, Rollout, {"job_id": job_id, "step": step, "data": groups}, ["data"])

    def put_evals(self, job_id: str, step: int, records: list[dict[str, Any]], owner: str | None = None) -> None:
        """One held-out eval's per-problem records (trainer.evaluation), under the worker's lease. An eval run
        again (a resumed job re-evaluates a step) replaces the step's rows in the same transaction."""
        from sqlalchemy import delete

        outcome = ("index", "id", "correct", "strict_correct", "reward")
        with self.Session.begin() as s:
            if owner:
                self._owned(s, job_id, owner)
            s.execute(delete(EvalRecord).where(EvalRecord.job_id == job_id, EvalRecord.step == step))
            s.add_all(EvalRecord(job_id=job_id, step=step, idx=int(r["index"]),
                                 problem_id=None if r.get("id") is None else str(r["id"])[:200],
                                 correct=bool(r["correct"]), strict_correct=bool(r["strict_correct"]),
                                 reward=float(r["reward"]), data={k: v for k, v in r.items() if k not in outcome})
                      for r in records)

    def eval_steps(self, job_id: str) -> list[tuple[int, int, int, int, float]]:
        """(step, problems, correct, strict correct, reward sum) of every stored eval, in step order."""
        from sqlalchemy import Integer, cast, func

        with self.Session() as s:
            q = (select(EvalRecord.step, func.count(), func.sum(cast(EvalRecord.correct, Integer)),
                        func.sum(cast(EvalRecord.strict_correct, Integer)), func.sum(EvalRecord.reward))
                 .where(EvalRecord.job_id == job_id).group_by(EvalRecord.step).order_by(EvalRecord.step))
            return [(st, n, int(c or 0), int(sc or 0), float(r or 0.0)) for st, n, c, sc, r in s.execute(q)]

    def get_evals(self, job_id: str, step: int, offset: int = 0, limit: int | None = None,
                  outcome_only: bool = False, only: Iterable[int] | None = None) -> list[Any]:
        """One eval's records in held-out order (``only``: these problems); ``outcome_only``: (idx, problem id,
        correct, strict) rows."""
        with self.Session() as s:
            cols = (EvalRecord.idx, EvalRecord.problem_id, EvalRecord.correct, EvalRecord.strict_correct)
            q = select(*cols) if outcome_only else select(EvalRecord)
            q = q.where(EvalRecord.job_id == job_id, EvalRecord.step == step).order_by(EvalRecord.idx).offset(offset)
            q = q.limit(limit) if limit is not None else q
            q = q.where(EvalRecord.idx.in_(list(only))) if only is not None else q
            return list(s.execute(q).all()) if outcome_only else list(s.scalars(q))

    def put_checkpoint(self, job_id: str, step: int, name: str, path: str, metrics: dict[str, Any]) -> None:
        with self.Session.begin() as s:
            self._upsert(s, Checkpoint, {"job_id": job_id, "step": step, "name": name, "path": path,
                                         "metrics": metrics, "created_at": utcnow()}, ["name", "path", "metrics"])

    def delete_checkpoints(self, job_id: str, names: list[str]) -> None:
        """Forget checkpoints the trainer pruned (``train.keep_last``)."""
        from sqlalchemy import delete

        with self.Session.begin() as s:
            s.execute(delete(Checkpoint).where(Checkpoint.job_id == job_id, Checkpoint.name.in_(names)))

    def get_metrics(self, job_id: str, after: int = -1, limit: int = 100_000) -> list[Metric]:
        with self.Session() as s:
            q = select(Metric).where(Metric.job_id == job_id, Metric.step > after).order_by(Metric.step)
            return list(s.scalars(q.limit(limit)))

    def get_events(self, job_id: str, after: int = 0, limit: int = 100) -> list[Event]:
        with self.Session() as s:
            q = select(Event).where(Event.job_id == job_id, Event.id > after).order_by(Event.id).limit(limit)
            return list(s.scalars(q))

    def get_rollouts(self, job_id: str, step: int | None = None, limit: int = 20) -> list[Rollout]:
        with self.Session() as s:
            q = select(Rollout).where(Rollout.job_id == job_id)
            q = q.where(Rollout.step == step) if step is not None else q.order_by(Rollout.step.desc()).limit(limit)
            return list(s.scalars(q))

    def get_checkpoints(self, job_id: str) -> list[Checkpoint]:
        with self.Session() as s:
            return list(s.scalars(select(Checkpoint).where(Checkpoint.job_id == job_id).order_by(Checkpoint.step)))

    def count_by_status(self, tenant: str | None = None) -> dict[str, int]:
        from sqlalchemy import func

        with self.Session() as s:
            q = select(Job.status, func.count()).group_by(Job.status)
            if tenant is not None:
                q = q.where(Job.tenant == tenant)
            return dict(s.execute(q).all())
