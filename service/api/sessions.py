"""/v1/sessions: training sessions (the Tinker-compatible primitives) as people see them — each session's
models with their status, optimiser steps, checkpoints and loss curve (one point per optim_step: the summed
loss of the forward_backward calls it applied). What the dashboard lists; scoped like every other read."""
from __future__ import annotations

from typing import Any

from fastapi import Query

from ..deps import ScopeDep, StoreDep
from ..http.guard import api_router
from ..tinker.sessions import Sessions

router = api_router(prefix="/v1/sessions", tags=["sessions"])


def _session_out(ss: Sessions, sess, scope, curves: bool) -> dict[str, Any]:
    models = []
    for m in ss.models_of(sess.id):
        points = ss.metrics(m.id) if curves else ss.metrics(m.id)[-1:]
        models.append({
            "id": m.id, "base_model": m.base_model, "lora_rank": m.lora_rank, "status": m.status, "steps": m.steps,
            "error": m.error, "last_loss": points[-1].data.get("loss") if points else None,
            **({"loss_curve": [{"step": p.step, **p.data} for p in points]} if curves else {}),
            "checkpoints": [{"tinker_path": c.tinker_path, "kind": c.kind, "step": c.step,
                             "created_at": c.created_at.isoformat()} for c in ss.checkpoints(scope, m.id, limit=100)],
        })
    out = {"id": sess.id, "status": sess.status, "worker": sess.worker_state, "display_name": sess.display_name,
           "created_at": sess.created_at.isoformat(), "last_seen_at": sess.last_seen_at.isoformat(),
           "finish_reason": sess.finish_reason, "models": models}
    if scope.all_tenants:
        out["tenant"] = sess.tenant
    return out


@router.get("")
def list_sessions(store: StoreDep, scope: ScopeDep, limit: int = Query(50, ge=1, le=500)) -> dict[str, Any]:
    """Newest first, with each model's last loss (``GET /v1/sessions/{id}`` has the loss curves)."""
    ss = Sessions(store)
    return {"data": [_session_out(ss, s, scope, curves=False) for s in ss.list(scope, limit)]}


@router.get("/{session_id}")
def get_session(session_id: str, store: StoreDep, scope: ScopeDep) -> dict[str, Any]:
    ss = Sessions(store)
    return _session_out(ss, ss.get(session_id, scope), scope, curves=True)  # NotFound: 404 (app handler)
