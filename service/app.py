"""Builds the FastAPI app and includes one router per resource."""
from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from .api import dashboard, health, jobs
from .settings import Settings, get_settings
from .store import Store


def create_app(settings: Settings | None = None, store: Store | None = None) -> FastAPI:
    settings = settings or get_settings()
    app = FastAPI(title="rlvr", version="0.1.0",
                  description="Reinforcement learning with verifiable rewards, as a service.")
    app.state.settings = settings
    app.state.store = store or Store(settings.db_url)

    @app.middleware("http")
    async def limit_body(request: Request, call_next):
        size = request.headers.get("content-length")
        if size and size.isdigit() and int(size) > settings.max_body_bytes:
            return JSONResponse({"detail": f"request body over {settings.max_body_bytes} bytes"}, status_code=413)
        return await call_next(request)

    app.include_router(health.router)
    app.include_router(jobs.router)
    app.include_router(dashboard.router)
    return app
