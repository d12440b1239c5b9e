"""HTTP API of the spine: submit, validate before queueing, get, list, metrics."""
from __future__ import annotations

import pytest

GOOD = {"name": "t", "train": {"steps": 3, "prompts_per_step": 2}, "rollout": {"group_size": 4}}


def queued_messages(settings) -> int:
    q = settings.broker_dir / "queue"
    return len(list(q.iterdir())) if q.exists() else 0


def test_healthz(client):
    assert client.get("/healthz").json() == {"status": "ok"}


def test_submit_queues_the_job_id(client, settings):
    r = client.post("/v1/jobs", json=GOOD)
    assert r.status_code == 201, r.text
    job = r.json()
    assert job["status"] == "queued" and job["progress"] == {"step": 0, "total_steps": 3, "fraction": 0.0}
    assert job["spec"]["rollout"]["group_size"] == 4
    assert [(v["name"], v["weight"]) for v in job["spec"]["verifiers"]] == [("math", 1.0)]
    assert client.get(f"/v1/jobs/{job['id']}").json()["id"] == job["id"]
    assert [j["id"] for j in client.get("/v1/jobs").json()["data"]] == [job["id"]]
    assert client.get("/v1/jobs", params={"status": "succeeded"}).json()["data"] == []
    # the broker carries the id only
    msgs = list((settings.broker_dir / "queue").iterdir())
    assert len(msgs) == 1 and job["id"] in msgs[0].read_text()


@pytest.mark.parametrize("patch,loc", [
    ({"rollout": {"group_size": 1}}, ["body", "rollout", "group_size"]),
    ({"rollout": {"group_size": "many"}}, ["body", "rollout", "group_size"]),
    ({"verifiers": [{"name": "nope"}]}, ["body", "verifiers", 0, "name"]),
    ({"verifiers": []}, ["body", "verifiers"]),
    ({"model": {"path": "/does/not/exist"}}, ["body", "model", "path"]),
    ({"model": {"path": "builtin:gpt-5"}}, ["body", "model", "path"]),
    ({"data": {"dataset": "/no/such.jsonl"}}, ["body", "data", "dataset"]),
    ({"optim": {"lr": -1}}, ["body", "optim", "lr"]),
    ({"train": {"steps": 0}}, ["body", "train", "steps"]),
    ({"name": "bad\x00name"}, ["body", "name"]),
    ({"algorithm": "a2c"}, ["body", "algorithm"]),
    ({"rollout": {"group_size": 256}, "train": {"prompts_per_step": 4096}}, ["body"]),
    ({"surprise": 1}, ["body", "surprise"]),
    ({"algorithm": "dpo", "dpo": {"pairs": "/no/pairs.jsonl"}}, ["body", "dpo", "pairs"]),
    ({"algorithm": "grpo", "ppo": {"gamma": 0.9}}, ["body"]),
    ({"algorithm": "ppo", "ppo": {"critic": "/no/critic"}}, ["body", "ppo", "critic"]),
    ({"algorithm": "ppo", "ppo": {"critic": "builtin:gpt-5"}}, ["body", "ppo", "critic"]),
])
def test_bad_specs_get_422_naming_the_field_and_are_never_queued(client, settings, patch, loc):
    r = client.post("/v1/jobs", json={**GOOD, **patch})
    assert r.status_code == 422, r.text
    locs = [e["loc"] for e in r.json()["detail"]]
    assert loc in locs, locs
    assert client.get("/v1/jobs").json()["data"] == []
    assert queued_messages(settings) == 0


def test_unknown_job_is_404(client):
    r = client.get("/v1/jobs/job-doesnotexist")
    assert r.status_code == 404 and "not found" in r.json()["detail"]
    assert client.get("/v1/jobs/job-doesnotexist/metrics").status_code == 404


def test_metrics_series_with_key_selection(client, store):
    job_id = client.post("/v1/jobs", json=GOOD).json()["id"]
    assert store.put_metrics(job_id, 0, {"eval/accuracy": 0.1})
    assert store.put_metrics(job_id, 1, {"reward/mean": 0.5, "kl": 0.01})
    assert store.put_metrics(job_id, 1, {"reward/mean": 0.6, "kl": 0.02})  # replayed step overwrites
    assert not store.put_metrics(job_id, 1, {"reward/mean": 0.6, "kl": 0.02})  # same record again: no news
    pts = client.get(f"/v1/jobs/{job_id}/metrics").json()["points"]
    assert pts == [{"step": 0, "metrics": {"eval/accuracy": 0.1}},
                   {"step": 1, "metrics": {"reward/mean": 0.6, "kl": 0.02}}]
    only = client.get(f"/v1/jobs/{job_id}/metrics", params={"keys": "kl", "after": 0}).json()["points"]
    assert only == [{"step": 1, "metrics": {"kl": 0.02}}]
    assert client.get(f"/v1/jobs/{job_id}").json()["progress"]["step"] == 1


def test_oversized_body_is_413(client, settings):
    r = client.post("/v1/jobs", content=b"x" * (settings.max_body_bytes + 1),
                    headers={"content-type": "application/json"})
    assert r.status_code == 413


def test_dashboard_is_served(client):
    r = client.get("/dashboard")
    assert r.status_code == 200 and "rlvr" in r.text and "/v1/jobs" in r.text


def test_with_auth_on_specs_cannot_name_server_paths(tmp_path, models_dir):
    from fastapi.testclient import TestClient

    from service.app import create_app
    from service.settings import Settings

    settings = Settings(home=tmp_path, models=models_dir, auth=True, admin_key="k" * 20)
    with TestClient(create_app(settings, reaper=False)) as c:
        h = {"Authorization": "Bearer " + "k" * 20}
        assert c.get("/v1/jobs").status_code == 401
        r = c.post("/v1/jobs", json={**GOOD, "data": {"dataset": "/etc/passwd"}}, headers=h)
        assert r.status_code == 422 and ["body", "data", "dataset"] in [e["loc"] for e in r.json()["detail"]]
        r = c.post("/v1/jobs", json={**GOOD, "model": {"path": str(models_dir / "tiny-arith")}}, headers=h)
        assert r.status_code == 422 and ["body", "model", "path"] in [e["loc"] for e in r.json()["detail"]]
        r = c.post("/v1/jobs", json={**GOOD, "algorithm": "ppo", "ppo": {"critic": str(models_dir / "tiny-arith")}},
                   headers=h)
        assert r.status_code == 422 and ["body", "ppo", "critic"] in [e["loc"] for e in r.json()["detail"]]
        # a model cached under the models dir is named, not pathed
        assert c.post("/v1/jobs", json={**GOOD, "model": {"path": "tiny-arith"}}, headers=h).status_code == 201
        assert c.post("/v1/jobs", json={**GOOD, "algorithm": "ppo", "ppo": {"critic": "tiny-arith"}},
                      headers=h).status_code == 201
        fid = c.post("/v1/files", files={"file": ("d.jsonl", b'{"prompt": "1+1", "reference": "2"}\n')},
                     headers=h).json()["id"]
        assert c.post("/v1/jobs", json={**GOOD, "data": {"dataset": fid}}, headers=h).status_code == 201
        pairs = c.post("/v1/files", files={"file": ("p.jsonl", b'{"prompt": "1+1", "chosen": "2"}\n')},
                       data={"purpose": "preference"}, headers=h)
        # /v1/files answers in OpenAI's error shape, for every client (service/openai_compat/errors.py)
        assert pairs.status_code == 400 and pairs.json()["error"]["param"] == "file"
        assert "rejected" in pairs.json()["error"]["message"]
