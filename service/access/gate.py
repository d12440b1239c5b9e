"""Authentication for every route, in one place: an ASGI middleware in front of the routing.

With ``RLVR_AUTH=true`` every request needs ``Authorization: Bearer KEY`` (or, as the Tinker SDK sends it,
``X-API-Key: tml-KEY``) — API routes, the grader dry runs, ``/metrics`` and the OpenAPI docs alike, including
paths that do not exist (an unauthenticated caller learns nothing about routes) — except the PUBLIC_PATHS:
``/healthz`` and the dashboard page (``/dashboard``, and ``/`` which redirects to it). The page is one static
file with no data in it; a browser must get it to show the key form, and every call it makes for data is a
``/v1`` call with the key. The principal found
is left in the request state; :func:`service.deps.get_scope` turns it into the request's scope.
"""
from __future__ import annotations

import time

import anyio
from starlette.responses import JSONResponse

from .keys import LOCAL_USER, Principal, authenticate

# Liveness probes carry no credentials and see nothing; the dashboard page is the same static bytes for
# everyone (tests/test_access_control.py checks both), and asks the user for a key before any data call.
PUBLIC_PATHS = frozenset({"/healthz", "/dashboard", "/"})
# How long one API process trusts what it looked up: a key revoked through this process is refused at once
# (KeyCache.forget); one revoked elsewhere (another API process, `rlvr keys revoke`) within this time
# (measured: tests/test_keys.py, docs/api.md). One lookup per key per process per KEY_CACHE_S.
KEY_CACHE_S = 1.0
TINKER_PREFIX = "tml-"  # the Tinker SDK refuses keys without it: pass api_key="tml-" + your rlvr key
_MAX_CACHED = 10_000


class KeyCache:
    """key → principal, for KEY_CACHE_S seconds, so a request does not cost a database lookup."""

    def __init__(self, ttl: float = KEY_CACHE_S):
        self.ttl = ttl
        self._entries: dict[str, tuple[Principal | None, float]] = {}

    def get(self, key: str, now: float) -> tuple[bool, Principal | None]:
        hit = self._entries.get(key)
        return (True, hit[0]) if hit and hit[1] > now else (False, None)

    def put(self, key: str, principal: Principal | None, now: float) -> None:
        if len(self._entries) > _MAX_CACHED:
            self._entries.clear()
        self._entries[key] = (principal, now + self.ttl)

    def forget(self, key_id: str) -> None:
        """A key was revoked: drop what was cached for it (by its stored id; the cache holds no ids of keys
        it never saw)."""
        for key, (principal, _) in list(self._entries.items()):
            if principal is not None and principal.key_id == key_id:
                self._entries.pop(key, None)


def _unauthorized(message: str, path: str) -> JSONResponse:
    from ..openai_compat.errors import error, speaks_openai

    if speaks_openai(path):  # OpenAI's clients read {"error": {...}}
        return error(401, message, headers={"WWW-Authenticate": "Bearer"})
    return JSONResponse({"detail": message}, status_code=401, headers={"WWW-Authenticate": "Bearer"})


class AuthGate:
    def __init__(self, app, settings, store, cache: KeyCache | None = None):
        self.app, self.settings, self.store = app, settings, store
        self.cache = cache if cache is not None else KeyCache()

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        state = scope.setdefault("state", {})
        if not self.settings.auth:
            state["principal"] = LOCAL_USER
            return await self.app(scope, receive, send)
        if scope["path"] in PUBLIC_PATHS and scope.get("method") in ("GET", "HEAD"):
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        kind, _, key = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
        key = key.strip()
        if not key and b"x-api-key" in headers:  # the Tinker SDK's header; it insists on a "tml-" prefix
            kind, key = "bearer", headers[b"x-api-key"].decode("latin-1").strip().removeprefix(TINKER_PREFIX)
        if kind.lower() != "bearer" or not key:
            return await _unauthorized("missing bearer API key", scope["path"])(scope, receive, send)
        principal = await self._principal(key)
        if principal is None:
            return await _unauthorized("invalid API key", scope["path"])(scope, receive, send)
        state["principal"] = principal
        return await self.app(scope, receive, send)

    async def _principal(self, key: str) -> Principal | None:
        if len(key) > 512:  # no key is this long; don't hash megabytes of header
            return None
        now = time.monotonic()
        found, principal = self.cache.get(key, now)
        if found:
            return principal
        # a database lookup: off the event loop, so a slow store never stalls other requests
        principal = await anyio.to_thread.run_sync(authenticate, self.store, key, self.settings.admin_key)
        self.cache.put(key, principal, now)
        return principal
