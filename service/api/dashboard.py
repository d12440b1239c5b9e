"""The dashboard: one static page (no build step) that polls the JSON API and draws SVG charts.

Served without a key even with auth on (service/access/gate.py PUBLIC_PATHS): the page is a constant file
with no data, and it asks for a key (kept in the tab's sessionStorage) before making any /v1 call. Its
Content-Security-Policy lets the page talk to this server only, so nothing injected into it could send
the key elsewhere; every value it shows from the API goes through its `esc()`.
"""
from __future__ import annotations

from pathlib import Path

from fastapi.responses import HTMLResponse, RedirectResponse

from ..http.guard import api_router

router = api_router(tags=["dashboard"], include_in_schema=False)
PAGE = Path(__file__).resolve().parent.parent / "static" / "dashboard.html"


@router.get("/")
def root() -> RedirectResponse:
    return RedirectResponse("/dashboard")


HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                               "connect-src 'self'; img-src 'self' data: blob:; form-action 'none'; "
                               "base-uri 'none'; frame-ancestors 'none'",
    "Referrer-Policy": "no-referrer", "X-Content-Type-Options": "nosniff", "Cache-Control": "no-cache",
}


@router.get("/dashboard", response_class=HTMLResponse)
def dashboard() -> HTMLResponse:
    return HTMLResponse(PAGE.read_text(encoding="utf-8"), headers=HEADERS)
