"""Hugging Face Hub ids as model.path, offline: a cache laid out as the Hub lays it out (tests/hub_cache.py)
in a temporary HF_HOME, built from the tiny model's files. One resolver (trainer/models/resolve.py) for every
front door and the worker; `rlvr models pull|list` on the same cache."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from tests.conftest import REPO
from tests.hub_cache import add_to_cache, use_cache

REPO_ID = "rlvr-test/tiny-arith"
SMALL = {"name": "hub", "rollout": {"group_size": 2, "max_new_tokens": 6}, "data": {"eval_size": 2},
         "train": {"steps": 1, "prompts_per_step": 2, "eval_every": 0, "threads": 1}}


@pytest.fixture
def hf_cache(tmp_path, tiny_model, monkeypatch):
    """HF_HOME with the tiny model cached as rlvr-test/tiny-arith, and HF_HUB_OFFLINE=1."""
    cache = use_cache(monkeypatch, tmp_path / "hf")
    snapshot = add_to_cache(cache, REPO_ID, tiny_model)
    return tmp_path / "hf", snapshot


@pytest.fixture
def tenant(tmp_path, models_dir, hf_cache):
    from service.access.keys import create_key
    from service.app import create_app
    from service.settings import Settings

    settings = Settings(home=tmp_path / "home", models=models_dir, auth=True, admin_key="hub-admin-key-xyz")
    app = create_app(settings, reaper=False)
    with TestClient(app, headers={"Authorization": "Bearer " + create_key(app.state.store, "acme")}) as c:
        yield c, app, settings


def test_a_cached_hub_id_resolves_to_its_snapshot_and_loads(hf_cache, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainer.models.resolve import model_error, resolve_model

    _, snapshot = hf_cache
    for local_paths in (True, False):  # a Hub id is not a server path: allowed either way
        assert model_error(REPO_ID, tmp_path / "models", local_paths) is None
        assert resolve_model(REPO_ID, tmp_path / "models", local_paths=local_paths) == snapshot
    assert (snapshot / "config.json").is_symlink()  # really the hub's layout: snapshot → blobs
    model = AutoModelForCausalLM.from_pretrained(snapshot)
    assert sum(p.numel() for p in model.parameters()) > 100_000
    assert AutoTokenizer.from_pretrained(snapshot)("1+2")["input_ids"]


def test_a_missing_or_partial_hub_id_is_a_clear_error_offline(hf_cache, tmp_path, tiny_model):
    from huggingface_hub import constants

    from trainer.models import hub
    from trainer.models.resolve import ModelPathError, model_error, resolve_model

    msg = model_error("rlvr-test/not-cached", tmp_path, local_paths=False)
    assert "not in this server's Hugging Face cache" in msg and "HF_HUB_OFFLINE" in msg
    assert constants.HF_HUB_CACHE not in msg  # tenants never learn where the cache is
    with pytest.raises(ModelPathError, match="HF_HUB_OFFLINE"):
        resolve_model("rlvr-test/not-cached", tmp_path)
    # a config without weights (an interrupted or config-only download) is not a model
    add_to_cache(Path(constants.HF_HUB_CACHE), "rlvr-test/config-only", tiny_model, files=["config.json"])
    assert hub.cached("rlvr-test/config-only") is None and model_error("rlvr-test/config-only", tmp_path)
    # what is not a Hub id is not looked up there
    for ref in ("../x/y", "a--b/c", "/abs/path", "org/name/extra"):
        assert not hub.is_hub_id(ref)


def test_online_the_hub_is_asked_and_its_answers_named(hf_cache, monkeypatch, tmp_path):
    from huggingface_hub import HfApi, constants
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    from trainer.models import hub

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    req = httpx.Request("GET", "https://hub.invalid/api/models/x")
    answers = {"org/gated": GatedRepoError("gated", response=httpx.Response(403, request=req)),
               "org/missing": RepositoryNotFoundError("missing", response=httpx.Response(404, request=req)),
               "org/down": httpx.ConnectError("no route to host")}
    asked = []

    def model_info(self, repo_id, timeout=None, **kw):
        asked.append(repo_id)
        if repo_id in answers:
            raise answers[repo_id]
        return object()

    monkeypatch.setattr(HfApi, "model_info", model_info)
    assert hub.error("org/exists") is None
    assert "gated" in hub.error("org/gated") and "HF_TOKEN" in hub.error("org/gated")
    assert "not found on the Hugging Face Hub" in hub.error("org/missing")
    assert "cannot be reached" in hub.error("org/down")
    assert hub.error(REPO_ID) is None and REPO_ID not in asked  # cached: the Hub is not asked


def test_submission_accepts_hub_ids_with_auth_on_and_the_worker_trains_from_the_snapshot(tenant):
    from service.jobs.runner import execute_job

    c, app, settings = tenant
    r = c.post("/v1/jobs", json={**SMALL, "model": {"path": REPO_ID}})
    assert r.status_code == 201, r.text
    missing = c.post("/v1/jobs", json={**SMALL, "model": {"path": "rlvr-test/absent"}})
    assert missing.status_code == 422 and missing.json()["detail"][0]["loc"] == ["body", "model", "path"]
    assert "HF_HUB_OFFLINE" in missing.text and str(settings.home_dir) not in missing.text
    critic = c.post("/v1/jobs", json={**SMALL, "algorithm": "ppo", "ppo": {"critic": "rlvr-test/absent"}})
    assert critic.status_code == 422 and critic.json()["detail"][0]["loc"] == ["body", "ppo", "critic"]
    assert execute_job(r.json()["id"], settings, app.state.store) == "succeeded"
    job = c.get(f"/v1/jobs/{r.json()['id']}").json()
    assert job["spec"]["model"]["path"] == REPO_ID  # the stored spec keeps the id, not the snapshot's path
    listed = {m["id"]: m for m in c.get("/v1/models").json()["data"]}
    assert listed[REPO_ID]["source"] == "cached" and listed[REPO_ID]["owned_by"] == "rlvr-test"


def test_rlvr_models_pull_and_list_work_offline_on_the_hub_cache(hf_cache, tmp_path, models_dir):
    from service.settings import Settings
    from service.store.jobs import Store
    from service.store.tables import Job

    hf_home, snapshot = hf_cache
    env = {**os.environ, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1", "RLVR_HOME": str(tmp_path / "home"),
           "RLVR_MODELS": str(models_dir)}

    def rlvr(*args):
        return subprocess.run([sys.executable, "-m", "service.cli", "models", *args], env=env, cwd=REPO,
                              capture_output=True, text=True, timeout=120)

    out = rlvr("pull", REPO_ID)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == str(snapshot)
    out = rlvr("pull", "rlvr-test/absent")
    assert out.returncode == 2 and "HF_HUB_OFFLINE" in out.stderr
    # a finished job with a final checkpoint: listed as fine-tuned
    settings = Settings(home=tmp_path / "home", models=models_dir)
    store = Store(settings.db_url)
    job = store.create_job({"name": "done", "model": {"path": "builtin:tiny-arith"}, "train": {"steps": 1}},
                           tenant="acme")
    ckpt = tmp_path / "ck" / "step-0000001"
    ckpt.mkdir(parents=True)
    (ckpt / "config.json").write_text("{}")
    store.put_checkpoint(job.id, 1, ckpt.name, str(ckpt), {})
    with store.Session.begin() as s:
        row = s.get(Job, job.id)
        row.status, row.result = "succeeded", {"checkpoint": ckpt.name}
    out = rlvr("list", "--json")
    assert out.returncode == 0, out.stderr
    rows = {r["id"]: r for r in map(json.loads, out.stdout.strip().splitlines())}
    assert rows["builtin:tiny-arith"]["source"] == "builtin"
    assert rows["tiny-arith"]["source"] == "pulled"
    assert rows[REPO_ID]["source"] == "cached"
    ft = rows[f"ft:builtin:tiny-arith:{job.id}"]
    assert ft["source"] == "fine-tuned" and ft["owned_by"] == "acme" and ft["download_url"].endswith("/download")
