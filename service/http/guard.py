"""Input and output hygiene shared by every route: hostile input is a 4xx naming the limit, never a 500.

* :class:`GuardedRoute` (the route class of every router) checks, before FastAPI validates anything:
  query integers must fit in 64 bits; a JSON body must parse (no 5000-digit integers, no nesting
  Python's parser cannot follow) and every value in it must be storable and printable anywhere —
  nesting at most :data:`MAX_JSON_DEPTH` levels, integers within a signed 64-bit range, finite
  numbers, strings without NUL characters or lone UTF-16 surrogates. Uploaded JSONL rows get the
  same :func:`json_problems` check (service/jobs/files.py).
* :class:`SafeJSONResponse` renders whatever a route returns; a value stored before these checks
  existed (a lone surrogate, a NaN) is replaced in the reply instead of turning it into a 500.
* :func:`parse_int` reads integers from headers and free-form strings (``Last-Event-ID``, OpenAI
  cursors) strictly: ASCII digits only (``"²".isdigit()`` is True; ``int("²")`` raises), bounded.
"""
from __future__ import annotations

import json
import math
import re
from typing import Any

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.requests import ClientDisconnect

MAX_JSON_DEPTH = 64
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_ERRORS = 20
_ASCII_INT = re.compile(r"[+-]?[0-9]+")


def _string_problem(s: str) -> str | None:
    if "\x00" in s:
        return "strings must not contain NUL characters"
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return "strings must not contain lone UTF-16 surrogates (e.g. \\ud800): not valid Unicode text"
    return None


def json_problems(value: Any, loc: tuple = ("body",), max_depth: int = MAX_JSON_DEPTH) -> list[dict[str, Any]]:
    """Why a parsed JSON value cannot be accepted, as FastAPI-style errors naming where (iterative:
    no recursion, whatever the depth)."""
    errors: list[dict[str, Any]] = []
    stack: list[tuple[Any, tuple, int]] = [(value, loc, 1)]
    while stack and len(errors) < MAX_ERRORS:
        v, where, depth = stack.pop()
        msg = None
        if isinstance(v, bool) or v is None:
            continue
        if isinstance(v, str):
            msg = _string_problem(v)
        elif isinstance(v, int):
            if not INT64_MIN <= v <= INT64_MAX:
                msg = "integers must fit in a signed 64-bit integer (-2**63 .. 2**63-1)"
        elif isinstance(v, float):
            if not math.isfinite(v):
                msg = "numbers must be finite (no NaN, Infinity or overflowing literals such as 1e999)"
        elif isinstance(v, (dict, list)):
            if depth > max_depth:
                msg = f"JSON nested deeper than {max_depth} levels (the limit)"
            elif isinstance(v, dict):
                for k, x in v.items():
                    why = _string_problem(k) if isinstance(k, str) else None
                    if why:
                        errors.append({"loc": [*where, k.encode("utf-8", "replace").decode()], "type": "value_error",
                                       "msg": f"key: {why}"})
                    else:
                        stack.append((x, (*where, k), depth + 1))
            else:
                stack.extend((x, (*where, i), depth + 1) for i, x in enumerate(v))
        if msg:
            errors.append({"loc": list(where), "type": "value_error", "msg": msg})
    return errors


def parse_failure(e: Exception, loc: tuple = ("body",)) -> list[dict[str, Any]] | None:
    """``json.loads`` failures other than a syntax error, as errors naming the limit (None: not ours)."""
    if isinstance(e, json.JSONDecodeError):
        return None
    if isinstance(e, RecursionError):
        return [{"loc": list(loc), "type": "value_error",
                 "msg": f"JSON nested deeper than {MAX_JSON_DEPTH} levels (the limit)"}]
    if isinstance(e, UnicodeDecodeError):
        return [{"loc": list(loc), "type": "value_error", "msg": "not UTF-8 text"}]
    if isinstance(e, ValueError):  # int() refuses literals over sys.get_int_max_str_digits() digits
        return [{"loc": list(loc), "type": "value_error",
                 "msg": "integer literal too long: integers must fit in a signed 64-bit integer"}]
    return None


def parse_int(text: str | None, loc: tuple, lo: int = 0, hi: int = INT64_MAX) -> int | None:
    """A strict integer from a header or a free-form string; RequestValidationError naming ``loc``."""
    if text is None or text == "":
        return None
    text = text.strip()
    if not _ASCII_INT.fullmatch(text) or len(text) > 20 or not lo <= int(text) <= hi:
        raise RequestValidationError([{"loc": list(loc), "type": "int_parsing",
                                       "msg": f"expected an integer from {lo} to {hi} (ASCII digits)"}])
    return int(text)


def query_problems(request: Request) -> list[dict[str, Any]]:
    """Integer-looking query values beyond 64 bits, whatever the parameter's declared type."""
    errors = []
    for name, value in request.query_params.multi_items():
        v = value.strip()
        if _ASCII_INT.fullmatch(v) and len(v) > 18 and not INT64_MIN <= int(v[:30]) <= INT64_MAX:
            errors.append({"loc": ["query", name], "type": "value_error",
                           "msg": "integers must fit in a signed 64-bit integer (-2**63 .. 2**63-1)"})
    return errors


def _is_json_body(request: Request) -> bool:
    ctype = request.headers.get("content-type", "")
    main = ctype.split(";", 1)[0].strip().lower()
    return not main or main == "application/json" or (main.startswith("application/") and main.endswith("+json"))


async def body_problems(request: Request) -> list[dict[str, Any]]:
    if not _is_json_body(request) or not await request.body():
        return []
    try:
        value = await request.json()  # cached on the request: FastAPI's own parse reuses it
    except (ValueError, RecursionError) as e:
        return parse_failure(e) or []  # a syntax error: FastAPI's own 422 names the position
    return json_problems(value)


class GuardedRoute(APIRoute):
    """Every API route: the checks above run before FastAPI parses and validates the request."""

    def refuse(self, errors: list[dict[str, Any]]) -> Response:
        raise RequestValidationError(errors)

    def get_route_handler(self):
        handler = super().get_route_handler()
        has_body = self.body_field is not None

        async def guarded(request: Request) -> Response:
            errors = query_problems(request)
            if not errors and has_body:
                try:
                    errors = await body_problems(request)
                except ClientDisconnect:  # gone (or cut off by the body limit, which has answered 413)
                    return Response(status_code=400)
            if errors:
                return self.refuse(errors)
            return await handler(request)

        return guarded


def _clean(v: Any) -> Any:
    if isinstance(v, str):
        return v.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {_clean(k): _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    return v


class SafeJSONResponse(JSONResponse):
    """JSON replies that cannot fail on stored data: on a lone surrogate or a non-finite number (stored
    before input was checked), those values are replaced (U+FFFD, null) instead of a 500."""

    def render(self, content: Any) -> bytes:
        try:
            return super().render(content)
        except (UnicodeEncodeError, ValueError):
            return super().render(_clean(content))


def api_router(route_class: type[GuardedRoute] = GuardedRoute, **kwargs: Any):
    """The APIRouter every resource uses: guarded routes, replies that cannot fail on stored data."""
    from fastapi import APIRouter

    return APIRouter(route_class=route_class, default_response_class=SafeJSONResponse, **kwargs)


def safe_json(value: Any) -> str:
    """One JSON text for a reply built by hand (SSE): never fails on stored data (see SafeJSONResponse)."""
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False).encode("utf-8").decode("utf-8")
    except (UnicodeEncodeError, ValueError):
        return json.dumps(_clean(value), ensure_ascii=False, allow_nan=False)
