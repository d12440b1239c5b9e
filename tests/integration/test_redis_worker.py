"""The distributed path for real: uvicorn API + Celery prefork worker + the Redis on 127.0.0.1:6379
+ the PostgreSQL on 127.0.0.1:5432 (a fresh database per test)."""
from __future__ import annotations

import json
import uuid

import httpx
import pytest
import redis

from tests.conftest import free_port, spawn, stop, wait_for

pytestmark = [pytest.mark.redis, pytest.mark.postgres, pytest.mark.slow]
REDIS = "redis://127.0.0.1:6379/9"


@pytest.fixture
def stack(tmp_path, models_dir, pg_url):
    redis.Redis.from_url(REDIS, socket_timeout=5).ping()  # CI starts Redis; a missing one is a failure
    port = free_port()
    env = {"RLVR_HOME": str(tmp_path / "home"), "RLVR_MODELS": str(models_dir), "RLVR_BROKER_URL": REDIS,
           "RLVR_DATABASE_URL": pg_url,
           "RLVR_TRAIN_QUEUE": f"test-{uuid.uuid4().hex[:8]}", "RLVR_WORKER_THREADS": "1"}
    api = spawn(["service.cli", "serve", "--port", str(port)], env, tmp_path / "api.log")
    worker = spawn(["service.cli", "worker", "--pool", "prefork", "--concurrency", "1"], env, tmp_path / "worker.log")
    http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10)

    def healthy():
        try:
            return http.get("/healthz").status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(healthy, 60, "the API to come up")
        yield http, tmp_path
    finally:
        http.close()
        stop(worker)
        stop(api)


def _cli(args: list[str]) -> str:
    import subprocess
    import sys

    from tests.conftest import REPO

    out = subprocess.run([sys.executable, "-m", "service.cli", *args], cwd=REPO, capture_output=True, text=True,
                         timeout=120, env={**__import__("os").environ, "COLUMNS": "200"})
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def wait_done(http, job_id, timeout=300):
    def done():
        job = http.get(f"/v1/jobs/{job_id}").json()
        return job if job["status"] in ("succeeded", "failed", "cancelled") else None

    return wait_for(done, timeout, f"job {job_id} to finish", interval=0.5)


def test_job_runs_on_a_real_worker_through_redis(stack):
    http, tmp = stack
    spec = {"name": "redis-e2e", "rollout": {"group_size": 4, "max_new_tokens": 12},
            "data": {"eval_size": 20}, "train": {"steps": 3, "prompts_per_step": 4, "eval_every": 0}}
    r = http.post("/v1/jobs", json=spec)
    assert r.status_code == 201, r.text
    job = wait_done(http, r.json()["id"])
    assert job["status"] == "succeeded", (job, (tmp / "worker.log").read_text()[-3000:])
    assert job["progress"]["step"] == 3 and job["result"]["accuracy_before"] is not None
    pts = http.get(f"/v1/jobs/{job['id']}/metrics").json()["points"]
    assert [p["step"] for p in pts] == [0, 1, 2, 3]
    assert 0.0 <= pts[-1]["metrics"]["reward/mean"] <= 1.0
    assert "eval/accuracy" in pts[0]["metrics"] and "eval/accuracy" in pts[-1]["metrics"]
    assert pts[-1]["metrics"]["checkpoint"] == "step-0000003"

    # the CLI against the same server: status, checkpoints, logs -f (follows SSE until the job ends)
    url = str(http.base_url).rstrip("/")
    status = _cli(["status", job["id"], "--url", url])
    assert json.loads(status)["status"] == "succeeded"
    assert "step-0000003" in _cli(["checkpoints", job["id"], "--url", url])
    logs = _cli(["logs", job["id"], "--follow", "--url", url])
    assert "succeeded" in logs and "checkpoint" in logs

    # a job whose worker raises ends `failed` with its message stored
    bad = tmp / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "1+1", "reference": "2"}) + "\n{not json\n")
    r = http.post("/v1/jobs", json={**spec, "name": "bad-data", "data": {"dataset": str(bad), "eval_size": 1}})
    assert r.status_code == 201, r.text
    job = wait_done(http, r.json()["id"])
    assert job["status"] == "failed"
    assert job["error"]["code"] == "DatasetError" and "bad.jsonl:2" in job["error"]["message"]
