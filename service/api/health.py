"""/healthz: liveness, answered on the event loop itself.

No database query, no thread pool, no sandbox: it must answer while verifier requests saturate the
sandbox pool or the request threads (a probe that times out would get a busy but healthy API
restarted). It is the only route that needs no key when auth is on.
"""
from __future__ import annotations

from ..http.guard import api_router

router = api_router(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict:
    return {"status": "ok"}
