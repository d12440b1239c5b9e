"""OpenAI's own Python client against rlvr's OpenAI-compatible endpoints (a real server, auth on): files, jobs,
events, checkpoints, pause/resume/cancel, graders and models — and the errors of each in OpenAI's shape."""
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
def server(tmp_path, models_dir, tiny_model):
    from tests.hub_cache import add_to_cache

    add_to_cache(tmp_path / "hf" / "hub", "rlvr-test/tiny-arith", tiny_model)  # a Hub id, offline
    env = {"RLVR_HOME": str(tmp_path / "home"), "RLVR_MODELS": str(models_dir), "RLVR_AUTH": "true",
           "RLVR_ADMIN_KEY": "admin-secret-key", "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
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
        # parameters OpenAI has and we cannot honour: refused by name, never silently ignored
        ({"method": {"type": "reinforcement", "reinforcement": {"grader": GRADER,
                                                                 "hyperparameters": {"eval_samples": 4}}}},
         "method.reinforcement.hyperparameters.eval_samples"),
        ({"method": {"type": "reinforcement", "reinforcement": {"grader": GRADER,
                                                                 "hyperparameters": {"reasoning_effort": "high"}}}},
         "method.reinforcement.hyperparameters.reasoning_effort"),
        ({"integrations": [{"type": "wandb", "wandb": {"project": "p"}}], "method": {
            "type": "reinforcement", "reinforcement": {"grader": GRADER}}}, "integrations"),
        ({"model": "no-such-model", "method": {"type": "reinforcement", "reinforcement": {"grader": GRADER}}},
         "model"),
    ]
    for extra, param in cases:
        with pytest.raises(openai.BadRequestError) as e:
            client.fine_tuning.jobs.create(**{"model": "builtin:tiny-arith", "training_file": fid, **extra})
        assert e.value.body["param"] == param, e.value.body
        assert e.value.body["type"] == "invalid_request_error" and e.value.body["message"]
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


def test_files_jobs_checkpoints_and_models_through_the_openai_client(server, tmp_path, models_dir):
    """The whole surface a script written for OpenAI calls, with a job trained for real in between."""
    import httpx

    from service.jobs.runner import execute_job
    from service.settings import Settings
    from service.store.jobs import Store

    base, keys = server
    client = openai.OpenAI(base_url=base, api_key=keys["acme"], max_retries=0, timeout=60)
    other = openai.OpenAI(base_url=base, api_key=keys["other"], max_retries=0, timeout=60)
    data = tmp_path / "rft.jsonl"
    data.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"{a}+1"}], "answer": str(a + 1)})
                            + "\n" for a in range(8)))
    # files: create, list, retrieve, content, delete — and a missing one is OpenAI's 404
    f = client.files.create(file=data.open("rb"), purpose="fine-tune")
    assert f.id in [x.id for x in client.files.list()]
    assert client.files.retrieve(f.id).filename == "rft.jsonl"
    assert client.files.content(f.id).read() == data.read_bytes()
    with pytest.raises(openai.NotFoundError) as e:
        other.files.retrieve(f.id)  # another tenant's file: as missing as none
    assert e.value.body["param"] == "id" and e.value.body["message"] == f"No such File object: {f.id}"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": "not a list"}\n[1]\n')
    with pytest.raises(openai.BadRequestError) as e:
        client.files.create(file=bad.open("rb"), purpose="fine-tune")
    assert e.value.body["param"] == "file" and "line 2" in e.value.body["message"]

    # jobs: create (suffix, metadata), list filtered by metadata, events; pause/resume/cancel another one
    method = {"type": "reinforcement", "reinforcement": {"grader": GRADER, "hyperparameters": {
        "n_epochs": 1, "batch_size": 4, "compute_multiplier": 0.25, "eval_interval": 0}}}
    job = client.fine_tuning.jobs.create(model="builtin:tiny-arith", training_file=f.id, suffix="arith",
                                         metadata={"team": "math"}, method=method)
    spare = client.fine_tuning.jobs.create(model="rlvr-test/tiny-arith", training_file=f.id, method=method)
    assert [j.id for j in client.fine_tuning.jobs.list(metadata={"team": "math"})] == [job.id]
    assert client.fine_tuning.jobs.pause(spare.id).status == "paused"
    assert client.fine_tuning.jobs.resume(spare.id).status == "queued"
    assert client.fine_tuning.jobs.cancel(spare.id).status == "cancelled"
    with pytest.raises(openai.BadRequestError):
        client.fine_tuning.jobs.resume(spare.id)  # an illegal transition: OpenAI's 400
    with pytest.raises(openai.NotFoundError) as e:
        client.fine_tuning.jobs.retrieve("ftjob-does-not-exist")
    assert e.value.body["code"] == "job_not_found"

    # train it for real (a worker's work, here in-process on the server's store)
    settings = Settings(home=tmp_path / "home", models=models_dir)
    assert execute_job(job.id, settings, Store(settings.db_url)) == "succeeded"
    done = client.fine_tuning.jobs.retrieve(job.id)
    assert done.status == "succeeded" and done.fine_tuned_model == f"ft:builtin:tiny-arith:arith:{job.id}"
    messages = [e.message for e in client.fine_tuning.jobs.list_events(job.id, limit=100)]
    assert "succeeded" in messages and "queued" in messages
    checkpoints = list(client.fine_tuning.jobs.checkpoints.list(job.id))
    assert checkpoints and checkpoints[0].fine_tuning_job_id == job.id and checkpoints[0].step_number == 2
    assert checkpoints[0].fine_tuned_model_checkpoint.startswith(f"/v1/jobs/{job.id}/checkpoints/")

    # models: list, retrieve (ids with ':' and '/'), the fine-tuned one trains a new job; other tenants see none
    ids = {m.id: m for m in client.models.list()}
    assert {"builtin:tiny-arith", "rlvr-test/tiny-arith", done.fine_tuned_model} <= set(ids)
    ft = client.models.retrieve(done.fine_tuned_model)
    assert ft.object == "model" and ft.owned_by == "acme" and ft.created > 0
    assert client.models.retrieve("rlvr-test/tiny-arith").owned_by == "rlvr-test"
    tar = httpx.get(base.removesuffix("/v1") + ft.download_url, headers={"Authorization": f"Bearer {keys['acme']}"})
    assert tar.status_code == 200 and tar.headers["content-type"] == "application/x-tar"
    child = client.fine_tuning.jobs.create(model=done.fine_tuned_model, training_file=f.id, method=method)
    assert child.status == "queued" and child.model == done.fine_tuned_model
    assert done.fine_tuned_model not in [m.id for m in other.models.list()]
    with pytest.raises(openai.NotFoundError) as e:
        other.models.retrieve(done.fine_tuned_model)
    assert e.value.body["code"] == "model_not_found"
    own = other.files.create(file=data.open("rb"), purpose="fine-tune")
    with pytest.raises(openai.BadRequestError) as e:
        other.fine_tuning.jobs.create(model=done.fine_tuned_model, training_file=own.id, method=method)
    assert e.value.body["param"] == "model" and "not found" in e.value.body["message"]
    with pytest.raises(openai.APIStatusError) as e:
        client.models.delete(done.fine_tuned_model)  # not offered: delete the job instead
    assert e.value.status_code == 405 and e.value.body["type"] == "invalid_request_error"

    # graders: validate, and an invalid one is a 400 naming it
    assert client.fine_tuning.alpha.graders.validate(grader=GRADER).grader.type == "string_check"
    with pytest.raises(openai.BadRequestError) as e:
        client.fine_tuning.alpha.graders.validate(grader={**GRADER, "operation": "regex"})
    assert e.value.body["param"].startswith("grader")
    assert client.files.delete(f.id).deleted
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(f.id)
