"""The job event stream through sse-starlette (retry:, ids, keep-alive pings, Last-Event-ID) and the client
`rlvr logs -f` uses, which resumes a dropped stream where it broke."""
from __future__ import annotations

import json

import httpx
import pytest
from fastapi.testclient import TestClient

from service.cli.client import APIError, Client

GOOD = {"name": "sse", "train": {"steps": 3, "prompts_per_step": 2}, "rollout": {"group_size": 2}}


@pytest.fixture
def pinging(tmp_path, models_dir):
    from service.app import create_app
    from service.settings import Settings

    with TestClient(create_app(Settings(home=tmp_path / "home", models=models_dir, sse_ping_s=0.2),
                               reaper=False)) as c:
        yield c


def test_the_stream_opens_with_retry_and_pings_while_idle(pinging):
    job = pinging.post("/v1/jobs", json=GOOD).json()["id"]  # queued: nothing happens, the stream idles
    with pinging.stream("GET", f"/v1/jobs/{job}/events/stream", params={"timeout": 1.5}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = list(r.iter_lines())
    assert lines[0].startswith(":") and "retry: 2000" in lines[:3]
    assert "event: status" in lines and any(line.startswith("id: ") for line in lines)
    pings = [line for line in lines if line.startswith(": ping")]
    assert len(pings) >= 3, lines  # every 0.2 s over 1.5 s idle (sse-starlette's keep-alive comments)


def test_last_event_id_resumes_after_that_event(pinging):
    job = pinging.post("/v1/jobs", json=GOOD).json()["id"]
    pinging.post(f"/v1/jobs/{job}/cancel")
    with pinging.stream("GET", f"/v1/jobs/{job}/events/stream") as r:
        ids = [int(line[4:]) for line in r.iter_lines() if line.startswith("id: ")]
    assert len(ids) >= 2
    with pinging.stream("GET", f"/v1/jobs/{job}/events/stream", headers={"Last-Event-ID": str(ids[0])}) as r:
        assert [int(line[4:]) for line in r.iter_lines() if line.startswith("id: ")] == ids[1:]


class _Dropping(httpx.SyncByteStream):
    """A response body that sends ``chunks`` and then loses the connection (or ends cleanly)."""

    def __init__(self, chunks: list[str], drop: bool):
        self.chunks, self.drop = chunks, drop

    def __iter__(self):
        for chunk in self.chunks:
            yield chunk.encode()
        if self.drop:
            raise httpx.ReadError("connection reset by peer")


def _event(i: int, kind: str = "metrics") -> str:
    return f"id: {i}\nevent: {kind}\ndata: {json.dumps({'id': i, 'type': kind})}\n\n"


def test_the_client_reconnects_with_last_event_id_after_a_drop():
    seen_headers = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen_headers.append(request.headers.get("last-event-id"))
        sse = {"content-type": "text/event-stream"}
        if len(seen_headers) == 1:  # events 1, 2, then the connection breaks
            return httpx.Response(200, headers=sse, stream=_Dropping(["retry: 10\n\n", _event(1), _event(2)], True))
        if len(seen_headers) == 2:  # the server restarted: ends without `end` (its own timeout)
            return httpx.Response(200, headers=sse, stream=_Dropping([": ping\n\n", _event(3)], False))
        return httpx.Response(200, headers=sse, stream=_Dropping([_event(4, "status"), "event: end\ndata: {}\n\n"],
                                                                 False))

    c = Client("http://rlvr.test")
    c.http = httpx.Client(base_url="http://rlvr.test", transport=httpx.MockTransport(handler))
    events = list(c.stream_events("job-1", timeout=30))
    assert [e["id"] for e in events] == [1, 2, 3, 4]  # nothing lost, nothing repeated
    assert seen_headers == [None, "2", "3"]


def test_the_client_gives_up_after_repeated_drops_and_reports_http_errors():
    calls = []

    def dropping(request):
        calls.append(1)
        return httpx.Response(200, headers={"content-type": "text/event-stream"},
                              stream=_Dropping(["retry: 1\n\n"], True))

    c = Client("http://rlvr.test")
    c.http = httpx.Client(base_url="http://rlvr.test", transport=httpx.MockTransport(dropping))
    with pytest.raises(httpx.TransportError):
        list(c.stream_events("job-1", timeout=30, reconnects=3))
    assert len(calls) == 4
    c.http = httpx.Client(base_url="http://rlvr.test", transport=httpx.MockTransport(
        lambda r: httpx.Response(404, json={"detail": "job 'job-1' not found"})))
    with pytest.raises(APIError, match="not found"):
        list(c.stream_events("job-1", timeout=30))


def test_rlvr_logs_follow_reads_the_stream_to_its_end(tmp_path, models_dir):
    import os
    import subprocess
    import sys

    from tests.conftest import REPO, free_port, spawn, stop

    port = free_port()
    env = {"RLVR_HOME": str(tmp_path / "home"), "RLVR_MODELS": str(models_dir)}
    api = spawn(["service.cli", "serve", "--port", str(port)], env, tmp_path / "api.log")
    try:
        url = f"http://127.0.0.1:{port}"
        client = Client(url)
        client.wait_healthy(90)
        job = client.submit(GOOD)["id"]
        client.cancel(job)
        out = subprocess.run([sys.executable, "-m", "service.cli", "logs", job, "-f", "--url", url],
                             env={**os.environ, **env}, cwd=REPO, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        assert "cancelled" in out.stdout
    finally:
        stop(api)
