"""FastAPI dependencies as Annotated aliases."""
from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from .settings import Settings
from .store import Store


def get_store(request: Request) -> Store:
    return request.app.state.store


def get_app_settings(request: Request) -> Settings:
    return request.app.state.settings


StoreDep = Annotated[Store, Depends(get_store)]
SettingsDep = Annotated[Settings, Depends(get_app_settings)]
