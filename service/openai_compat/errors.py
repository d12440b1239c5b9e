"""OpenAI's error shape for the routes OpenAI's clients call: ``/v1/fine_tuning``, ``/v1/files``, ``/v1/models``.

Every error there — a bad parameter, a missing job/file/model, an unknown route, a missing key, a body over
the limit, a fair-share refusal, an unexpected failure — is ``{"error": {"message", "type", "param",
"code"}}`` with OpenAI's status codes: 400 for a bad parameter (the first one is ``param``, every one is in
``message``), 401, 404, 413, 429, 500. The decision is by path, in one place (:func:`speaks_openai`), for
the routes (:class:`OpenAIRoute`) and the app's own handlers and middleware alike. ``/v1/files`` is shared
with the native API and answers in this shape for every client; the native client (service/cli/client.py)
reads both shapes.
"""
from __future__ import annotations

from typing import Any

from fastapi import HTTPException, Request, Response
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..http.guard import GuardedRoute, SafeJSONResponse
from ..jobs.files import FileNotFound
from ..store.jobs import IllegalTransition, JobNotFound
from .mapping import Unsupported
from .schema import openai_param

PREFIXES = ("/v1/fine_tuning", "/v1/files", "/v1/models")
MAX_MESSAGES = 20
_TYPES = {401: "invalid_request_error", 404: "invalid_request_error", 413: "invalid_request_error",
          429: "requests", 500: "server_error", 503: "server_error"}
_CODES = {401: "invalid_api_key", 429: "rate_limit_exceeded"}
# where check_spec's errors point in an rlvr spec → the OpenAI parameter they came from
SPEC_PARAMS = {"model.path": "model", "data.dataset": "training_file", "data.eval_dataset": "validation_file"}


def speaks_openai(path: str) -> bool:
    return any(path == p or path.startswith(p + "/") for p in PREFIXES)


def error(status: int, message: str, param: str | None = None, code: str | None = None,
          headers: dict[str, str] | None = None) -> SafeJSONResponse:
    kind = "invalid_request_error" if status < 500 and status not in _TYPES else _TYPES.get(status, "server_error")
    body = {"error": {"message": message[:4000], "type": kind, "param": param, "code": code or _CODES.get(status)}}
    return SafeJSONResponse(body, status_code=status, headers=headers)


def invalid(errors: list[dict[str, Any]]) -> SafeJSONResponse:
    """OpenAI's 400: ``param`` is the first problem's parameter; ``message`` names every problem."""
    parts, first = [], None
    for e in errors[:MAX_MESSAGES]:
        param = openai_param(e)
        param = SPEC_PARAMS.get(param, param)
        first = first if first is not None else (param or None)
        parts.append(f"{param or 'body'}: {e.get('msg', 'invalid')}")
    more = len(errors) - MAX_MESSAGES
    return error(400, "; ".join(parts) + (f"; … and {more} more" if more > 0 else ""), first)


def from_exception(exc: Exception) -> SafeJSONResponse | None:
    """The OpenAI answer to an exception a route raised, or None (not one of ours: a 500)."""
    if isinstance(exc, RequestValidationError):
        return invalid(list(exc.errors()))
    if isinstance(exc, Unsupported):
        return error(400, str(exc), exc.param)
    if isinstance(exc, JobNotFound):
        return error(404, f"fine-tuning job {exc.args[0]!r} not found", "id", "job_not_found")
    if isinstance(exc, FileNotFound):  # OpenAI's own words; another tenant's file reads the same
        return error(404, f"No such File object: {exc.args[0]}", "id", "file_not_found")
    if isinstance(exc, IllegalTransition):
        return error(400, str(exc))
    if isinstance(exc, (HTTPException, StarletteHTTPException)):
        return error(exc.status_code, str(exc.detail), headers=getattr(exc, "headers", None))
    return None


def _query_names(route: GuardedRoute) -> tuple[set[str], tuple[str, ...]]:
    """The query parameters a route reads: declared ones, and deepObject ones (``metadata[key]``) by prefix."""
    names, stack = set(), [route.dependant]
    while stack:  # the route's own parameters and its dependencies'
        dependant = stack.pop()
        names |= {p.alias for p in dependant.query_params}
        stack.extend(dependant.dependencies)
    extra = (route.openapi_extra or {}).get("parameters", [])
    prefixes = tuple(p["name"] + "[" for p in extra if p.get("in") == "query" and p.get("style") == "deepObject")
    return names, prefixes


class OpenAIRoute(GuardedRoute):
    """Guarded like every route; a query parameter the route does not read is a 400 naming it (never
    silently ignored); whatever goes wrong answers in OpenAI's shape."""

    def refuse(self, errors: list[dict[str, Any]]) -> Response:
        return invalid(errors)

    def get_route_handler(self):
        handler = super().get_route_handler()
        names, prefixes = _query_names(self)

        async def openai_shaped(request: Request) -> Response:
            unknown = [k for k in request.query_params if k not in names and not k.startswith(prefixes)]
            if unknown:
                return error(400, f"unknown query parameter {unknown[0]!r}"
                             + (f"; this route reads: {', '.join(sorted(names))}" if names else ""), unknown[0])
            try:
                return await handler(request)
            except Exception as e:
                answer = from_exception(e)
                if answer is None:
                    raise  # the app's handler logs it and answers 500 (in this shape: speaks_openai)
                return answer

        return openai_shaped
