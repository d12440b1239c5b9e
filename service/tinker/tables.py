"""Tables of the training primitives: sessions, their models and samplers, the request queue (the SDK's
futures), checkpoints and per-step metrics. Registered on the one ``Base``; created by Alembic (0005)."""
from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import (JSON, Boolean, DateTime, ForeignKey, Index, Integer, LargeBinary, String, Text,
                        UniqueConstraint)
from sqlalchemy.orm import Mapped, mapped_column

from ..db import Base, utcnow


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
