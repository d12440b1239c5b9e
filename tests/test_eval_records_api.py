"""Held-out eval records in the store and over the API: every problem's outcome and completion at each eval,
a page at a time, and the paired comparison of two evals (which problems flipped, the paired s.e.)."""
from __future__ import annotations

import json
import math

import pytest
from fastapi.testclient import TestClient

from service.jobs.runner import execute_job
from service.store.jobs import LeaseLost
from tests.test_access_control import ADMIN_KEY, auth_app, bearer  # noqa: F401 (a fixture)

JOB = {"name": "ev", "rollout": {"group_size": 4, "max_new_tokens": 12}, "data": {"eval_size": 10},
       "train": {"steps": 2, "prompts_per_step": 2, "eval_every": 0, "threads": 1}}
# 8 problems at two evals: strict and reward outcomes chosen so every comparison below is computed by hand
A_STRICT = [1, 1, 0, 0, 0, 1, 0, 0]
B_STRICT = [1, 0, 1, 1, 1, 1, 0, 0]
A_REWARD = [1, 1, 1, 0, 0, 1, 0, 0]  # problem 2 earned the reward at a without the strict judge's yes (an echo)


def records(strict, reward):
    return [{"index": i, "id": f"p{i}", "prompt": f"{i} + 1 =", "reference": str(i + 1), "completion": f"c{i}-{s}",
             "correct": bool(r), "strict_correct": bool(s), "reward": float(r), "verdicts": {}, "length": 3}
            for i, (s, r) in enumerate(zip(strict, reward))]


@pytest.fixture
def job(client, store):
    job = client.post("/v1/jobs", json=JOB).json()["id"]
    store.put_evals(job, 0, records(A_STRICT, A_REWARD))
    store.put_evals(job, 5, records(B_STRICT, B_STRICT))
    return job


def test_steps_pages_and_records(client, job, store):
    assert client.get(f"/v1/jobs/{job}/evals").json() == [
        {"step": 0, "problems": 8, "accuracy": 4 / 8, "strict_accuracy": 3 / 8, "reward": 4 / 8},
        {"step": 5, "problems": 8, "accuracy": 5 / 8, "strict_accuracy": 5 / 8, "reward": 5 / 8}]
    page = client.get(f"/v1/jobs/{job}/evals/5", params={"offset": 3, "limit": 2}).json()
    assert page["step"] == 5 and page["total"] == 8 and page["offset"] == 3
    assert [(r["index"], r["id"], r["strict_correct"]) for r in page["records"]] == [(3, "p3", True), (4, "p4", True)]
    assert page["records"][0]["record"] == {"prompt": "3 + 1 =", "reference": "4", "completion": "c3-1",
                                            "verdicts": {}, "length": 3}
    store.put_evals(job, 5, records(B_STRICT, B_STRICT)[:2])  # an eval run again replaces its rows
    assert client.get(f"/v1/jobs/{job}/evals/5").json()["total"] == 2


def test_paired_comparison_by_hand(client, job):
    r = client.get(f"/v1/jobs/{job}/evals/compare", params={"a": 0, "b": 5}).json()
    # strict: both {0, 5}, lost {1}, gained {2, 3, 4}, neither {6, 7}; diff (3 - 1) / 8; per-problem d has
    # sample variance (4 - 8 * 0.25**2) / 7 = 0.5, so se = sqrt(0.5 / 8) = 0.25; McNemar: 2 * (1 + 4) / 16
    assert (r["judge"], r["n"], r["both"], r["gained"], r["lost"], r["neither"]) == ("strict", 8, 2, 3, 1, 2)
    assert r["accuracy_a"] == 0.375 and r["accuracy_b"] == 0.625 and r["diff"] == 0.25
    assert math.isclose(r["se"], 0.25) and math.isclose(r["mcnemar_p"], 10 / 16)
    assert r["flips_total"] == 4
    assert [(f["index"], f["direction"], f["completion_a"], f["completion_b"]) for f in r["flips"]] == [
        (1, "lost", "c1-1", "c1-0"), (2, "gained", "c2-0", "c2-1"), (3, "gained", "c3-0", "c3-1"),
        (4, "gained", "c4-0", "c4-1")]
    rew = client.get(f"/v1/jobs/{job}/evals/compare", params={"a": 0, "b": 5, "judge": "reward", "limit": 1}).json()
    # by the reward, problem 2 was already "right" at a: gained {3, 4}, lost {1}, both {0, 2, 5}
    assert (rew["gained"], rew["lost"], rew["both"], rew["diff"], rew["flips_total"]) == (2, 1, 3, 1 / 8, 3)
    assert [f["index"] for f in rew["flips"]] == [1]


@pytest.mark.parametrize("path, code, field", [
    ("/evals/-1", 422, "step"), ("/evals/abc", 422, "step"), (f"/evals/{2**31}", 422, "step"),
    ("/evals/0?limit=0", 422, "limit"), ("/evals/0?offset=-3", 422, "offset"),
    ("/evals/7", 404, None), ("/evals/compare?a=0", 422, "b"), ("/evals/compare?a=0&b=7", 404, None),
    ("/evals/compare?a=0&b=5&judge=lenient", 422, "judge"), ("/evals/compare?a=0&b=5&limit=5000", 422, "limit")])
def test_bad_steps_and_parameters_are_4xx_naming_them(client, job, path, code, field):
    r = client.get(f"/v1/jobs/{job}{path}")
    assert r.status_code == code, r.text
    if field:
        assert field in json.dumps(r.json()["detail"]), r.text
    else:
        assert "no held-out eval at step 7" in r.json()["detail"]
    assert client.get("/v1/jobs/job-nope/evals").status_code == 404


def test_a_worker_that_lost_its_lease_stores_no_eval(client, store):
    job = client.post("/v1/jobs", json=JOB).json()["id"]
    with pytest.raises(LeaseLost):
        store.put_evals(job, 0, records(A_STRICT, A_REWARD), owner="not-the-owner")
    assert client.get(f"/v1/jobs/{job}/evals").json() == []


def test_another_tenants_evals_read_exactly_like_a_missing_job(auth_app):
    with TestClient(auth_app) as c:
        keys = {t: c.post("/v1/keys", json={"tenant": t}, headers=bearer(ADMIN_KEY)).json()["key"]
                for t in ("alice", "bob")}
        alice, bob = bearer(keys["alice"]), bearer(keys["bob"])
        job = c.post("/v1/jobs", json=JOB, headers=alice).json()["id"]
        auth_app.state.store.put_evals(job, 0, records(A_STRICT, A_REWARD))
        auth_app.state.store.put_evals(job, 5, records(B_STRICT, B_STRICT))
        missing = "job-0123456789abcdef"
        for path in ("/v1/jobs/{}/evals", "/v1/jobs/{}/evals/0", "/v1/jobs/{}/evals/compare?a=0&b=5"):
            assert c.get(path.format(job), headers=alice).status_code == 200, path
            theirs, none = c.get(path.format(job), headers=bob), c.get(path.format(missing), headers=bob)
            assert theirs.status_code == none.status_code == 404, (path, theirs.text)
            assert theirs.text.replace(job, "ID") == none.text.replace(missing, "ID"), path
            assert "c0-1" not in theirs.text


@pytest.mark.slow
def test_a_real_job_stores_each_eval_as_its_run_dir_has_it(client, store, settings):
    job = client.post("/v1/jobs", json=JOB).json()["id"]
    assert execute_job(job, settings, store) == "succeeded"
    steps = client.get(f"/v1/jobs/{job}/evals").json()
    assert [s["step"] for s in steps] == [0, 2] and all(s["problems"] == 10 for s in steps)
    body = client.get(f"/v1/jobs/{job}").json()
    assert steps[0]["accuracy"] == body["result"]["accuracy_before"]
    assert steps[1]["accuracy"] == body["result"]["accuracy_after"]
    on_disk = [json.loads(x)
               for x in (settings.runs_dir / job / "evals" / "step-0000002.jsonl").read_text().splitlines()]
    served = client.get(f"/v1/jobs/{job}/evals/2").json()["records"]
    assert [r["index"] for r in served] == [r["index"] for r in on_disk] == list(range(10))
    for s, d in zip(served, on_disk):
        assert (s["correct"], s["strict_correct"], s["reward"]) == (d["correct"], d["strict_correct"], d["reward"])
        assert s["record"]["completion"] == d["completion"] and s["record"]["prompt"] == d["prompt"]
        assert s["record"]["strict_verdicts"]["math"]["status"] in ("correct", "wrong", "unparseable")
    cmp = client.get(f"/v1/jobs/{job}/evals/compare", params={"a": 0, "b": 2}).json()
    assert cmp["n"] == 10 and cmp["gained"] + cmp["lost"] == cmp["flips_total"]
    assert math.isclose(cmp["diff"], steps[1]["strict_accuracy"] - steps[0]["strict_accuracy"])
