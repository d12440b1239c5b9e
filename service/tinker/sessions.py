"""Every state change of training sessions goes through here: the queue of requests (the SDK's futures),
the worker lease on a session, results, checkpoints, and what happens to a session whose worker died.

A session's requests are executed in the order they were stored (``TinkerRequest.id``) by the one worker
holding the session's lease; ``(target, seq)`` is unique so a resent request is never applied twice.
A worker that loses its lease writes nothing more (``LeaseLost``). When a lease expires, the reaper
decides per model: one unchanged since its last saved state (``dirty`` false) is resumed by the next
worker from that state, with its pending requests kept; a changed one is marked lost and its pending
requests fail with an error naming its last saved state.
"""
from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from sqlalchemy import delete, func, or_, select, update

from ..access.keys import Scope
from ..store.jobs import LeaseLost, Store
from ..store.tables import (
    TinkerCheckpoint,
    TinkerMetric,
    TinkerModel,
    TinkerRequest,
    TinkerSampler,
    TinkerSession,
    utcnow,
)

DONE = ("done", "failed")


class NotFound(KeyError):
    """No such session / model / sampler / request for this caller (another tenant's reads the same).
    Its message names what was asked for; the app answers it with a 404 (service/app.py)."""

    def __init__(self, kind: str, key: str) -> None:
        super().__init__(f"{kind} {key!r} not found")

    def __str__(self) -> str:  # KeyError's own would quote the whole message
        return self.args[0]


class Gone(RuntimeError):
    """The session is finished or expired, or its model lost or failed: a 410 (the SDK does not retry it)."""


class Busy(RuntimeError):
    """Over a per-tenant or per-session limit (HTTP 429, retry after ``retry_after_s``)."""

    def __init__(self, msg: str, retry_after_s: int = 1) -> None:
        super().__init__(msg)
        self.retry_after_s = retry_after_s


def _new(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def _visible(row, scope: Scope | None) -> bool:
    return row is not None and (scope is None or scope.sees(row.tenant))


def _live(s, tenant: str, excluding: str) -> int:
    return s.scalar(select(func.count()).select_from(TinkerSession).where(
        TinkerSession.tenant == tenant, TinkerSession.status == "active", TinkerSession.id != excluding,
        TinkerSession.worker_state != "idle")) or 0


def new_model(session_id: str, model_id: str, tenant: str, base_model: str, lora_rank: int, spec: dict) -> TinkerModel:
    return TinkerModel(id=model_id, session_id=session_id, tenant=tenant, base_model=base_model,
                       lora_rank=lora_rank, spec=spec, status="pending", dirty=False, steps=0)


def new_sampler(sampler_id: str, session_id: str, tenant: str, base_model: str, checkpoint_id: int | None = None,
                model_id: str | None = None) -> TinkerSampler:
    return TinkerSampler(id=sampler_id, session_id=session_id, tenant=tenant, base_model=base_model,
                         checkpoint_id=checkpoint_id, model_id=model_id)


def _add_new(s, row) -> None:
    """Add ``row`` unless one with its id exists (a resent create is the first one)."""
    if s.get(type(row), row.id) is None:
        s.add(row)


class Sessions:
    def __init__(self, store: Store):
        self.store, self.Session = store, store.Session

    # ------------------------------------------------------------------ sessions (API side)
    def create(self, tenant: str, sdk_version: str, display_name: str | None, meta: dict) -> str:
        sid = _new("sess")
        with self.Session.begin() as s:
            s.add(TinkerSession(id=sid, tenant=tenant, status="active", sdk_version=sdk_version[:64],
                                display_name=display_name, meta=meta, worker_state="idle", attempts=0))
        return sid

    def get(self, session_id: str, scope: Scope | None) -> TinkerSession:
        with self.Session() as s:
            row = s.get(TinkerSession, session_id)
            if not _visible(row, scope):
                raise NotFound("session", session_id)
            return row

    def active(self, session_id: str, scope: Scope) -> TinkerSession:
        row = self.get(session_id, scope)
        if row.status != "active":
            raise Gone(f"session {session_id} is {row.status}"
                       + (f": {row.finish_reason}" if row.finish_reason else ""))
        return row

    def heartbeat(self, session_id: str, scope: Scope) -> None:
        self.active(session_id, scope)
        with self.Session.begin() as s:
            s.execute(update(TinkerSession).where(TinkerSession.id == session_id).values(last_seen_at=utcnow()))

    def finish(self, session_id: str, scope: Scope, reason: str) -> None:
        self.get(session_id, scope)
        with self.Session.begin() as s:
            s.execute(update(TinkerSession).where(TinkerSession.id == session_id, TinkerSession.status == "active")
                      .values(status="finished", finish_reason=reason[:2000]))

    def live_count(self, tenant: str, excluding: str) -> int:
        """Sessions of ``tenant`` that hold (or wait for) a worker, other than ``excluding``."""
        with self.Session() as s:
            return _live(s, tenant, excluding)

    def list(self, scope: Scope, limit: int) -> list[TinkerSession]:
        with self.Session() as s:
            q = select(TinkerSession).order_by(TinkerSession.created_at.desc(), TinkerSession.id.desc())
            if scope.only is not None:
                q = q.where(TinkerSession.tenant == scope.only)
            return list(s.scalars(q.limit(limit)))

    def models_of(self, session_id: str) -> list[TinkerModel]:
        with self.Session() as s:
            return list(s.scalars(select(TinkerModel).where(TinkerModel.session_id == session_id)
                                  .order_by(TinkerModel.created_at)))

    def metrics(self, model_id: str, limit: int = 10_000) -> list[TinkerMetric]:
        with self.Session() as s:
            return list(s.scalars(select(TinkerMetric).where(TinkerMetric.model_id == model_id)
                                  .order_by(TinkerMetric.step).limit(limit)))

    # ------------------------------------------------------------------ models, samplers, checkpoints
    def add_model(self, session_id: str, model_id: str, tenant: str, base_model: str, lora_rank: int,
                  spec: dict) -> None:
        with self.Session.begin() as s:
            _add_new(s, new_model(session_id, model_id, tenant, base_model, lora_rank, spec))

    def model(self, model_id: str, scope: Scope | None) -> TinkerModel:
        with self.Session() as s:
            row = s.get(TinkerModel, model_id)
            if not _visible(row, scope):
                raise NotFound("model", model_id)
            return row

    def add_sampler(self, sampler_id: str, session_id: str, tenant: str, base_model: str,
                    checkpoint_id: int | None = None, model_id: str | None = None) -> None:
        with self.Session.begin() as s:
            _add_new(s, new_sampler(sampler_id, session_id, tenant, base_model, checkpoint_id, model_id))

    def sampler(self, sampler_id: str, scope: Scope | None) -> TinkerSampler:
        with self.Session() as s:
            row = s.get(TinkerSampler, sampler_id)
            if not _visible(row, scope):
                raise NotFound("sampler", sampler_id)
            return row

    def checkpoint(self, tinker_path: str, scope: Scope | None) -> TinkerCheckpoint:
        with self.Session() as s:
            row = s.scalar(select(TinkerCheckpoint).where(TinkerCheckpoint.tinker_path == tinker_path))
            if not _visible(row, scope):
                raise NotFound("checkpoint", tinker_path)
            return row

    def checkpoint_by_id(self, cid: int) -> TinkerCheckpoint:
        with self.Session() as s:
            row = s.get(TinkerCheckpoint, cid)
            if row is None:
                raise NotFound("checkpoint", str(cid))
            return row

    def checkpoints(self, scope: Scope, model_id: str | None = None, limit: int = 1000) -> list[TinkerCheckpoint]:
        with self.Session() as s:
            q = select(TinkerCheckpoint).order_by(TinkerCheckpoint.id.desc())
            if scope.only is not None:
                q = q.where(TinkerCheckpoint.tenant == scope.only)
            if model_id is not None:
                q = q.where(TinkerCheckpoint.model_id == model_id)
            return list(s.scalars(q.limit(limit)))

    # ------------------------------------------------------------------ the queue (API side)
    def submit(self, session: TinkerSession, target: str, seq: int, kind: str, payload: bytes,
               max_pending: int, max_live: int, adds: tuple = ()) -> tuple[str, bool]:
        """Queue one request; returns (request id, whether the session needs a worker enqueued). The same
        (target, seq) again returns the first copy's id. ``adds`` (a new model or sampler row) are stored
        with the request, only if it is accepted.

        An idle session that this request queues takes one of its tenant's ``max_live`` sessions holding
        (or waiting for) a worker: this is the one place that limit is checked, whichever route queues
        (every request goes through here), and in the same transaction as the change it guards."""
        with self.Session.begin() as s:
            old = s.scalar(select(TinkerRequest.request_id).where(TinkerRequest.target == target,
                                                                  TinkerRequest.seq == seq))
            if old is not None:
                return old, False
            pending = s.scalar(select(func.count()).select_from(TinkerRequest).where(
                TinkerRequest.session_id == session.id, TinkerRequest.status.in_(("queued", "running"))))
            if pending >= max_pending:
                raise Busy(f"this session already has {pending} requests waiting (the limit, "
                           "RLVR_TINKER_MAX_PENDING); wait for some results first")
            # the tenant's sessions first (row locks where the database has them), then the change, then the
            # count: two requests queueing two of one tenant's sessions at once cannot both pass
            s.execute(select(TinkerSession.id).where(TinkerSession.tenant == session.tenant,
                                                     TinkerSession.status == "active").with_for_update())
            now = utcnow()
            res = s.execute(update(TinkerSession).where(TinkerSession.id == session.id,
                                                        TinkerSession.worker_state == "idle")
                            .values(worker_state="queued", enqueued_at=now, last_seen_at=now))
            if res.rowcount == 1 and _live(s, session.tenant, session.id) >= max_live:  # raising rolls it back
                raise Busy(f"this tenant already has {max_live} sessions holding workers (the limit, "
                           "RLVR_TINKER_SESSIONS_PER_TENANT); close one (ServiceClient.close) or wait for it to "
                           "idle out", retry_after_s=5)
            if res.rowcount != 1:  # a request counts as a sign of life, like a heartbeat
                s.execute(update(TinkerSession).where(TinkerSession.id == session.id).values(last_seen_at=now))
            for row in adds:
                _add_new(s, row)
            rid = _new("req")
            s.add(TinkerRequest(request_id=rid, tenant=session.tenant, session_id=session.id, target=target,
                                seq=seq, kind=kind, status="queued", payload=payload, result_proto=False))
            return rid, res.rowcount == 1

    def request(self, request_id: str, scope: Scope | None) -> TinkerRequest:
        with self.Session() as s:
            row = s.scalar(select(TinkerRequest).where(TinkerRequest.request_id == request_id))
            if not _visible(row, scope):
                raise NotFound("future", request_id)
            return row

    def finished_request(self, request_id: str, scope: Scope | None) -> TinkerRequest | None:
        """The request once it is done or failed, else None (a light query while it is pending)."""
        with self.Session() as s:
            head = s.execute(select(TinkerRequest.status, TinkerRequest.tenant)
                             .where(TinkerRequest.request_id == request_id)).first()
            if head is None or (scope is not None and not scope.sees(head.tenant)):
                raise NotFound("future", request_id)
            if head.status not in DONE:
                return None
            return s.scalar(select(TinkerRequest).where(TinkerRequest.request_id == request_id))

    # ------------------------------------------------------------------ worker side
    def claim(self, session_id: str, owner: str, lease_s: float) -> TinkerSession | None:
        now = utcnow()
        with self.Session.begin() as s:
            res = s.execute(update(TinkerSession).where(
                TinkerSession.id == session_id, TinkerSession.status == "active",
                or_(TinkerSession.worker_state == "queued",
                    (TinkerSession.worker_state == "running") & (TinkerSession.lease_expires_at < now)))
                .values(worker_state="running", lease_owner=owner, attempts=TinkerSession.attempts + 1,
                        lease_expires_at=now + dt.timedelta(seconds=lease_s)))
            return s.get(TinkerSession, session_id) if res.rowcount == 1 else None

    def renew(self, session_id: str, owner: str, lease_s: float) -> TinkerSession:
        """Renew the lease (LeaseLost if it is gone); returns the session (its status and last use)."""
        with self.Session.begin() as s:
            res = s.execute(update(TinkerSession).where(TinkerSession.id == session_id,
                                                        TinkerSession.lease_owner == owner,
                                                        TinkerSession.worker_state == "running")
                            .values(lease_expires_at=utcnow() + dt.timedelta(seconds=lease_s)))
            if res.rowcount != 1:
                raise LeaseLost(f"{owner} no longer holds session {session_id}")
            return s.get(TinkerSession, session_id)

    def release(self, session_id: str, owner: str) -> None:
        with self.Session.begin() as s:
            s.execute(update(TinkerSession).where(TinkerSession.id == session_id, TinkerSession.lease_owner == owner)
                      .values(worker_state="idle", lease_owner=None, lease_expires_at=None))

    def next_request(self, session_id: str, owner: str) -> TinkerRequest | None:
        """The session's oldest queued request, now marked running (None: nothing queued)."""
        with self.Session.begin() as s:
            if s.scalar(select(TinkerSession.lease_owner).where(TinkerSession.id == session_id)) != owner:
                raise LeaseLost(f"{owner} no longer holds session {session_id}")
            row = s.scalar(select(TinkerRequest).where(TinkerRequest.session_id == session_id,
                                                       TinkerRequest.status == "queued")
                           .order_by(TinkerRequest.id).limit(1))
            if row is None:
                return None
            row.status = "running"
            return row

    def take_batch(self, session_id: str, owner: str, first: TinkerRequest, key: str, key_of, limit: int
                   ) -> list[TinkerRequest]:
        """More queued requests that can run with ``first`` (``key_of(r) == key``), now marked running.
        Only sample requests are batched: they change nothing, so their order does not matter."""
        with self.Session.begin() as s:
            rows = s.scalars(select(TinkerRequest).where(
                TinkerRequest.session_id == session_id, TinkerRequest.status == "queued",
                TinkerRequest.target == first.target, TinkerRequest.kind == first.kind)
                .order_by(TinkerRequest.id).limit(limit))
            taken = [r for r in rows if key_of(r) == key]
            if taken and s.scalar(select(TinkerSession.lease_owner).where(TinkerSession.id == session_id)) != owner:
                raise LeaseLost(f"{owner} no longer holds session {session_id}")
            for r in taken:
                r.status = "running"
            return taken

    def save_checkpoint(self, model_id: str, owner: str, checkpoint: dict[str, Any]) -> int:
        """A checkpoint written outside a request (the worker parking a changed model), with the model's
        ``last_state`` pointing at it, in one transaction, only while ``owner`` holds the model's session."""
        with self.Session.begin() as s:
            m = s.get(TinkerModel, model_id)
            holder = None if m is None else s.scalar(select(TinkerSession.lease_owner)
                                                     .where(TinkerSession.id == m.session_id))
            if m is None or holder != owner:
                raise LeaseLost(f"{owner} no longer holds the session of {model_id}")
            cid = _upsert_checkpoint(s, checkpoint)
            s.execute(update(TinkerModel).where(TinkerModel.id == model_id).values(dirty=False, last_state=cid))
            return cid

    def finish_request(self, row: TinkerRequest, owner: str, result: bytes | None = None, proto: bool = False,
                       error: str | None = None, category: str = "user", model: dict[str, Any] | None = None,
                       metric: tuple[int, dict] | None = None, checkpoint: dict[str, Any] | None = None) -> int | None:
        """Record a request's outcome and what it changed (model fields, a step's metrics, a checkpoint),
        all in one transaction, only while ``owner`` holds the session. Returns a new checkpoint's id."""
        with self.Session.begin() as s:
            if s.scalar(select(TinkerSession.lease_owner).where(TinkerSession.id == row.session_id)) != owner:
                raise LeaseLost(f"{owner} no longer holds session {row.session_id}")
            cid = None
            if checkpoint is not None:
                cid = _upsert_checkpoint(s, checkpoint)
                if model is not None and model.pop("last_state", None) == "new":
                    model["last_state"] = cid
            if model:
                s.execute(update(TinkerModel).where(TinkerModel.id == row.target).values(**model))
            if metric is not None:
                s.execute(delete(TinkerMetric).where(TinkerMetric.model_id == row.target,
                                                     TinkerMetric.step == metric[0]))
                s.add(TinkerMetric(model_id=row.target, step=metric[0], data=metric[1]))
            s.execute(update(TinkerRequest).where(TinkerRequest.id == row.id).values(
                status="failed" if error is not None else "done", result=result, result_proto=proto,
                error=error, category=category if error is not None else None, finished_at=utcnow()))
            return cid

    def set_model(self, model_id: str, **values: Any) -> None:
        with self.Session.begin() as s:
            s.execute(update(TinkerModel).where(TinkerModel.id == model_id).values(**values))

    # ------------------------------------------------------------------ reaper (runs in the API)
    def reap(self, *, idle_s: float, queue_timeout_s: float, retention_s: float, requeue_after_s: float
             ) -> list[str]:
        """Expire sessions nobody uses, hand back sessions of dead workers, fail requests no worker took;
        returns the session ids to (re-)enqueue."""
        now, out = utcnow(), []
        with self.Session.begin() as s:
            for sess in s.scalars(select(TinkerSession).where(
                    TinkerSession.status == "active", TinkerSession.last_seen_at < now - dt.timedelta(seconds=idle_s))):
                busy = s.scalar(select(func.count()).select_from(TinkerRequest).where(
                    TinkerRequest.session_id == sess.id, TinkerRequest.status.in_(("queued", "running"))))
                if not busy:
                    sess.status, sess.finish_reason = "expired", f"no heartbeat or request for {idle_s:g} s"
            lost = s.scalars(select(TinkerSession).where(TinkerSession.worker_state == "running",
                                                         TinkerSession.lease_expires_at < now))
            for sess in lost:
                self._hand_back(s, sess)
                if sess.worker_state == "queued":
                    out.append(sess.id)
            stale = s.scalars(select(TinkerSession).where(
                TinkerSession.worker_state == "queued",
                TinkerSession.enqueued_at < now - dt.timedelta(seconds=requeue_after_s)))
            for sess in stale:  # the broker may have lost it; a duplicate finds the session claimed
                sess.enqueued_at = now
                out.append(sess.id)
            s.execute(update(TinkerRequest).where(
                TinkerRequest.status == "queued",
                TinkerRequest.created_at < now - dt.timedelta(seconds=queue_timeout_s))
                .values(status="failed", category="server", finished_at=now, error=(
                    f"no worker took this request within {queue_timeout_s:g} s (RLVR_TINKER_QUEUE_TIMEOUT_S): "
                    "are `rlvr worker` processes running, and free?")))
            s.execute(delete(TinkerRequest).where(TinkerRequest.status.in_(DONE),
                                                  TinkerRequest.finished_at < now - dt.timedelta(seconds=retention_s)))
        return out

    def _hand_back(self, s, sess: TinkerSession) -> None:
        """The worker holding ``sess`` stopped renewing its lease: resume what can be resumed exactly."""
        why = f"the worker holding session {sess.id} stopped (lease expired)"
        lost = set()
        for m in s.scalars(select(TinkerModel).where(TinkerModel.session_id == sess.id)):
            if m.status == "ready" and m.dirty:
                state = s.get(TinkerCheckpoint, m.last_state) if m.last_state else None
                where = (f"its last saved state is {state.tinker_path}: continue with "
                         "ServiceClient.create_training_client_from_state_with_optimizer(path)") if state else \
                    "it had no saved state (save_state keeps one)"
                m.status, m.error = "lost", f"{why} after changes since its last save; {where}"
                lost.add(m.id)
        for sp in s.scalars(select(TinkerSampler).where(TinkerSampler.session_id == sess.id,
                                                        TinkerSampler.checkpoint_id.is_(None),
                                                        TinkerSampler.model_id.is_not(None))):
            lost.add(sp.id)  # an in-memory snapshot went with the worker
        pending = list(s.scalars(select(TinkerRequest).where(TinkerRequest.session_id == sess.id,
                                                              TinkerRequest.status.in_(("queued", "running")))))
        for r in pending:
            if r.target in lost:
                m = s.get(TinkerModel, r.target)
                r.status, r.category, r.finished_at = "failed", "server", utcnow()
                r.error = m.error if m is not None else f"{why}; the sampler's weights were in its memory: save again"
            else:
                r.status = "queued"  # not applied yet (results are written with the model's changes)
        keep = sess.status == "active" and (any(r.status == "queued" for r in pending) or
                                            s.scalar(select(func.count()).select_from(TinkerModel).where(
                                                TinkerModel.session_id == sess.id, TinkerModel.status == "ready")))
        sess.lease_owner = sess.lease_expires_at = None
        sess.worker_state, sess.enqueued_at = ("queued", utcnow()) if keep else ("idle", None)


def _upsert_checkpoint(s, checkpoint: dict[str, Any]) -> int:
    """A checkpoint row by its tinker:// path (saving a name again replaces it), inside the caller's transaction."""
    old = s.scalar(select(TinkerCheckpoint).where(TinkerCheckpoint.tinker_path == checkpoint["tinker_path"]))
    if old is not None:
        s.delete(old)
        s.flush()
    ck = TinkerCheckpoint(**checkpoint)
    s.add(ck)
    s.flush()
    return ck.id
