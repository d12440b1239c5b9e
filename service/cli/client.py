"""A small Python client for the rlvr HTTP API (used by the CLI and the demo)."""
from __future__ import annotations

import time
from typing import Any

import httpx


class APIError(RuntimeError):
    def __init__(self, status: int, detail: Any):
        super().__init__(f"HTTP {status}: {detail}")
        self.status, self.detail = status, detail


class Client:
    def __init__(self, base_url: str = "http://127.0.0.1:8000", api_key: str | None = None, timeout: float = 30.0):
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(base_url=base_url, headers=headers, timeout=timeout)

    def _json(self, r: httpx.Response) -> Any:
        if r.status_code >= 400:
            try:  # native routes answer {"detail": …}; the OpenAI-shaped ones (/v1/files…) {"error": {…}}
                body = r.json()
                detail = body["detail"] if "detail" in body else (body.get("error") or {}).get("message", r.text)
            except (ValueError, AttributeError, TypeError):
                detail = r.text
            raise APIError(r.status_code, detail)
        return r.json()

    def health(self) -> dict:
        return self._json(self.http.get("/healthz"))

    def wait_healthy(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.health()
                return
            except (httpx.HTTPError, APIError):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"service at {self.http.base_url} not healthy after {timeout:.0f}s")
                time.sleep(0.2)

    def submit(self, spec: dict) -> dict:
        return self._json(self.http.post("/v1/jobs", json=spec))

    def job(self, job_id: str) -> dict:
        return self._json(self.http.get(f"/v1/jobs/{job_id}"))

    def jobs(self, status: str | None = None) -> list[dict]:
        return self._json(self.http.get("/v1/jobs", params={"status": status} if status else None))["data"]

    def metrics(self, job_id: str, keys: list[str] | None = None, after: int = -1) -> list[dict]:
        params: dict[str, Any] = {"after": after}
        if keys:
            params["keys"] = ",".join(keys)
        return self._json(self.http.get(f"/v1/jobs/{job_id}/metrics", params=params))["points"]

    def action(self, job_id: str, action: str) -> dict:
        return self._json(self.http.post(f"/v1/jobs/{job_id}/{action}"))

    def cancel(self, job_id: str) -> dict:
        return self.action(job_id, "cancel")

    def pause(self, job_id: str) -> dict:
        return self.action(job_id, "pause")

    def resume(self, job_id: str) -> dict:
        return self.action(job_id, "resume")

    def delete(self, job_id: str) -> None:
        r = self.http.delete(f"/v1/jobs/{job_id}")
        if r.status_code >= 400:
            self._json(r)

    def events(self, job_id: str, after: int = 0, limit: int = 100) -> dict:
        return self._json(self.http.get(f"/v1/jobs/{job_id}/events", params={"after": after, "limit": limit}))

    def checkpoints(self, job_id: str) -> list[dict]:
        return self._json(self.http.get(f"/v1/jobs/{job_id}/checkpoints"))

    def rollouts(self, job_id: str, step: int | None = None) -> list[dict]:
        return self._json(self.http.get(f"/v1/jobs/{job_id}/rollouts", params={"step": step} if step else None))

    def upload(self, path: str, purpose: str = "fine-tune") -> dict:
        with open(path, "rb") as f:
            return self._json(self.http.post("/v1/files", files={"file": (path.rsplit("/", 1)[-1], f)},
                                             data={"purpose": purpose}))

    def stream_events(self, job_id: str, after: int = 0, timeout: float = 3600.0, reconnects: int = 20):
        """Yield events from the SSE stream until the job ends (or ``timeout`` seconds pass). A dropped
        connection is resumed where it broke: after the stream's ``retry:`` delay, with ``Last-Event-ID``
        set to the last event seen (at most ``reconnects`` times in a row without an event in between)."""
        import json

        from httpx_sse import connect_sse

        deadline, last, wait_s, failures = time.monotonic() + timeout, after, 1.0, 0
        while (remaining := deadline - time.monotonic()) > 0:
            headers = {"Last-Event-ID": str(last)} if last else {}
            try:
                with connect_sse(self.http, "GET", f"/v1/jobs/{job_id}/events/stream", headers=headers,
                                 params={"after": after, "timeout": max(1.0, remaining)},
                                 timeout=httpx.Timeout(30.0, read=60.0)) as source:
                    if source.response.status_code >= 400:
                        source.response.read()
                        self._json(source.response)
                    for sse in source.iter_sse():
                        if sse.retry is not None:
                            wait_s = sse.retry / 1000
                        if sse.event == "end":
                            return
                        if sse.id:
                            last, failures = int(sse.id), 0
                        if sse.data:
                            yield json.loads(sse.data)
            except httpx.TransportError:  # the connection dropped (server restart, proxy, network)
                failures += 1
                if failures > reconnects:
                    raise
            # the stream closed without an `end` (its own timeout, a restart): reconnect after `retry`
            time.sleep(max(0.0, min(wait_s, deadline - time.monotonic())))

    def wait(self, job_id: str, timeout: float = 3600.0, poll: float = 0.5) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            job = self.job(job_id)
            if job["status"] in ("succeeded", "failed", "cancelled", "paused"):
                return job
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} still {job['status']} after {timeout:.0f}s")
            time.sleep(poll)
