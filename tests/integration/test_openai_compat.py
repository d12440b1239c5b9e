"""OpenAI's own Python client against rlvr's OpenAI-compatible RFT endpoints (a real server, auth on)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import openai
import pytest

from tests.conftest import REPO, free_port, spawn, stop, wait_for

pytestmark = pytest.mark.slow
GRADER = {"type": "string_check", "name": "exact", "input": "{{sample.output_text}}",
          "reference": "{{item.answer}}", "operation": "eq"}


@pytest.fixture
def server(tmp_path, models_dir):
    env = {"RLVR_HOME": str(tmp_path / "home"), "RLVR_MODELS": str(models_dir), "RLVR_AUTH": "true",
           "RLVR_ADMIN_KEY": "admin-secret-key"}
    keys = {}
    for tenant in ("acme", "other"):  # the CLI works on the store directly: no server needed
        out = subprocess.run([sys.executable, "-m", "service.cli", "keys", "create", "--tenant", tenant],
                             env={**os.environ, **env}, cwd=REPO, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        keys[tenant] = out.stdout.strip().splitlines()[-1]
        assert keys[tenant].startswith("rlvr_")
    port = free_port()
    api = spawn(["service.cli", "serve", "--port", str(port)], env, tmp_path / "api.log")
    base = f"http://127.0.0.1:{port}/v1"
    import httpx

    wait_for(lambda: _up(httpx, port), 60, "the API")
    try:
        yield base, keys
    finally:
        stop(api)


def _up(httpx, port):
    try:
        return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_openai_client_upload_create_events_cancel(server, tmp_path):
    base, keys = server
    client = openai.OpenAI(base_url=base, api_key=keys["acme"], max_retries=0, timeout=30)
    data = tmp_path / "rft.jsonl"
    data.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"{a}+{a}"}], "answer": str(2 * a)})
                            + "\n" for a in range(20)))
    f = client.files.create(file=data.open("rb"), purpose="fine-tune")
    assert f.id.startswith("file-") and f.bytes == data.stat().st_size and f.filename == "rft.jsonl"
    job = client.fine_tuning.jobs.create(
        model="builtin:tiny-arith", training_file=f.id, seed=3, metadata={"team": "math"},
        method={"type": "reinforcement", "reinforcement": {
            "grader": GRADER, "hyperparameters": {"n_epochs": 2, "batch_size": 4, "compute_multiplier": 2}}})
    assert job.status == "queued" and job.object == "fine_tuning.job" and job.training_file == f.id
    assert job.hyperparameters.batch_size == 4 and job.method.type == "reinforcement"
    assert client.fine_tuning.jobs.retrieve(job.id).id == job.id
    assert job.id in [j.id for j in client.fine_tuning.jobs.list()]
    # the mapping onto rlvr: 2 epochs × 20 rows / 4 per step = 10 steps; G = 8 × 2
    import httpx

    native = httpx.get(f"{base}/jobs/{job.id}", headers={"Authorization": f"Bearer {keys['acme']}"}).json()
    assert native["spec"]["train"]["steps"] == 10 and native["spec"]["rollout"]["group_size"] == 16
    assert native["spec"]["verifiers"][0]["name"] == "string_check"
    events = list(client.fine_tuning.jobs.list_events(job.id))
    assert events and events[-1].message == "queued"
    cancelled = client.fine_tuning.jobs.cancel(job.id)
    assert cancelled.status == "cancelled"
    assert "cancelled by user" in [e.message for e in client.fine_tuning.jobs.list_events(job.id)]
    assert list(client.fine_tuning.jobs.checkpoints.list(job.id)) == []

    # tenancy and auth
    other = openai.OpenAI(base_url=base, api_key=keys["other"], max_retries=0)
    with pytest.raises(openai.NotFoundError):
        other.fine_tuning.jobs.retrieve(job.id)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=base, api_key="rlvr_wrong", max_retries=0).fine_tuning.jobs.list()


def test_unsupported_fields_are_clear_400s(server, tmp_path):
    base, keys = server
    client = openai.OpenAI(base_url=base, api_key=keys["acme"], max_retries=0)
    data = tmp_path / "rft.jsonl"
    data.write_text(json.dumps({"messages": [{"role": "user", "content": "1+1"}], "answer": "2"}) + "\n")
    fid = client.files.create(file=data.open("rb"), purpose="fine-tune").id
    cases = [
        ({"method": {"type": "supervised"}}, "method.type"),
        ({"method": {"type": "reinforcement", "reinforcement": {"grader": {"type": "score_model"}}}},
         "method.reinforcement.grader.type"),
        ({"method": {"type": "reinforcement", "reinforcement": {"grader": {**GRADER, "reference": "{{item.nope}}"}}}},
         "training_file"),
        ({"method": {"type": "reinforcement", "reinforcement": {"grader": GRADER,
                                                                 "hyperparameters": {"warp_factor": 9}}}},
         "method.reinforcement.hyperparameters.warp_factor"),
    ]
    for extra, param in cases:
        with pytest.raises(openai.BadRequestError) as e:
            client.fine_tuning.jobs.create(model="builtin:tiny-arith", training_file=fid, **extra)
        assert e.value.body["param"] == param, e.value.body
    with pytest.raises(openai.BadRequestError):
        client.fine_tuning.jobs.create(model="builtin:tiny-arith", training_file=fid,
                                       extra_body={"warp_drive": True}, method={"type": "reinforcement"})


def test_grader_run_maps_onto_the_dry_run(server):
    base, keys = server
    client = openai.OpenAI(base_url=base, api_key=keys["acme"], max_retries=0)
    ok = client.fine_tuning.alpha.graders.run(grader=GRADER, model_sample="4", item={"answer": "4"})
    assert ok.reward == 1.0 and ok.metadata.type == "string_check"
    bad = client.fine_tuning.alpha.graders.run(grader=GRADER, model_sample="5", item={"answer": "4"})
    assert bad.reward == 0.0
    multi = {"type": "multi", "graders": {
        "exact": GRADER,
        "close": {"type": "text_similarity", "name": "close", "input": "{{sample.output_text}}",
                  "reference": "{{item.answer}}", "evaluation_metric": "fuzzy_match"}},
        "calculate_output": "0.5 * exact + 0.5 * close"}
    r = client.fine_tuning.alpha.graders.run(grader=multi, model_sample="the answer 42", item={"answer": "42"})
    assert 0.0 < r.reward < 0.5
    math = client.fine_tuning.alpha.graders.run(grader={"type": "math", "reference": "{{item.answer}}"},
                                                model_sample="so \\boxed{\\frac{1}{2}}", item={"answer": "0.5"})
    assert math.reward == 1.0
