"""No path oracle, no server paths: a refused server path and a missing one get one identical answer, and
no response of a full job lifecycle (native and OpenAI-shaped, succeeded and failed) carries an absolute
server path — checkpoints, run dirs and files are named or given as URLs, fine_tuned_model is a model id."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from service.access.keys import create_key
from service.app import create_app
from service.jobs.files import get_file
from service.jobs.runner import execute_job
from service.settings import Settings
from tests.conftest import REPO

SMALL = {"name": "paths", "rollout": {"group_size": 4, "max_new_tokens": 8}, "data": {"eval_size": 4},
         "train": {"steps": 2, "prompts_per_step": 2, "eval_every": 0, "checkpoint_every": 1, "threads": 1}}
ROWS = "".join(json.dumps({"prompt": f"{a}+{a}", "reference": str(2 * a)}) + "\n" for a in range(12))
ABSOLUTE = re.compile(r"(?<![\w:/.~-])/(home|root|tmp|work|usr|etc|var|opt|srv|mnt|proc|run|private|Users)(/|\b)")


@pytest.fixture
def tenant(tmp_path, models_dir):
    settings = Settings(home=tmp_path / "home", models=models_dir, auth=True, admin_key="paths-admin-key-xyz")
    app = create_app(settings, reaper=False)
    headers = {"Authorization": "Bearer " + create_key(app.state.store, "acme")}
    with TestClient(app, headers=headers) as c:
        yield c, app, settings


def _same_answer(responses: dict[str, object]) -> None:
    """Every response the same, once the value the caller sent is masked."""
    masked = {v: r.text.replace(json.dumps(v)[1:-1], "VALUE").replace(repr(v), "'VALUE'") for v, r in responses.items()}
    assert len({r.status_code for r in responses.values()}) == 1, {v: r.status_code for v, r in responses.items()}
    assert len(set(masked.values())) == 1, masked


def test_refused_and_missing_server_paths_get_one_identical_answer(tenant, models_dir):
    c, _, settings = tenant
    existing_dir, existing_file = str(models_dir / "tiny-arith"), str(REPO / "README.md")
    probes = [existing_dir, "/etc", "/no/such/dir", "../../etc", "tiny-arith/../../../etc", "/root", existing_file,
              "~root", "no-such-model"]
    for field, make in [("model", lambda v: {"model": {"path": v}}),
                        ("critic", lambda v: {"algorithm": "ppo", "ppo": {"critic": v}})]:
        answers = {v: c.post("/v1/jobs", json={**SMALL, **make(v)}) for v in probes}
        assert all(r.status_code == 422 for r in answers.values()), field
        _same_answer(answers)
    for make in [lambda v: {"data": {"dataset": v}}, lambda v: {"data": {"eval_dataset": v}},
                 lambda v: {"algorithm": "dpo", "dpo": {"pairs": v}}]:
        _same_answer({v: c.post("/v1/jobs", json={**SMALL, **make(v)}) for v in
                      [existing_file, "/etc/passwd", "/no/such.jsonl", "../x.jsonl",
                       str(settings.home_dir / "rlvr.db")]})
    # by name, a model in the models directory is fine
    assert c.post("/v1/jobs", json={**SMALL, "model": {"path": "tiny-arith"}}).status_code == 201


def _strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(k)
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def _assert_no_server_paths(label: str, text: str, roots: list[str]) -> None:
    try:
        strings = list(_strings(json.loads(text)))
    except ValueError:
        strings = [text]  # SSE, Prometheus text
    for s in strings:
        for root in roots:
            assert root not in s, (label, root, s[:300])
        assert not ABSOLUTE.search(s), (label, s[:300])


def test_no_response_of_a_job_lifecycle_carries_a_server_path(tenant, models_dir, tmp_path):
    c, app, settings = tenant
    store = app.state.store
    seen: dict[str, str] = {}

    def get(label, path, **kw):
        r = c.get(path, **kw)
        assert r.status_code < 400, (label, r.status_code, r.text[:300])
        seen[label] = r.text
        return r

    up = c.post("/v1/files", files={"file": ("arith.jsonl", ROWS.encode())})
    assert up.status_code == 201
    seen["upload"] = up.text
    fid = up.json()["id"]
    job = c.post("/v1/jobs", json={**SMALL, "data": {"dataset": fid, "eval_size": 4}})
    assert job.status_code == 201, job.text
    seen["create"] = job.text
    jid = job.json()["id"]
    oa_rows = "".join(json.dumps({"messages": [{"role": "user", "content": f"{a}+1"}], "answer": str(a + 1)}) + "\n"
                      for a in range(8))
    ofid = c.post("/v1/files", files={"file": ("rft.jsonl", oa_rows.encode())}).json()["id"]
    ft = c.post("/v1/fine_tuning/jobs", json={
        "model": "tiny-arith", "training_file": ofid, "method": {"type": "reinforcement", "reinforcement": {
            "grader": {"type": "string_check", "input": "{{sample.output_text}}", "reference": "{{item.answer}}"},
            "hyperparameters": {"batch_size": 4, "n_epochs": 1, "compute_multiplier": 0.5}}}})
    assert ft.status_code == 200, ft.text
    seen["ft create"] = ft.text
    ftid = ft.json()["id"]
    assert execute_job(jid, settings, store) == "succeeded"
    assert execute_job(ftid, settings, store) == "succeeded"
    # a job whose dataset vanished from disk: its error message must not say where it was
    bad = c.post("/v1/jobs", json={**SMALL, "data": {"dataset": fid}}).json()["id"]
    Path(get_file(store, fid, None).path).unlink()
    assert execute_job(bad, settings, store) == "failed"
    assert store.get_job(bad).error_message

    for label, path in [("jobs", "/v1/jobs"), ("job", f"/v1/jobs/{jid}"), ("failed job", f"/v1/jobs/{bad}"),
                        ("metrics", f"/v1/jobs/{jid}/metrics"), ("events", f"/v1/jobs/{jid}/events"),
                        ("failed events", f"/v1/jobs/{bad}/events"), ("checkpoints", f"/v1/jobs/{jid}/checkpoints"),
                        ("rollouts", f"/v1/jobs/{jid}/rollouts"), ("files", "/v1/files"), ("file", f"/v1/files/{ofid}"),
                        ("ft list", "/v1/fine_tuning/jobs"), ("ft job", f"/v1/fine_tuning/jobs/{ftid}"),
                        ("ft native", f"/v1/fine_tuning/jobs/{jid}"), ("ft failed", f"/v1/fine_tuning/jobs/{bad}"),
                        ("ft events", f"/v1/fine_tuning/jobs/{jid}/events"),
                        ("ft checkpoints", f"/v1/fine_tuning/jobs/{jid}/checkpoints"),
                        ("ft own checkpoints", f"/v1/fine_tuning/jobs/{ftid}/checkpoints"),
                        ("verifiers", "/v1/verifiers"), ("prometheus", "/metrics")]:
        get(label, path)
    with c.stream("GET", f"/v1/jobs/{jid}/events/stream", params={"timeout": 10}) as r:
        seen["sse"] = "\n".join(r.iter_lines())
    # what replaced the paths: names and URLs that work
    result = json.loads(seen["job"])["result"]
    ckpts = json.loads(seen["checkpoints"])
    assert result["checkpoint"] == ckpts[-1]["name"]
    ft_job = json.loads(seen["ft native"])
    assert ft_job["fine_tuned_model"] == f"ft:builtin:tiny-arith:{jid}"  # a model id, not a path
    assert json.loads(seen["ft job"])["fine_tuned_model"] == f"ft:tiny-arith:{ftid}"
    for entry in json.loads(seen["ft checkpoints"])["data"]:
        assert c.get(entry["fine_tuned_model_checkpoint"]).status_code == 200
    model = get("model", f"/v1/models/{ft_job['fine_tuned_model']}").json()
    get("models", "/v1/models")
    assert model["download_url"] == f"/v1/jobs/{jid}/checkpoints/{result['checkpoint']}/download"
    assert c.get(model["download_url"]).headers["content-type"] == "application/x-tar"

    roots = [str(settings.home_dir), str(models_dir), str(REPO), str(tmp_path), str(Path.home())]
    assert len(seen) > 20
    for label, text in seen.items():
        _assert_no_server_paths(label, text, [r for r in roots if r not in ("/", "")])
