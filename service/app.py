"""Builds the FastAPI app: middleware, the three front doors' routers, error handlers — nothing else."""
from __future__ import annotations

from contextlib import asynccontextmanager

from fastapi import FastAPI

from .access.fairshare import FairShare
from .access.gate import AuthGate, KeyCache
from .api import dashboard, datasets, evals, files, health, jobs, keys, models, prom, sessions, verifiers
from .http.errors import install_error_handlers
from .http.limits import BodyLimit
from .http.metrics import HttpMetrics
from .http.openapi_links import add_links
from .openai_compat import routes as openai_compat
from .settings import Settings, get_settings
from .store.jobs import Store
from .tinker import routes as tinker
from .worker.reaper import start_reaper


def create_app(settings: Settings | None = None, store: Store | None = None, reaper: bool = True) -> FastAPI:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        stop = start_reaper(app) if reaper else None
        yield
        if stop:
            stop.set()
        app.state.fairshare.close()

    app = FastAPI(title="rlvr", version="0.1.0", lifespan=lifespan,
                  description="Reinforcement learning with verifiable rewards, as a service.")
    app.state.settings = settings
    app.state.store = store or Store(settings.db_url)
    app.state.fairshare = FairShare(settings)
    app.state.key_cache = KeyCache()  # the auth gate's; revoking a key here empties its entry at once
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)
    # added last = outermost: an unauthenticated request is refused before its body is read
    app.add_middleware(AuthGate, settings=settings, store=app.state.store, cache=app.state.key_cache)
    app.add_middleware(HttpMetrics)  # around everything: refused requests are counted too

    install_error_handlers(app)

    for r in (health, jobs, evals, files, datasets, keys, models, prom, dashboard):
        app.include_router(r.router)
    app.include_router(verifiers.router)
    app.include_router(openai_compat.router)
    app.include_router(tinker.router)    # /api/v1: the training primitives in the Tinker SDK's protocol
    app.include_router(sessions.router)  # /v1/sessions: those sessions, for people and the dashboard
    generated = app.openapi
    app.openapi = lambda: add_links(generated())  # FastAPI caches the document; links are added in place
    return app
