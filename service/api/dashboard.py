"""The dashboard: one static page (no build step) that polls the JSON API and draws SVG charts."""
from __future__ import annotations

from pathlib import Path

from fastapi.responses import HTMLResponse, RedirectResponse

from ..guard import api_router

router = api_router(tags=["dashboard"], include_in_schema=False)
PAGE = Path(__file__).resolve().parent.parent / "static" / "dashboard.html"


@router.get("/")
def root() -> RedirectResponse:
    return RedirectResponse("/dashboard")


@router.get("/dashboard", response_class=HTMLResponse)
def dashboard() -> HTMLResponse:
    return HTMLResponse(PAGE.read_text(encoding="utf-8"))
