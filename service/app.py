"""Builds the FastAPI app and includes one router per resource."""
from __future__ import annotations

import logging
import threading
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .access import AuthGate, KeyCache
from .api import dashboard, files, health, jobs, keys, models, openai_compat, prom, sessions, tinker, verifiers
from .fairshare import FairShare
from . import openai_errors
from .httpmetrics import HttpMetrics
from .openapi_links import add_links
from .settings import Settings, get_settings
from .files import FileNotFound
from .store import IllegalTransition, JobNotFound, Store
from .tinker.sessions import Gone as TinkerGone, NotFound as TinkerNotFound
from .tinker.reaper import reap_sessions

log = logging.getLogger("rlvr.api")


def _too_large(scope, limit: int) -> JSONResponse:
    message = f"request body over {limit} bytes"
    if openai_errors.speaks_openai(scope.get("path", "")):
        return openai_errors.error(413, message, "body")
    return JSONResponse({"detail": message}, 413)


class BodyLimit:
    """413 for bodies over the limit, declared (Content-Length) or streamed (chunked)."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.limit:
            return await _too_large(scope, self.limit)(scope, receive, send)
        seen, responded = 0, False

        async def limited():
            nonlocal seen, responded
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > self.limit:
                    if not responded:
                        responded = True
                        await _too_large(scope, self.limit)(scope, receive, send)
                    return {"type": "http.disconnect"}  # the app stops reading; its reply is dropped
            return msg

        async def guarded_send(message):
            if not responded:
                await send(message)

        await self.app(scope, limited, guarded_send)


def start_reaper(app: FastAPI) -> threading.Event:
    """Background thread: hand back jobs of dead/hung workers, re-send jobs the broker lost."""
    stop = threading.Event()
    settings: Settings = app.state.settings
    store: Store = app.state.store

    def loop():
        from .tasks import enqueue

        while not stop.wait(settings.reaper_interval_s):
            try:
                for job_id in store.reap(settings.requeue_queued_after_s, settings.max_attempts,
                                         settings.on_worker_lost):
                    try:
                        enqueue(job_id, settings)
                    except Exception as e:  # broker down: the next pass tries again
                        log.warning("re-enqueue of %s failed: %s", job_id, e)
            except Exception:
                log.exception("reaper pass failed")
            reap_sessions(store, settings)  # training sessions (service/tinker): their own rules

    threading.Thread(target=loop, daemon=True, name="rlvr-reaper").start()
    return stop


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

    # Domain errors become HTTP answers here, once, instead of a try/except in every route; under the
    # OpenAI-compatible prefixes in OpenAI's shape (service/openai_errors.py), elsewhere FastAPI's.
    def openai_shaped(request: Request, exc: Exception):
        return openai_errors.from_exception(exc) if openai_errors.speaks_openai(request.url.path) else None

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        # FastAPI echoes the bad input back; inf/NaN or bytes there would make the 422 itself fail
        detail = [{"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))}
                  for e in exc.errors()]
        return openai_shaped(request, exc) or JSONResponse({"detail": detail}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):  # unknown routes, 405s, raised 4xx
        return openai_shaped(request, exc) or JSONResponse({"detail": exc.detail}, status_code=exc.status_code,
                                                            headers=getattr(exc, "headers", None))

    @app.exception_handler(JobNotFound)
    async def job_not_found(request: Request, exc: JobNotFound):
        return openai_shaped(request, exc) or JSONResponse({"detail": f"job {exc.args[0]!r} not found"},
                                                            status_code=404)

    @app.exception_handler(IllegalTransition)
    async def illegal(request: Request, exc: IllegalTransition):
        return openai_shaped(request, exc) or JSONResponse({"detail": str(exc)}, status_code=409)

    @app.exception_handler(FileNotFound)
    async def file_not_found(request: Request, exc: FileNotFound):
        return openai_shaped(request, exc) or JSONResponse({"detail": f"file {exc.args[0]!r} not found"},
                                                            status_code=404)

    @app.exception_handler(TinkerNotFound)
    async def tinker_not_found(request: Request, exc: TinkerNotFound):  # "session 'x' not found", …
        return JSONResponse({"detail": str(exc)}, status_code=404)

    @app.exception_handler(TinkerGone)
    async def tinker_gone(request: Request, exc: TinkerGone):  # the SDK does not retry a 410: the caller sees why
        return JSONResponse({"detail": str(exc)}, status_code=410)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception):  # never leak a traceback; log it
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        if openai_errors.speaks_openai(request.url.path):
            return openai_errors.error(500, "internal error")
        return JSONResponse({"detail": "internal error"}, status_code=500)

    for r in (health, jobs, files, keys, models, prom, dashboard):
        app.include_router(r.router)
    app.include_router(verifiers.router)
    app.include_router(openai_compat.router)
    app.include_router(tinker.router)    # /api/v1: the training primitives in the Tinker SDK's protocol
    app.include_router(sessions.router)  # /v1/sessions: those sessions, for people and the dashboard
    generated = app.openapi
    app.openapi = lambda: add_links(generated())  # FastAPI caches the document; links are added in place
    return app
