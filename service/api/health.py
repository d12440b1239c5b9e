from __future__ import annotations

from fastapi import APIRouter
from sqlalchemy import text

from ..deps import StoreDep

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz(store: StoreDep) -> dict:
    with store.engine.connect() as c:
        c.execute(text("SELECT 1"))
    return {"status": "ok"}
