"""Real processes for fault injection: a private redis-server on a side port, the API, workers."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import httpx

from tests.conftest import free_port, spawn, stop, wait_for

FAST_LEASES = {  # seconds, so a lost worker is noticed within a test's patience
    "RLVR_LEASE_S": "6", "RLVR_REAPER_INTERVAL_S": "0.5", "RLVR_REQUEUE_QUEUED_AFTER_S": "8",
    "RLVR_WORKER_THREADS": "1",
}


class Cluster:
    def __init__(self, tmp: Path, models_dir: Path, db_url: str | None = None):
        self.tmp = tmp
        self.redis_port = free_port()
        self.api_port = free_port()
        self.env = {"RLVR_HOME": str(tmp / "home"), "RLVR_MODELS": str(models_dir),
                    "RLVR_BROKER_URL": f"redis://127.0.0.1:{self.redis_port}/0", **FAST_LEASES}
        if db_url:
            self.env["RLVR_DATABASE_URL"] = db_url
        self.redis: subprocess.Popen | None = None
        self.api: subprocess.Popen | None = None
        self.workers: list[subprocess.Popen] = []
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{self.api_port}", timeout=10)

    # ---------------------------------------------------------------- processes
    def start_redis(self) -> None:
        self.redis = subprocess.Popen(
            ["redis-server", "--port", str(self.redis_port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.tmp)],
            stdout=open(self.tmp / "redis.log", "ab"), stderr=subprocess.STDOUT, start_new_session=True)
        import redis

        wait_for(lambda: _ping(redis, self.redis_port), 20, "redis-server")

    def kill_redis(self) -> None:
        os.killpg(self.redis.pid, signal.SIGKILL)
        self.redis.wait(timeout=10)

    def start_api(self) -> None:
        # free_port() only found the port free: a client's ephemeral port (Redis connections come from the same
        # range) can take it before the API binds. The API then exits at once; it gets a fresh port, twice at most.
        for attempt in range(3):
            self.api = spawn(["service.cli", "serve", "--port", str(self.api_port)], self.env,
                             self.tmp / f"api-{time.monotonic_ns()}.log")
            if wait_for(lambda: self._healthy() or (self.api.poll() is not None and "exited"), 60, "the API") is True:
                return
            if attempt < 2:
                self.api_port = free_port()
                self.http = httpx.Client(base_url=f"http://127.0.0.1:{self.api_port}", timeout=10)
        raise RuntimeError(f"the API exited with {self.api.returncode} three times: see {self.tmp}/api-*.log")

    def start_worker(self, queue: str = "train", concurrency: int = 1, env: dict | None = None) -> subprocess.Popen:
        w = spawn(["service.cli", "worker", "--pool", "prefork", "--concurrency", str(concurrency), "--queue", queue],
                  {**self.env, **(env or {})}, self.tmp / f"worker-{len(self.workers)}.log")
        self.workers.append(w)
        return w

    def signal(self, proc: subprocess.Popen, sig: int) -> None:
        os.killpg(proc.pid, sig)  # the whole group: the Celery parent and its pool child

    def close(self) -> None:
        self.http.close()
        for w in self.workers:
            try:
                os.killpg(w.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
            stop(w)
        for p in (self.api, self.redis):
            if p is not None:
                stop(p)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-2500:]}" for p in sorted(self.tmp.glob("*.log")))

    # ---------------------------------------------------------------- API
    def _healthy(self) -> bool:
        try:
            return self.http.get("/healthz").status_code == 200
        except httpx.HTTPError:
            return False

    def submit(self, spec: dict) -> str:
        r = self.http.post("/v1/jobs", json=spec)
        assert r.status_code == 201, r.text
        return r.json()["id"]

    def job(self, job_id: str) -> dict:
        return self.http.get(f"/v1/jobs/{job_id}").json()

    def wait_step(self, job_id: str, step: int, timeout: float = 120) -> None:
        wait_for(lambda: self.job(job_id)["progress"]["step"] >= step, timeout, f"{job_id} step {step}")

    def wait_done(self, job_id: str, timeout: float = 300) -> dict:
        def done():
            j = self.job(job_id)
            return j if j["status"] in ("succeeded", "failed", "cancelled") else None

        try:
            return wait_for(done, timeout, f"{job_id} to finish", interval=0.5)
        except TimeoutError as e:
            raise TimeoutError(f"{e}\n{self.logs()}") from None

    def metrics(self, job_id: str) -> list[dict]:
        return self.http.get(f"/v1/jobs/{job_id}/metrics").json()["points"]

    def events(self, job_id: str) -> list[dict]:
        return self.http.get(f"/v1/jobs/{job_id}/events", params={"limit": 1000}).json()["data"]


def _ping(redis, port: int) -> bool:
    try:
        return redis.Redis(port=port, socket_timeout=1).ping()
    except Exception:
        return False
