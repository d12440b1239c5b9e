"""One place checks what a spec names (service/jobs/specs.py), for every front door: built-in models and tasks,
a task's own knobs, evaluation-only sets, files — each a 422 naming its field."""
from __future__ import annotations

import pytest

from trainer.config import JobSpec


def _post(client, **spec):
    return client.post("/v1/jobs", json={"train": {"steps": 1}, **spec})


@pytest.mark.parametrize("spec,loc,says", [
    ({"model": {"path": "builtin:nope"}}, ["body", "model", "path"], "known: builtin:tiny-arith, builtin:tiny-code"),
    ({"data": {"dataset": "builtin:nope"}}, ["body", "data", "dataset"], "known: builtin:arithmetic"),
    ({"data": {"dataset": "builtin:humaneval"}}, ["body", "data", "dataset"], "evaluation set"),
    ({"data": {"eval_dataset": "builtin:nope"}}, ["body", "data", "eval_dataset"], "unknown built-in dataset"),
    ({"data": {"dataset": "builtin:chain_sum", "params": {"max_termz": 3}}}, ["body", "data", "params"],
     "unknown parameter(s) max_termz"),
    ({"data": {"dataset": "builtin:code_functions", "params": {"difficulty": [7]}}}, ["body", "data", "params"],
     "difficulty must be levels among 1, 2, 3"),
    ({"data": {"dataset": "builtin:code_stdio", "params": {"difficulty": 0}}}, ["body", "data", "params"],
     "difficulty must be levels among 1, 2, 3"),
    ({"data": {"params": {"x": 1}}}, ["body", "data", "params"], "takes no data.params"),
    ({"data": {"dataset": "file-doesnotexist"}}, ["body", "data", "dataset"], "not found"),
])
def test_bad_references_are_422_naming_the_field(client, spec, loc, says):
    r = _post(client, **spec)
    assert r.status_code == 422, r.text
    errs = r.json()["detail"]
    assert any(e["loc"] == loc and says in e["msg"] for e in errs), errs


def test_good_references_pass(client):
    r = _post(client, data={"dataset": "builtin:chain_sum", "params": {"min_terms": 2, "max_terms": 2},
                            "eval_dataset": "builtin:chain_sum"})
    assert r.status_code == 201, r.text
    r = _post(client, model={"path": "builtin:tiny-code"}, data={"dataset": "builtin:code_tiny",
                                                                 "eval_dataset": "builtin:humaneval"},
              verifiers=[{"name": "code"}])
    assert r.status_code == 201, r.text



@pytest.mark.parametrize("task", ["math", "code"])
def test_the_real_model_demo_recipes_are_jobs_the_api_accepts(client, task):
    """What `rlvr demo --task … --model smollm2-135m` runs, with the model swapped for the bundled one
    (the real one is not in CI's model cache): every other field passes the API's own checks."""
    from service.cli.recipes import REAL, recipe

    spec = {**recipe(REAL[task]), "model": {"path": "builtin:tiny-arith"}}
    r = client.post("/v1/jobs", json=spec)
    assert r.status_code == 201, r.text
    assert r.json()["spec"]["rollout"] == JobSpec.model_validate(spec).rollout.model_dump()


def test_stop_strings_are_checked_as_the_field(client):
    r = _post(client, rollout={"stop": [""]})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"][:3] == ["body", "rollout", "stop"], r.text
    r = _post(client, rollout={"stop": ["x"] * 9})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"][:3] == ["body", "rollout", "stop"], r.text


def test_references_list_every_model_dataset_and_file_with_its_place():
    spec = JobSpec.model_validate({"algorithm": "ppo", "ppo": {"critic": "builtin:tiny-arith"},
                                   "data": {"eval_dataset": "builtin:humaneval"}})
    assert [(r.kind, r.loc, r.value) for r in spec.references()] == [
        ("model", ("model", "path"), "builtin:tiny-arith"), ("model", ("ppo", "critic"), "builtin:tiny-arith"),
        ("dataset", ("data", "dataset"), "builtin:arithmetic"),
        ("dataset", ("data", "eval_dataset"), "builtin:humaneval")]
    dpo = JobSpec.model_validate({"algorithm": "dpo", "dpo": {"pairs": "file-abc"}})
    assert ("pairs", ("dpo", "pairs"), "file-abc") in [(r.kind, r.loc, r.value) for r in dpo.references()]


def test_every_spec_field_is_described():
    """/docs is the reference: every field of the job spec (all nested blocks) says what it does."""
    schema = JobSpec.model_json_schema()
    blocks = [("JobSpec", schema), *schema.get("$defs", {}).items()]
    missing = [f"{n}.{f}" for n, d in blocks for f, p in d.get("properties", {}).items() if not p.get("description")]
    assert missing == []
    assert sum(len(d.get("properties", {})) for _, d in blocks) >= 80


def test_kl_k1_in_the_loss_is_refused_and_ppo_keeps_its_own_reward_kl(client):
    r = _post(client, algo={"kl_coef": 0.1, "kl_estimator": "k1"})
    assert r.status_code == 422, r.text
    d = r.json()["detail"][0]
    assert d["loc"][:2] == ["body", "algo"] and "kl_in: reward" in d["msg"]
    assert _post(client, algo={"kl_coef": 0.1, "kl_estimator": "k1", "kl_in": "reward"}).status_code == 201
    assert _post(client, algo={"kl_coef": 0.0, "kl_estimator": "k1"}).status_code == 201  # no penalty, no gradient
    r = _post(client, algorithm="ppo", algo={"kl_coef": 0.1, "kl_in": "reward"})
    assert r.status_code == 422 and "ppo.kl_reward_coef" in r.json()["detail"][0]["msg"], r.text


# -- issue 33, items 2 and 3: every cost a spec names is bounded, refused before anything is queued ----------
@pytest.mark.parametrize("spec,loc,says", [
    ({"train": {"steps": 1, "world_size": 1024, "prompts_per_step": 1024}}, ["body", "train", "world_size"],
     "RLVR_MAX_WORLD_SIZE"),
    ({"data": {"eval_size": 100_000}, "train": {"steps": 1, "eval_samples": 256},
      "rollout": {"max_new_tokens": 32_768}}, ["body"], "completions per evaluation"),
    ({"data": {"eval_size": 70_000}}, ["body"], "completions per evaluation"),
    ({"verifiers": [{"name": "code", "config": {"timeout_s": 1e9}}]}, ["body", "verifiers", 0, "config"], "timeout_s"),
    ({"verifiers": [{"name": "code", "config": {"memory_mb": 10**9}}]}, ["body", "verifiers", 0, "config"],
     "memory_mb"),
    ({"verifiers": [{"name": "code", "config": {"max_output_bytes": 10**12}}]}, ["body", "verifiers", 0, "config"],
     "max_output_bytes"),
    ({"verifiers": [{"name": "code", "config": {"max_rounds": 10**9}}]}, ["body", "verifiers", 0, "config"],
     "max_rounds"),
    ({"verifiers": [{"name": "math", "config": {"startup_timeout_s": 1e9}}]}, ["body", "verifiers", 0, "config"],
     "startup_timeout_s"),
    ({"verifiers": [{"name": "multi", "config": {"verifiers": {"a": {"name": "code", "config": {"timeout_s": 1e9}}}}}]},
     ["body", "verifiers", 0, "config"], "timeout_s"),
])
def test_unbounded_costs_are_422_naming_the_field(client, spec, loc, says):
    r = client.post("/v1/jobs", json={"train": {"steps": 1}, **spec})
    assert r.status_code == 422, r.text
    errs = r.json()["detail"]
    assert any(e["loc"][:len(loc)] == loc and says in e["msg"] for e in errs), errs
    assert client.get("/v1/jobs").json()["data"] == []  # nothing queued


def test_the_bounds_leave_real_jobs_alone(client, settings):
    # 3855 x (1 + 16) = 65535 completions per evaluation: just within a step's bound
    ok = {"train": {"steps": 1, "world_size": settings.max_world_size, "prompts_per_step": 8, "eval_samples": 16},
          "data": {"eval_size": 3855}, "verifiers": [{"name": "code", "config": {"timeout_s": 60, "memory_mb": 4096}}]}
    r = client.post("/v1/jobs", json=ok)
    assert r.status_code == 201, r.text


def test_a_job_whose_reward_is_looser_than_its_tasks_judge_is_warned(client):
    r = client.post("/v1/jobs", json={"train": {"steps": 1}, "data": {"dataset": "builtin:chain_sum"},
                                      "verifiers": [{"name": "math"}]})
    assert r.status_code == 201, r.text
    events = client.get(f"/v1/jobs/{r.json()['id']}/events").json()["data"]
    warned = [e for e in events if e["type"] == "warning" and "allow_unevaluated: true" in e["message"]]
    assert warned and "eval/strict_accuracy" in warned[0]["message"]
    strict = client.post("/v1/jobs", json={"train": {"steps": 1}, "data": {"dataset": "builtin:chain_sum"},
                                           "verifiers": [{"name": "math", "config": {"allow_unevaluated": False}}]})
    events = client.get(f"/v1/jobs/{strict.json()['id']}/events").json()["data"]
    assert not [e for e in events if e["type"] == "warning"]


def test_one_path_creates_jobs_and_resolving_a_spec_leaves_the_stored_one_alone(client, settings):
    from service.jobs.specs import resolve_spec
    from tests.conftest import REPO

    creators = [p.relative_to(REPO).as_posix() for p in (REPO / "service").rglob("*.py")
                if ".create_job(" in p.read_text()]  # a call on the store (the routes' own function is create_job)
    assert creators == ["service/jobs/submit.py"], creators
    store = client.app.state.store
    spec = JobSpec.model_validate({"model": {"path": "builtin:tiny-arith"}, "data": {"dataset": "builtin:arithmetic"}})
    before = spec.model_dump()
    resolved = resolve_spec(spec, store, "default", settings, log=lambda m: None)
    assert spec.model_dump() == before and resolved is not spec
