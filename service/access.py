"""Authentication for every route, in one place: an ASGI middleware in front of the routing.

With ``RLVR_AUTH=true`` every request except ``/healthz`` needs ``Authorization: Bearer KEY`` (or, as the
Tinker SDK sends it, ``X-API-Key: tml-KEY``) — API
routes, the grader dry runs, ``/metrics``, the dashboard page and the OpenAPI docs alike, including
paths that do not exist (an unauthenticated caller learns nothing about routes). The principal found
is left in the request state; :func:`service.deps.get_scope` turns it into the request's scope.
"""
from __future__ import annotations

import time

import anyio
from starlette.responses import JSONResponse

from .auth import LOCAL_USER, Principal, authenticate

PUBLIC_PATHS = frozenset({"/healthz"})
TINKER_PREFIX = "tml-"  # the SDK refuses keys without it: pass api_key="tml-" + your rlvr key  # liveness probes carry no credentials and see nothing
KEY_CACHE_S = 5.0  # a revoked key stops working within this time
_MAX_CACHED = 10_000


def _unauthorized(message: str) -> JSONResponse:
    return JSONResponse({"detail": message}, status_code=401, headers={"WWW-Authenticate": "Bearer"})


class AuthGate:
    def __init__(self, app, settings, store):
        self.app, self.settings, self.store = app, settings, store
        self._cache: dict[str, tuple[Principal | None, float]] = {}

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        state = scope.setdefault("state", {})
        if not self.settings.auth:
            state["principal"] = LOCAL_USER
            return await self.app(scope, receive, send)
        if scope["path"] in PUBLIC_PATHS:
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        kind, _, key = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
        key = key.strip()
        if not key and b"x-api-key" in headers:  # the Tinker SDK's header; it insists on a "tml-" prefix
            kind, key = "bearer", headers[b"x-api-key"].decode("latin-1").strip().removeprefix(TINKER_PREFIX)
        if kind.lower() != "bearer" or not key:
            return await _unauthorized("missing bearer API key")(scope, receive, send)
        principal = await self._principal(key)
        if principal is None:
            return await _unauthorized("invalid API key")(scope, receive, send)
        state["principal"] = principal
        return await self.app(scope, receive, send)

    async def _principal(self, key: str) -> Principal | None:
        if len(key) > 512:  # no key is this long; don't hash megabytes of header
            return None
        now = time.monotonic()
        hit = self._cache.get(key)
        if hit and hit[1] > now:
            return hit[0]
        # a database lookup: off the event loop, so a slow store never stalls other requests
        principal = await anyio.to_thread.run_sync(authenticate, self.store, key, self.settings.admin_key)
        if len(self._cache) > _MAX_CACHED:
            self._cache.clear()
        self._cache[key] = (principal, now + KEY_CACHE_S)
        return principal
