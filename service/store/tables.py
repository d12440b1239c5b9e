"""SQLAlchemy schema and engine. The database is the source of truth; the broker carries ids only.

The schema is created and upgraded by Alembic (service/store/migrations); ``migrate()`` runs it at
start-up under a lock, so an API and a worker starting together never race on it.
"""
from __future__ import annotations

import datetime as dt
import fcntl
import uuid
from pathlib import Path
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
    create_engine,
    event,
    false,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, sessionmaker

MIGRATIONS = Path(__file__).resolve().parent / "migrations"


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:16]}"


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON}


class Job(Base):
    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(String(64), primary_key=True, default=lambda: new_id("job"))
    tenant: Mapped[str] = mapped_column(String(128), index=True, default="default")
    name: Mapped[str] = mapped_column(String(200))
    status: Mapped[str] = mapped_column(String(16), index=True)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    meta: Mapped[dict[str, Any]] = mapped_column("metadata", JSON, default=dict)
    origin: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)  # e.g. the OpenAI-shaped request
    step: Mapped[int] = mapped_column(Integer, default=0)
    total_steps: Mapped[int] = mapped_column(Integer)
    error_code: Mapped[str | None] = mapped_column(String(64), nullable=True)
    error_message: Mapped[str | None] = mapped_column(Text, nullable=True)
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    run_dir: Mapped[str | None] = mapped_column(Text, nullable=True)
    stop_request: Mapped[str | None] = mapped_column(String(16), nullable=True)
    worker: Mapped[str | None] = mapped_column(String(200), nullable=True)
    lease_owner: Mapped[str | None] = mapped_column(String(200), nullable=True)
    lease_expires_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    enqueued_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow, index=True)
    started_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    finished_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    updated_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow, onupdate=utcnow)


class Metric(Base):
    __tablename__ = "metrics"
    __table_args__ = (UniqueConstraint("job_id", "step", name="uq_metrics_job_step"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    step: Mapped[int] = mapped_column(Integer)
    data: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Event(Base):
    __tablename__ = "events"
    __table_args__ = (Index("ix_events_job_seq", "job_id", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)  # the cursor
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    type: Mapped[str] = mapped_column(String(32))
    level: Mapped[str] = mapped_column(String(16), default="info")
    message: Mapped[str] = mapped_column(Text, default="")
    data: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Rollout(Base):
    __tablename__ = "rollouts"
    __table_args__ = (UniqueConstraint("job_id", "step", name="uq_rollouts_job_step"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    step: Mapped[int] = mapped_column(Integer)
    data: Mapped[list[Any]] = mapped_column(JSON)


class EvalRecord(Base):
    """One held-out problem at one eval of a job: what the model wrote and how each judge scored it.

    One row per problem (not one JSON list per eval, as rollouts are) so a page of records and the pairing of
    two evals are plain queries; the outcome columns are what a comparison reads, ``data`` the rest."""
    __tablename__ = "eval_records"
    __table_args__ = (UniqueConstraint("job_id", "step", "idx", name="uq_eval_records_job_step_idx"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    step: Mapped[int] = mapped_column(Integer)
    idx: Mapped[int] = mapped_column(Integer)  # the problem's place in the job's fixed held-out set
    problem_id: Mapped[str | None] = mapped_column(String(200), nullable=True)
    correct: Mapped[bool] = mapped_column(Boolean)         # by the job's own reward verifiers
    strict_correct: Mapped[bool] = mapped_column(Boolean)  # by the task's declared (strict) judge
    reward: Mapped[float] = mapped_column(Float)
    data: Mapped[dict[str, Any]] = mapped_column(JSON)     # prompt, completion, verdicts, length, …


class JobLive(Base):
    """What GET /metrics shows of a running job, folded in as each step is recorded (service.store.live), so a
    scrape reads one row per running job in one query instead of each job's metrics."""
    __tablename__ = "job_live"

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    step: Mapped[int] = mapped_column(Integer)
    data: Mapped[dict[str, Any]] = mapped_column(JSON)
    updated_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Checkpoint(Base):
    __tablename__ = "checkpoints"
    __table_args__ = (UniqueConstraint("job_id", "step", name="uq_checkpoints_job_step"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    step: Mapped[int] = mapped_column(Integer)
    name: Mapped[str] = mapped_column(String(64))
    path: Mapped[str] = mapped_column(Text)
    metrics: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class ApiKey(Base):
    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(64), primary_key=True, default=lambda: new_id("key"))
    tenant: Mapped[str] = mapped_column(String(128), index=True)
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)  # sha256 hex; the key itself is never stored
    admin: Mapped[bool] = mapped_column(Boolean, default=False)
    revoked: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    hint: Mapped[str | None] = mapped_column(String(16), nullable=True)  # the key's last 4 characters
    revoked_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class File(Base):
    __tablename__ = "files"

    id: Mapped[str] = mapped_column(String(64), primary_key=True, default=lambda: new_id("file"))
    tenant: Mapped[str] = mapped_column(String(128), index=True)
    filename: Mapped[str] = mapped_column(String(255))
    purpose: Mapped[str] = mapped_column(String(64))
    bytes: Mapped[int] = mapped_column(Integer)
    lines: Mapped[int] = mapped_column(Integer)
    path: Mapped[str] = mapped_column(Text)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class StoredVerifier(Base):
    __tablename__ = "verifier_sources"
    __table_args__ = (UniqueConstraint("name", "version", name="uq_verifier_sources_name_version"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(128), index=True)
    version: Mapped[int] = mapped_column(Integer)
    source: Mapped[str] = mapped_column(Text)
    sha256: Mapped[str] = mapped_column(String(64))
    description: Mapped[str] = mapped_column(Text, default="")
    config: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)  # defaults: timeout_s, memory_mb, ...
    golden: Mapped[list[Any]] = mapped_column(JSON, default=list)
    tenant: Mapped[str] = mapped_column(String(200), default="default")
    public: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


# Tables of the training primitives (service/tinker): sessions, their models and samplers, the request queue (the
# SDK's futures), checkpoints and per-step metrics. Registered on the one ``Base``; created by Alembic (0005).

class TinkerSession(Base):
    """A client's session (one ``ServiceClient``): owns models and samplers, held by one worker at a time."""
    __tablename__ = "tinker_sessions"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(128), index=True)
    status: Mapped[str] = mapped_column(String(16), index=True)  # active | finished | expired
    sdk_version: Mapped[str] = mapped_column(String(64), default="")
    display_name: Mapped[str | None] = mapped_column(String(256), nullable=True)
    meta: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    finish_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    # the worker holding the session's models: idle (none) | queued | running
    worker_state: Mapped[str] = mapped_column(String(16), default="idle")
    lease_owner: Mapped[str | None] = mapped_column(String(200), nullable=True)
    lease_expires_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    enqueued_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow, index=True)
    last_seen_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class TinkerModel(Base):
    """A training model (one ``TrainingClient``); id ``{session}:train:{seq}`` as the SDK builds it."""
    __tablename__ = "tinker_models"

    id: Mapped[str] = mapped_column(String(200), primary_key=True)
    session_id: Mapped[str] = mapped_column(ForeignKey("tinker_sessions.id", ondelete="CASCADE"), index=True)
    tenant: Mapped[str] = mapped_column(String(128), index=True)
    base_model: Mapped[str] = mapped_column(String(1024))
    lora_rank: Mapped[int] = mapped_column(Integer, default=0)  # 0: full fine-tuning
    spec: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)  # LoRA flags, seed, where it was loaded from
    status: Mapped[str] = mapped_column(String(16), default="pending")  # pending | ready | lost | failed
    # changed since its last saved state (a lost worker can only resume a model that is not)
    dirty: Mapped[bool] = mapped_column(Boolean, default=False)
    last_state: Mapped[int | None] = mapped_column(Integer, nullable=True)  # TinkerCheckpoint id
    steps: Mapped[int] = mapped_column(Integer, default=0)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class TinkerSampler(Base):
    """A sampling session: a base model, a saved sampler checkpoint, or a snapshot of a training model."""
    __tablename__ = "tinker_samplers"

    id: Mapped[str] = mapped_column(String(200), primary_key=True)
    session_id: Mapped[str] = mapped_column(ForeignKey("tinker_sessions.id", ondelete="CASCADE"), index=True)
    tenant: Mapped[str] = mapped_column(String(128), index=True)
    base_model: Mapped[str] = mapped_column(String(1024))
    checkpoint_id: Mapped[int | None] = mapped_column(Integer, nullable=True)  # a saved sampler/state
    model_id: Mapped[str | None] = mapped_column(String(200), nullable=True)   # a snapshot of this model
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class TinkerRequest(Base):
    """One future: a queued request to a session's worker and, once done, its result.

    ``id`` orders the session's queue; ``(target, seq)`` is unique, so a retried POST (the SDK resends
    after a lost reply) finds its first copy instead of applying a gradient twice."""
    __tablename__ = "tinker_requests"
    __table_args__ = (UniqueConstraint("target", "seq", name="uq_tinker_requests_target_seq"),
                      Index("ix_tinker_requests_session_status", "session_id", "status", "id"))

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    request_id: Mapped[str] = mapped_column(String(64), unique=True)
    tenant: Mapped[str] = mapped_column(String(128))
    session_id: Mapped[str] = mapped_column(ForeignKey("tinker_sessions.id", ondelete="CASCADE"))
    target: Mapped[str] = mapped_column(String(200))  # a model id or a sampler id
    seq: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(32))
    status: Mapped[str] = mapped_column(String(16))  # queued | running | done | failed
    payload: Mapped[bytes] = mapped_column(LargeBinary)
    result: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    result_proto: Mapped[bool] = mapped_column(Boolean, default=False)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    category: Mapped[str | None] = mapped_column(String(16), nullable=True)  # user | server
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    finished_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class TinkerCheckpoint(Base):
    """A saved state (weights + optimiser) or sampler weights: an ordinary rlvr checkpoint folder."""
    __tablename__ = "tinker_checkpoints"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tenant: Mapped[str] = mapped_column(String(128), index=True)
    model_id: Mapped[str] = mapped_column(String(200), index=True)
    kind: Mapped[str] = mapped_column(String(16))  # training | sampler
    name: Mapped[str] = mapped_column(String(128))
    tinker_path: Mapped[str] = mapped_column(String(512), unique=True)
    path: Mapped[str] = mapped_column(Text)  # on the server: never in a reply
    base_model: Mapped[str] = mapped_column(String(1024))
    lora_rank: Mapped[int] = mapped_column(Integer, default=0)
    has_optimizer: Mapped[bool] = mapped_column(Boolean, default=False)
    step: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class TinkerMetric(Base):
    """One optimiser step of a model: the loss of the forward_backward calls it applied, grad norm, lr."""
    __tablename__ = "tinker_metrics"
    __table_args__ = (UniqueConstraint("model_id", "step", name="uq_tinker_metrics_model_step"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    model_id: Mapped[str] = mapped_column(ForeignKey("tinker_models.id", ondelete="CASCADE"), index=True)
    step: Mapped[int] = mapped_column(Integer)
    data: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


def make_engine(url: str):
    kwargs: dict[str, Any] = {"pool_pre_ping": True}
    if url.startswith("sqlite"):
        kwargs["connect_args"] = {"check_same_thread": False, "timeout": 30}
    else:
        # a hung client must not hold row locks forever: the server ends its idle transaction
        kwargs["connect_args"] = {"connect_timeout": 10, "options": "-c lock_timeout=10000 "
                                  "-c idle_in_transaction_session_timeout=20000 -c statement_timeout=60000"}
        kwargs["pool_size"] = 10
    engine = create_engine(url, **kwargs)
    if url.startswith("sqlite"):
        @event.listens_for(engine, "connect")
        def _pragmas(conn, _record):  # WAL: API readers don't block the worker's writes
            cur = conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()
    return engine


def migrate(engine) -> None:
    """Bring the schema to Alembic head, serialised across processes."""
    from alembic import command
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    url = engine.url
    if url.get_backend_name() == "sqlite":
        db_path = Path(url.database or ":memory:")
        with open(str(db_path) + ".migrate.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            with engine.begin() as conn:
                cfg.attributes["connection"] = conn
                command.upgrade(cfg, "head")
    else:
        with engine.begin() as conn:
            conn.execute(text("SELECT pg_advisory_xact_lock(724101)"))  # any constant: one migrator at a time
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")


def init_db(url: str):
    engine = make_engine(url)
    migrate(engine)
    return engine, sessionmaker(engine, expire_on_commit=False)
