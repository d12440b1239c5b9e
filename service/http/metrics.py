"""HTTP request counts and latencies for GET /metrics: one ASGI middleware, outermost, so refused
requests (401, 413) count too.

Labelled by the matched route's TEMPLATE (``/v1/jobs/{job_id}``), never the raw path: a path carries ids
(unbounded label values, and other tenants' ids in an admin's scrape) and an unauthenticated caller could
mint a series per request. Requests no route answered (refused before routing, unknown paths) share the
label ``<unrouted>``; their status tells them apart.

With ``rlvr serve --workers N`` each worker process counts its own requests; ``serve`` points
``PROMETHEUS_MULTIPROC_DIR`` at a fresh folder so a scrape, whichever worker answers it, sums them all
(prometheus_client's multiprocess mode).
"""
from __future__ import annotations

import os
import time

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.multiprocess import MultiProcessCollector

UNROUTED = "<unrouted>"
REGISTRY = CollectorRegistry(auto_describe=True)
REQUESTS = Counter("rlvr_http_requests", "HTTP requests by method, route template and status",
                   ["method", "route", "status"], registry=REGISTRY)
LATENCY = Histogram("rlvr_http_request_duration_seconds", "HTTP request latency by method and route template "
                    "(a streamed response counts until it ends)", ["method", "route"], registry=REGISTRY,
                    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 60.0))


class HttpMetrics:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0, status = time.perf_counter(), 500  # an exception with no response sent is a 500

        async def observed(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, observed)
        finally:
            route = getattr(scope.get("route"), "path", None) or UNROUTED  # set by the router on a match
            REQUESTS.labels(scope["method"], route, str(status)).inc()
            LATENCY.labels(scope["method"], route).observe(time.perf_counter() - t0)


def collector_registry() -> CollectorRegistry:
    """This process's HTTP series, or every worker process's under ``PROMETHEUS_MULTIPROC_DIR``."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        reg = CollectorRegistry()
        MultiProcessCollector(reg)
        return reg
    return REGISTRY
