"""FastAPI dependencies as Annotated aliases: the store, the settings and the caller's principal."""
from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Request, status

from .auth import Principal, authenticate
from .settings import Settings
from .store import Store


def get_store(request: Request) -> Store:
    return request.app.state.store


def get_app_settings(request: Request) -> Settings:
    return request.app.state.settings


def get_principal(request: Request) -> Principal:
    settings: Settings = request.app.state.settings
    if not settings.auth:
        return Principal(tenant="default", admin=True)
    header = request.headers.get("authorization", "")
    scheme, _, key = header.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "missing bearer API key",
                            headers={"WWW-Authenticate": "Bearer"})
    principal = authenticate(request.app.state.store, key.strip(), settings.admin_key)
    if principal is None:
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "invalid API key", headers={"WWW-Authenticate": "Bearer"})
    return principal


def require_admin(principal: Annotated[Principal, Depends(get_principal)]) -> Principal:
    if not principal.admin:
        raise HTTPException(status.HTTP_403_FORBIDDEN, "admin key required")
    return principal


StoreDep = Annotated[Store, Depends(get_store)]
SettingsDep = Annotated[Settings, Depends(get_app_settings)]
PrincipalDep = Annotated[Principal, Depends(get_principal)]
AdminDep = Annotated[Principal, Depends(require_admin)]
