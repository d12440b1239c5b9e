"""Job lifecycle: every action in every state, and a real pause → resume → finish run."""
from __future__ import annotations

import threading

import pytest

from service.jobs.runner import execute_job
from tests.conftest import wait_for

SMALL = {"name": "life", "rollout": {"group_size": 4, "max_new_tokens": 12}, "data": {"eval_size": 10},
         "train": {"steps": 3, "prompts_per_step": 2, "eval_every": 0, "threads": 1}}


def submit(client, **over):
    r = client.post("/v1/jobs", json={**SMALL, **over})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def act(client, job_id, action):
    return client.post(f"/v1/jobs/{job_id}/{action}")


def test_queued_job_actions(client):
    job = submit(client)
    assert act(client, job, "resume").status_code == 409  # only paused jobs resume
    assert act(client, job, "pause").json()["status"] == "paused"
    assert act(client, job, "pause").status_code == 409
    assert act(client, job, "resume").json()["status"] == "queued"
    assert act(client, job, "cancel").json()["status"] == "cancelled"
    for action in ("cancel", "pause", "resume"):
        r = act(client, job, action)
        assert r.status_code == 409 and "cancelled" in r.json()["detail"]
    assert client.delete(f"/v1/jobs/{job}").status_code == 204
    assert client.get(f"/v1/jobs/{job}").status_code == 404
    assert act(client, "job-nope", "cancel").status_code == 404


def test_running_job_actions_are_requests(client, store):
    job = submit(client)
    assert store.claim(job, "w1", 60, "/tmp/x") is not None
    assert act(client, job, "resume").status_code == 409
    assert client.delete(f"/v1/jobs/{job}").status_code == 409
    assert act(client, job, "pause").json()["status"] == "running"
    assert store.heartbeat(job, "w1", 60) == "pause"  # the worker sees it at its next step
    assert act(client, job, "cancel").json()["status"] == "running"
    assert store.heartbeat(job, "w1", 60) == "cancel"
    types = [e["type"] for e in client.get(f"/v1/jobs/{job}/events").json()["data"]]
    assert types == ["status", "status", "pause_requested", "cancel_requested"]


def test_a_failing_job_ends_failed_with_its_message(client, store, settings, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "1+1", "reference": "2"}\n{"prompt": 3}\n')
    job = submit(client, data={"dataset": str(bad), "eval_size": 1})
    assert execute_job(job, settings, store) == "failed"
    body = client.get(f"/v1/jobs/{job}").json()
    assert body["status"] == "failed" and body["error"]["code"] == "DatasetError"
    assert "bad.jsonl:2" in body["error"]["message"]
    assert execute_job(job, settings, store) == "skipped"  # a redelivery of a finished job does nothing


def test_a_worker_that_errors_after_losing_its_lease_writes_nothing_and_says_so(client, store, settings,
                                                                              monkeypatch, caplog):
    # As on PostgreSQL when a frozen worker's session was ended by the server: it wakes to a database error,
    # and by then the job is someone else's. It must not mark the job failed, and its log must say why.
    import service.jobs.runner as runner
    from service.store.tables import Job

    job = submit(client)

    def train_then_lose(job_row, store_, settings_, rec):
        with store.Session.begin() as s:
            s.get(Job, job).lease_owner = "another-worker"  # the reaper re-queued it; another worker took it
        raise RuntimeError("terminating connection due to idle-in-transaction timeout")

    monkeypatch.setattr(runner, "_train", train_then_lose)
    with caplog.at_level("WARNING", logger=runner.log.name):
        assert execute_job(job, settings, store) == "lease_lost"
    assert any("no longer holds job" in r.getMessage() for r in caplog.records), caplog.text
    body = client.get(f"/v1/jobs/{job}").json()
    assert body["status"] == "running" and body["error"] is None  # left to the new owner


@pytest.mark.slow
def test_pause_checkpoints_then_resume_finishes_with_every_step_once(client, store, settings):
    job = submit(client, train={**SMALL["train"], "steps": 40})
    t = threading.Thread(target=execute_job, args=(job, settings, store))
    t.start()
    wait_for(lambda: client.get(f"/v1/jobs/{job}").json()["progress"]["step"] >= 3, 120, "a few steps")
    assert act(client, job, "pause").status_code == 200
    t.join(timeout=120)
    paused = client.get(f"/v1/jobs/{job}").json()
    assert paused["status"] == "paused", paused
    ckpts = client.get(f"/v1/jobs/{job}/checkpoints").json()
    assert ckpts and ckpts[-1]["step"] == paused["progress"]["step"] < 40
    assert act(client, job, "resume").json()["status"] == "queued"
    assert execute_job(job, settings, store) == "succeeded"
    done = client.get(f"/v1/jobs/{job}").json()
    assert done["status"] == "succeeded" and done["progress"]["step"] == 40 and done["attempts"] == 2
    steps = [p["step"] for p in client.get(f"/v1/jobs/{job}/metrics").json()["points"]]
    assert steps == list(range(0, 41))
    # checkpoints list and download; sampled rollouts with their verdicts
    names = [c["name"] for c in client.get(f"/v1/jobs/{job}/checkpoints").json()]
    assert names[-1] == "step-0000040"
    tar = client.get(f"/v1/jobs/{job}/checkpoints/step-0000040/download")
    assert tar.status_code == 200 and tar.headers["content-type"] == "application/x-tar"
    import io
    import tarfile

    members = tarfile.open(fileobj=io.BytesIO(tar.content)).getnames()
    assert "step-0000040/model.safetensors" in members and "step-0000040/tokenizer.json" in members
    ro = client.get(f"/v1/jobs/{job}/rollouts", params={"step": 5}).json()
    assert ro[0]["step"] == 5 and len(ro[0]["groups"][0]["completions"]) == 4
    assert ro[0]["groups"][0]["completions"][0]["verdicts"]["math"]["status"] in (
        "correct", "wrong", "unparseable")
    events = client.get(f"/v1/jobs/{job}/events", params={"limit": 1000}).json()["data"]
    kinds = {e["type"] for e in events}
    assert {"status", "metrics", "checkpoint", "pause_requested"} <= kinds


def test_a_job_whose_verifier_keeps_erroring_is_paused_with_an_event(client, store, settings):
    from verifiers import BaseVerifier, Status, Verdict, register
    from verifiers.registry import _registry

    class Broken(BaseVerifier):
        name, version, description = "broken-infra", "1", "always an infrastructure error"

        def verify(self, completion, reference):
            return Verdict(0.0, Status.error, "sandbox unreachable")

    if "broken-infra" not in _registry:
        register("broken-infra", Broken)
    job = submit(client, verifiers=[{"name": "math"}, {"name": "broken-infra", "weight": 0.0}],
                 train={**SMALL["train"], "steps": 20})
    assert execute_job(job, settings, store) == "paused"
    body = client.get(f"/v1/jobs/{job}").json()
    assert body["status"] == "paused" and body["progress"]["step"] < 20
    assert body["result"]["paused_for"] == ["verifier_errors"]
    warnings = [e for e in client.get(f"/v1/jobs/{job}/events", params={"limit": 1000}).json()["data"]
                if e["type"] == "warning"]
    assert any("broken-infra" in e["message"] and "pausing" in e["message"] for e in warnings)
    # and what the errors said, so the person reading it knows what to fix
    assert any("for example broken-infra: sandbox unreachable" in e["message"] for e in warnings)
    metrics = client.get(f"/v1/jobs/{job}/metrics").json()["points"][1]["metrics"]
    assert metrics["verifier/broken-infra/error_rate"] == 1.0 and "verifier/math/latency_p95_s" in metrics


def test_a_step_that_hangs_past_the_watchdog_fails_the_job(client, store, settings, monkeypatch):
    """Step 2 hangs (until the job is recorded failed, at most 60 s): the watchdog must fire while it hangs,
    whatever this machine's step time (the other steps take well under the timeout)."""
    from trainer import loop

    settings.step_timeout_s = 3.0
    job = submit(client, train={**SMALL["train"], "steps": 5})
    step, calls = loop.REGIMES["grpo"], []

    def hanging(ctx):
        calls.append(1)
        if len(calls) == 2:
            wait_for(lambda: client.get(f"/v1/jobs/{job}").json()["status"] == "failed", 60, "the watchdog")
        return step(ctx)

    monkeypatch.setitem(loop.REGIMES, "grpo", hanging)
    execute_job(job, settings, store)
    body = client.get(f"/v1/jobs/{job}").json()
    assert body["status"] == "failed" and body["error"]["code"] == "StepTimeout"
    assert "no training step finished within 3s" in body["error"]["message"]
    assert body["progress"]["step"] == 1 and len(calls) == 2  # nothing after the hung step


def test_the_watchdog_times_each_step_not_the_whole_job(client, store, settings):
    """Each recorded step restarts the watchdog's clock: a job whose steps come every 0.2 s outlives a 2 s
    step timeout twice over (before, the clock started with the job and never moved)."""
    import time

    from service.jobs.runner import Heartbeat, _Recorder

    job = submit(client)
    assert store.claim(job, "w1", 60, "/tmp/x") is not None
    hb = Heartbeat(store, job, "w1", lease_s=60, step_timeout_s=2.0)
    hb.start()
    rec = _Recorder(store, job, "w1", hb, settings.runs_dir / job, settings)
    try:
        for step in range(25):  # 5 s
            rec.on_step(step, {"loss": 0.0})
            time.sleep(0.2)
        assert not hb.lost and client.get(f"/v1/jobs/{job}").json()["status"] == "running"
    finally:
        hb.stopped.set()
