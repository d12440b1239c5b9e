"""The request body limit: 413 for a body over ``RLVR_MAX_BODY_BYTES``, declared or streamed."""
from __future__ import annotations

from fastapi.responses import JSONResponse

from ..openai_compat import errors as openai_errors


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
