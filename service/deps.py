"""FastAPI dependencies as Annotated aliases: the store, the settings, the caller's principal and scope.

They are ``async def`` on purpose: FastAPI runs a plain ``def`` dependency in its thread pool, and
three thread hops per request cost more than the whole status query. Authentication itself happens
before routing (:mod:`service.access.gate`); these only read what it found.
"""
from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Request, status

from .access.fairshare import FairShare
from .access.keys import Principal, Scope
from .settings import Settings
from .store.jobs import Store


async def get_store(request: Request) -> Store:
    return request.app.state.store


async def get_app_settings(request: Request) -> Settings:
    return request.app.state.settings


async def get_fairshare(request: Request) -> FairShare:
    return request.app.state.fairshare


async def get_principal(request: Request) -> Principal:
    principal = getattr(request.state, "principal", None)
    if principal is None:  # only /healthz passes the gate without one, and it takes no principal
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "missing bearer API key",
                            headers={"WWW-Authenticate": "Bearer"})
    return principal


async def get_scope(principal: Annotated[Principal, Depends(get_principal)]) -> Scope:
    """The one place a request's tenant scope is decided: from the key's admin flag (Principal.scope)."""
    return principal.scope


async def require_admin(principal: Annotated[Principal, Depends(get_principal)]) -> Principal:
    if not principal.admin:
        raise HTTPException(status.HTTP_403_FORBIDDEN, "admin key required")
    return principal


StoreDep = Annotated[Store, Depends(get_store)]
SettingsDep = Annotated[Settings, Depends(get_app_settings)]
PrincipalDep = Annotated[Principal, Depends(get_principal)]
ScopeDep = Annotated[Scope, Depends(get_scope)]
AdminDep = Annotated[Principal, Depends(require_admin)]
FairShareDep = Annotated[FairShare, Depends(get_fairshare)]
