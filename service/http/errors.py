"""Domain exceptions become HTTP answers here, once, instead of a try/except in every route: under the
OpenAI-compatible prefixes in OpenAI's shape (service/openai_compat/errors.py), elsewhere FastAPI's."""
from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..jobs.files import FileNotFound
from ..openai_compat import errors as openai_errors
from ..store.jobs import IllegalTransition, JobNotFound
from ..tinker.sessions import Gone as TinkerGone, NotFound as TinkerNotFound

log = logging.getLogger("rlvr.api")


def install_error_handlers(app: FastAPI) -> None:
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
