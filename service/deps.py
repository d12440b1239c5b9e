"""FastAPI dependencies as Annotated aliases: the store, the settings and the caller's principal.

They are ``async def`` on purpose: FastAPI runs a plain ``def`` dependency in its thread pool, and
three thread hops per request cost more than the whole status query.
"""
from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Request, status

from .auth import Principal, authenticate
from .settings import Settings
from .store import Store


async def get_store(request: Request) -> Store:
    return request.app.state.store


async def get_app_settings(request: Request) -> Settings:
    return request.app.state.settings


async def get_principal(request: Request) -> Principal:
    settings: Settings = request.app.state.settings
    if not settings.auth:
        return Principal(tenant="default", admin=True)
    header = request.headers.get("authorization", "")
    scheme, _, key = header.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "missing bearer API key",
                            headers={"WWW-Authenticate": "Bearer"})
    principal = _cached(request.app, key.strip(), settings.admin_key)
    if principal is None:
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "invalid API key", headers={"WWW-Authenticate": "Bearer"})
    return principal


def _cached(app, key: str, admin_key: str | None) -> Principal | None:
    """Key → principal, remembered for a few seconds (a revoked key stops working within that TTL)."""
    import time

    cache = app.state.__dict__.setdefault("key_cache", {})
    hit = cache.get(key)
    now = time.monotonic()
    if hit and hit[1] > now:
        return hit[0]
    principal = authenticate(app.state.store, key, admin_key)
    if len(cache) > 10_000:
        cache.clear()
    cache[key] = (principal, now + 5.0)
    return principal


async def require_admin(principal: Annotated[Principal, Depends(get_principal)]) -> Principal:
    if not principal.admin:
        raise HTTPException(status.HTTP_403_FORBIDDEN, "admin key required")
    return principal


StoreDep = Annotated[Store, Depends(get_store)]
SettingsDep = Annotated[Settings, Depends(get_app_settings)]
PrincipalDep = Annotated[Principal, Depends(get_principal)]
AdminDep = Annotated[Principal, Depends(require_admin)]
