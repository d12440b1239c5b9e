"""GET /v1/models: every model a job can start from, tenant-scoped; a finished job's model is an id that a new
job's model.path takes (its own tenant only) and a URL downloads — never a server path."""
from __future__ import annotations

import io
import json
import tarfile

import pytest
from fastapi.testclient import TestClient

from service.jobs.runner import execute_job

SMALL = {"name": "models", "rollout": {"group_size": 2, "max_new_tokens": 6}, "data": {"eval_size": 2},
         "train": {"steps": 1, "prompts_per_step": 2, "eval_every": 0, "threads": 1}}


@pytest.fixture
def tenants(tmp_path, models_dir):
    from service.access.keys import create_key
    from service.app import create_app
    from service.settings import Settings

    settings = Settings(home=tmp_path / "home", models=models_dir, auth=True, admin_key="models-admin-key-xyz")
    app = create_app(settings, reaper=False)
    with TestClient(app) as c:
        yield c, app, settings, {t: {"Authorization": "Bearer " + create_key(app.state.store, t)}
                                 for t in ("alice", "bob")}


def test_models_list_built_in_and_pulled_models_in_openai_shape(tenants):
    c, _, _, h = tenants
    body = c.get("/v1/models", headers=h["alice"]).json()
    assert body["object"] == "list"
    by_id = {m["id"]: m for m in body["data"]}
    assert by_id["builtin:tiny-arith"]["source"] == "builtin" and by_id["tiny-arith"]["source"] == "pulled"
    for m in body["data"]:
        assert m["object"] == "model" and isinstance(m["created"], int) and m["owned_by"]
        assert c.get(f"/v1/models/{m['id']}", headers=h["alice"]).json() == m
    # every id listed is a model.path a job accepts
    for model_id in by_id:
        r = c.post("/v1/jobs", json={**SMALL, "model": {"path": model_id}}, headers=h["alice"])
        assert r.status_code == 201, (model_id, r.text)


def test_a_finished_jobs_model_is_an_id_its_tenant_lists_downloads_and_trains_from(tenants):
    c, app, settings, h = tenants
    store = app.state.store
    job = c.post("/v1/jobs", json=SMALL, headers=h["alice"]).json()
    assert job["fine_tuned_model"] is None  # not finished yet
    assert execute_job(job["id"], settings, store) == "succeeded"
    done = c.get(f"/v1/jobs/{job['id']}", headers=h["alice"]).json()
    model_id = done["fine_tuned_model"]
    assert model_id == f"ft:builtin:tiny-arith:{job['id']}"
    assert c.get(f"/v1/fine_tuning/jobs/{job['id']}", headers=h["alice"]).json()["fine_tuned_model"] == model_id
    entry = c.get(f"/v1/models/{model_id}", headers=h["alice"]).json()
    assert entry["source"] == "fine-tuned" and entry["owned_by"] == "alice" and entry["parent"] == "builtin:tiny-arith"
    assert entry["fine_tuning_job"] == job["id"]
    assert model_id in [m["id"] for m in c.get("/v1/models", headers=h["alice"]).json()["data"]]
    tar = c.get(entry["download_url"], headers=h["alice"])
    assert tar.status_code == 200
    names = tarfile.open(fileobj=io.BytesIO(tar.content)).getnames()
    assert any(n.endswith("config.json") for n in names) and any(n.endswith("model.safetensors") for n in names)
    # a new job starts from it, and trains
    child = c.post("/v1/jobs", json={**SMALL, "model": {"path": model_id}}, headers=h["alice"])
    assert child.status_code == 201, child.text
    assert execute_job(child.json()["id"], settings, store) == "succeeded"
    grandchild = c.get(f"/v1/jobs/{child.json()['id']}", headers=h["alice"]).json()["fine_tuned_model"]
    assert grandchild == f"ft:{model_id}:{child.json()['id']}"
    # the id must be the job's own: another base or suffix on the same job id names nothing
    forged = f"ft:tiny-code:{job['id']}"
    assert c.get(f"/v1/models/{forged}", headers=h["alice"]).status_code == 404
    assert c.post("/v1/jobs", json={**SMALL, "model": {"path": forged}}, headers=h["alice"]).status_code == 422


def test_another_tenants_fine_tuned_model_reads_exactly_like_a_missing_one(tenants):
    c, app, settings, h = tenants
    job = c.post("/v1/jobs", json=SMALL, headers=h["alice"]).json()["id"]
    assert execute_job(job, settings, app.state.store) == "succeeded"
    theirs = c.get(f"/v1/jobs/{job}", headers=h["alice"]).json()["fine_tuned_model"]
    missing = "ft:builtin:tiny-arith:job-0123456789abcdef"
    assert theirs not in json.dumps(c.get("/v1/models", headers=h["bob"]).json())
    a, b = c.get(f"/v1/models/{theirs}", headers=h["bob"]), c.get(f"/v1/models/{missing}", headers=h["bob"])
    assert a.status_code == b.status_code == 404 and a.text.replace(theirs, "ID") == b.text.replace(missing, "ID")
    a = c.post("/v1/jobs", json={**SMALL, "model": {"path": theirs}}, headers=h["bob"])
    b = c.post("/v1/jobs", json={**SMALL, "model": {"path": missing}}, headers=h["bob"])
    assert a.status_code == b.status_code == 422 and a.text.replace(theirs, "ID") == b.text.replace(missing, "ID")
    assert a.json()["detail"][0]["loc"] == ["body", "model", "path"]
    # a deleted job's model is gone with it
    assert c.delete(f"/v1/jobs/{job}", headers=h["alice"]).status_code == 204
    assert c.get(f"/v1/models/{theirs}", headers=h["alice"]).status_code == 404
