"""`rlvr serve`: uvicorn with TCP_NODELAY on every accepted connection, however many workers.

Why: with ``--workers N > 1`` uvicorn binds the listening socket itself as ``socket.socket(AF_INET)``
(protocol 0) and hands it to the worker processes. asyncio only sets TCP_NODELAY on sockets whose
protocol is IPPROTO_TCP, so connections accepted from that socket kept Nagle's algorithm on: a
response written in two pieces (head, then body) waited for the client's delayed ACK, about 40 ms
per request (measured: strace shows no TCP_NODELAY setsockopt with 2 workers, one per connection
with 1; 44–50 ms per request with 2 workers, 7–12 ms with 1; bench/RESULTS.md). Setting it ourselves
on each connection makes the worker count a CPU question again.
"""
from __future__ import annotations

import socket

from uvicorn.protocols.http.auto import AutoHTTPProtocol


class NoDelayHTTP(AutoHTTPProtocol):  # uvicorn's own choice (httptools if installed, else h11)
    def connection_made(self, transport) -> None:  # type: ignore[override]
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().connection_made(transport)


def serve(host: str, port: int, workers: int = 1) -> None:
    import os
    import tempfile

    import uvicorn

    if workers > 1 and not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        # each worker process counts its own HTTP requests; in this folder a scrape sums them all
        # (service/http/metrics.py); set before the workers start, so they inherit it
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="rlvr-prom-")

    uvicorn.run("service.app:create_app", factory=True, host=host, port=port, workers=workers,
                http=NoDelayHTTP, log_level="warning")
