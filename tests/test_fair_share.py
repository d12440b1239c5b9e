"""Fair share of the API's verifier capacity: per-tenant request limits and sandbox lanes, a per-request
items × timeout budget, and /healthz answered while every jail and verifier thread is busy."""
from __future__ import annotations

import os
import threading
import time

import pytest
from fastapi.testclient import TestClient

from service.access.keys import create_key
from service.app import create_app
from service.settings import Settings

SLEEPY = ("import time\ndef verify(completion, reference, **fields):\n"
          "    time.sleep(float(completion))\n    return 1.0\n")


@pytest.fixture
def sandbox_ok():
    import sandbox

    try:
        sandbox.get_backend("local")
    except sandbox.SandboxUnavailable as e:
        pytest.skip(f"dry runs of Python verifiers need the local sandbox, unavailable here: {e}")


@pytest.fixture
def shared(tmp_path, models_dir, sandbox_ok):
    settings = Settings(home=tmp_path / "home", models=models_dir, auth=True, admin_key="fair-share-admin-key",
                        sandbox_requests_per_tenant=2)
    app = create_app(settings, reaper=False)
    keys = {t: {"Authorization": "Bearer " + create_key(app.state.store, t)} for t in
            ["alice", "bob", "erin"] + [f"t{i}" for i in range(24)]}
    with TestClient(app) as c:
        yield c, app.state.fairshare, keys


def dry_run(c, headers, seconds: list[str], timeout_s: float = 10):
    body = {"items": [{"completion": s} for s in seconds], "config": {"source": SLEEPY, "timeout_s": timeout_s}}
    return c.post("/v1/verifiers/python/run", json=body, headers=headers)


def wait_until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.05)


def test_fair_share_settings_are_described():
    for name in ("sandbox_requests_per_tenant", "sandbox_share_per_tenant", "max_request_sandbox_s", "verify_threads"):
        assert Settings.model_fields[name].description, name


def test_healthz_and_status_polls_answer_while_the_sandbox_pool_is_saturated(shared):
    """48 slow dry runs in flight (more than the request thread pool's 40 threads, every verifier
    thread and jail busy, every tenant at its limit): liveness and status polls are still answered."""
    c, fair, keys = shared
    tenants = [f"t{i}" for i in range(24)]
    results: list = []

    def hog(tenant):
        # 1.5 s each (48 through 2 jails: ~36 s): every request is admitted long before the first one ends,
        # even on a busy machine (at 0.3 s a slow start let one finish first, and the all-at-limit wait timed out)
        results.append(dry_run(c, keys[tenant], ["1.5"]))

    threads = [threading.Thread(target=hog, args=(t,)) for t in tenants for _ in range(2)]
    for t in threads:
        t.start()
    wait_until(lambda: all(fair.running(t) == 2 for t in tenants), 60, "all tenants at their limit")
    assert c.get("/healthz").json() == {"status": "ok"}
    job = c.post("/v1/jobs", json={"train": {"steps": 2}}, headers=keys["erin"])
    assert job.status_code == 201 and c.get(f"/v1/jobs/{job.json()['id']}", headers=keys["erin"]).status_code == 200
    still_running = sum(fair.running(t) for t in tenants)
    assert still_running > 0 and any(t.is_alive() for t in threads)  # answered *while* saturated
    for t in threads:
        t.join(120)
    assert [r.status_code for r in results] == [200] * len(threads)
    assert all(x["score"] == 1.0 for r in results for x in r.json()["results"])
    assert all(fair.running(t) == 0 for t in tenants)


def test_a_tenant_at_its_request_limit_gets_429_and_others_do_not(shared):
    c, fair, keys = shared
    threads = [threading.Thread(target=dry_run, args=(c, keys["alice"], ["3"])) for _ in range(2)]
    for t in threads:
        t.start()
    wait_until(lambda: fair.running("alice") == 2, 30, "alice at her limit")
    over = dry_run(c, keys["alice"], ["0"])
    assert over.status_code == 429 and over.headers["retry-after"] and "RLVR_SANDBOX_REQUESTS_PER_TENANT" in over.text
    assert dry_run(c, keys["bob"], ["0"]).status_code == 200
    for t in threads:
        t.join(60)
    assert dry_run(c, keys["alice"], ["0"]).status_code == 200  # her slots came back


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one jail: no share is left for a second tenant")
def test_one_tenants_slow_items_do_not_hold_the_whole_pool(shared):
    """Alice's two slow items would take every jail of a 2-core pool for their whole duration; her lane
    holds only her share, so Bob's quick item is answered before Alice's request finishes."""
    c, fair, keys = shared
    done: dict[str, float] = {}

    def alice():
        r = dry_run(c, keys["alice"], ["4", "4"])
        done["alice"] = time.monotonic()
        assert r.status_code == 200, r.text

    t = threading.Thread(target=alice)
    t.start()
    wait_until(lambda: fair.running("alice") == 1, 30, "alice's request running")
    time.sleep(1.0)  # let her runs take their jails
    r = dry_run(c, keys["bob"], ["0.5"])  # long enough to finish after Alice if it had to wait for her jails
    done["bob"] = time.monotonic()
    assert r.status_code == 200 and r.json()["results"][0]["score"] == 1.0
    t.join(60)
    assert done["bob"] < done["alice"]


def test_items_times_timeout_is_bounded_per_request_naming_the_field(shared):
    c, fair, keys = shared
    per_item = 5.0
    n = int(fair.budget_s // per_item) + 1
    if n > 32:
        pytest.skip("the budget allows every request the item limit admits")
    r = dry_run(c, keys["alice"], ["0"] * n, timeout_s=per_item)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "items"], r.text
    assert "RLVR_MAX_REQUEST_SANDBOX_S" in r.text
    golden = [{"completion": "0", "reference": None, "expected_score": 1.0}] * 30
    r = c.post("/v1/verifiers", json={"name": "slowpoke", "source": SLEEPY, "golden": golden,
                                      "config": {"timeout_s": 60}}, headers=keys["alice"])
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "golden"], r.text
    multi = {"verifiers": {"a": {"name": "python", "config": {"source": SLEEPY, "timeout_s": 60}},
                           "b": {"name": "python", "config": {"source": SLEEPY, "timeout_s": 60}}}}
    r = c.post("/v1/verifiers/multi/run", json={"items": [{"completion": "0"}], "config": multi}, headers=keys["bob"])
    assert r.status_code == 200  # 120 s: at the bound, not over it
    r = c.post("/v1/verifiers/multi/run", json={"items": [{"completion": "0"}] * 2, "config": multi},
               headers=keys["bob"])
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "items"]


# -- issue 33, item 1: the door counts what a request can actually spend, and the meter holds it to that --
@pytest.fixture
def tight(tmp_path, models_dir, sandbox_ok):
    settings = Settings(home=tmp_path / "home", models=models_dir, auth=True, admin_key="fair-share-admin-key",
                        max_request_sandbox_s=3.0)
    app = create_app(settings, reaper=False)
    with TestClient(app) as c:
        yield c, {"Authorization": "Bearer " + create_key(app.state.store, "mallory")}


def stdio_item(n_tests: int, program: str = "import time\ntime.sleep(0.8)\nprint(1)") -> dict:
    return {"completion": program, "reference": {"tests": [{"stdin": "", "stdout": "1"}] * n_tests}}


def test_a_code_item_with_many_tests_counts_each_run(tight):
    """The attack: one item, 20 stdin/stdout tests; the door used to count one timeout_s per item and the
    request spent >= 16 jail-seconds against a 10 s budget. Now each test is a run the door counts."""
    c, key = tight
    r = c.post("/v1/verifiers/code/run", json={"items": [stdio_item(20)], "config": {"timeout_s": 1.0}}, headers=key)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "items"], r.text
    assert "20 s" in r.text and "RLVR_MAX_REQUEST_SANDBOX_S" in r.text
    t0 = time.monotonic()  # at the bound (6 tests x 0.5 s = 3 s): admitted, and it spends no more
    r = c.post("/v1/verifiers/code/run", json={"items": [stdio_item(6)], "config": {"timeout_s": 0.5}}, headers=key)
    assert r.status_code == 200 and r.json()["results"][0]["status"] == "timeout", r.text
    assert time.monotonic() - t0 < 3.0 + 2.5


def test_the_meter_holds_the_budget_when_the_count_is_wrong(tight, monkeypatch):
    """Should a verifier's own count be wrong (a plugin's, say), what its runs spend is still metered:
    the runs past the budget never start."""
    from verifiers.code.verifier import CodeVerifier

    c, key = tight
    monkeypatch.setattr(CodeVerifier, "sandbox_seconds", lambda self, reference: 0.0)
    t0 = time.monotonic()
    r = c.post("/v1/verifiers/code/run", json={"items": [stdio_item(20, "import time\ntime.sleep(0.5)\nprint(1)")],
                                                "config": {"timeout_s": 2.0}}, headers=key)
    took = time.monotonic() - t0
    assert r.status_code == 200, r.text
    res = r.json()["results"][0]
    assert res["status"] == "timeout" and "budget" in res["details"]["first_failure"]["reason"], res
    assert took < 3.0 + 2.5, took  # 20 x 0.5 s = 10 s unmetered


def test_function_tests_cost_one_run_and_the_judge_is_within_it(tight):
    c, key = tight
    ref = {"prompt": "import time\ntime.sleep(5)\n", "test": "def check(candidate):\n    assert candidate() == 1\n",
           "entry_point": "f"}
    item = {"completion": "def f():\n    return 1", "reference": ref}
    r = c.post("/v1/verifiers/code/run", json={"items": [item] * 4, "config": {"timeout_s": 1.0}}, headers=key)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "items"]  # 4 x 1 s > 3 s
    t0 = time.monotonic()
    r = c.post("/v1/verifiers/code/run", json={"items": [item] * 3, "config": {"timeout_s": 1.0}}, headers=key)
    assert r.status_code == 200 and [x["status"] for x in r.json()["results"]] == ["timeout"] * 3, r.text
    assert time.monotonic() - t0 < 3.0 + 3.0


def test_a_code_grader_run_counts_its_tests(tight):
    c, key = tight
    grader = {"type": "code", "name": "t", "reference": "{{item.tests}}", "config": {"timeout_s": 1.0}}
    body = {"grader": grader, "model_sample": "print(1)", "item": {"tests": stdio_item(20)["reference"]}}
    r = c.post("/v1/fine_tuning/alpha/graders/run", json=body, headers=key)
    assert r.status_code == 400 and r.json()["error"]["param"] == "grader", r.text
    assert "RLVR_MAX_REQUEST_SANDBOX_S" in r.json()["error"]["message"]


def test_many_tiny_runs_are_counted_at_what_a_run_costs(tight):
    """100 000 stdin/stdout tests at timeout_s 0.001 made 100 s on paper but ~400 s of jail time (each run
    costs ~4 ms however short its limit): the request outlived its own wait (503) and held the tenant's
    lane. Each run now counts at least sandbox.RUN_FLOOR_S, and a reference holds at most 1024 tests."""
    import sandbox
    from verifiers.code.verifier import MAX_TESTS

    c, key = tight
    r = c.post("/v1/verifiers/code/run", json={"items": [stdio_item(MAX_TESTS, "print(1)")],
                                                "config": {"timeout_s": 0.001}}, headers=key)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "items"], r.text
    assert f"{MAX_TESTS * sandbox.RUN_FLOOR_S:g} s" in r.text
    r = c.post("/v1/verifiers/code/run", json={"items": [stdio_item(MAX_TESTS + 1, "print(1)")]}, headers=key)
    assert r.status_code == 200 and r.json()["results"][0]["status"] == "error"  # a bad reference: no run
    assert "at most 1024" in r.json()["results"][0]["reason"]
    with sandbox.budget(0.05) as b:  # the meter counts the same floor for what really ran
        res = sandbox.run_many(["print(1)"] * 20, sandbox.Limits(wall_s=0.001))
    assert sum(x.status is sandbox.Status.ok or x.status is sandbox.Status.timeout for x in res) == 20
    assert b.spent <= 0.05 + sandbox.RUN_FLOOR_S and sum("budget" in x.reason for x in res) >= 14
