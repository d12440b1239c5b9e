"""/v1/verifiers: listing, registration with golden cases, version pinning, dry runs, and containment of
registered verifiers that attack the host (files, environment, sockets, endless loops)."""
from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest

import sandbox
from sandbox import SandboxUnavailable
from service.access.keys import LOCAL_USER
from verifiers import Status
from verifiers.spec import VerifierSpec

REPO = Path(__file__).resolve().parent.parent
ALL = LOCAL_USER.scope  # auth off: the one user sees every tenant's verifiers


@pytest.fixture(scope="module", autouse=True)
def local_sandbox():
    try:
        sandbox.get_backend("local")
    except SandboxUnavailable as e:
        pytest.skip(f"registered verifiers run only in the local sandbox, unavailable here: {e}")


EQ = "def verify(completion, reference, **fields):\n    return 1.0 if completion.strip() == str(reference) else 0.0\n"
GOLDEN = [{"completion": " 4 ", "reference": "4", "expected_score": 1.0},
          {"completion": "5", "reference": "4", "expected_score": 0.0, "expected_status": "wrong"}]


def register(client, name, source, golden=None, **extra):
    return client.post("/v1/verifiers", json={"name": name, "source": source, "golden": golden or GOLDEN, **extra})


def dry_run(client, name, items, **extra):
    r = client.post(f"/v1/verifiers/{name}/run", json={"items": items, **extra})
    assert r.status_code == 200, r.text
    return r.json()["results"]


def only(source: str, **config) -> dict:
    """Dry-run `source` inline (the built-in `python` verifier) on one completion."""
    return {"config": {"source": source, **config}}


# ------------------------------------------------------------------------------------------ listing
def test_list_has_every_builtin_with_version_schema_description(client):
    r = client.get("/v1/verifiers")
    assert r.status_code == 200
    by = {d["name"]: d for d in r.json()["data"]}
    for name in ("math", "code", "format", "string_check", "exact", "multiple_choice", "length_penalty", "multi",
                 "python"):
        assert by[name]["version"] and by[name]["description"] and by[name]["kind"] == "builtin", name
        assert by[name]["config_schema"]["type"] == "object"
    assert "formula" in by["multi"]["config_schema"]["properties"]
    assert r.json()["refused"] == []


# ------------------------------------------------------------------------------------------ registration
def test_register_lists_and_dry_runs(client):
    r = register(client, "eq", EQ, description="exact match")
    assert r.status_code == 201, r.text
    assert r.json()["version"] == 1 and r.json()["golden_passed"] == 2
    entry = next(d for d in client.get("/v1/verifiers").json()["data"] if d["name"] == "eq")
    assert entry["kind"] == "http" and entry["version"] == "1" and entry["description"] == "exact match"
    assert "timeout_s" in entry["config_schema"]["properties"]
    got = client.get("/v1/verifiers/eq").json()
    assert got["source"] == EQ and len(got["golden"]) == 2
    res = dry_run(client, "eq", [{"completion": "4", "reference": "4"}, {"completion": "x", "reference": "4"}])
    assert [(x["score"], x["status"], x["error"]) for x in res] == [(1.0, "correct", None), (0.0, "wrong", None)]
    assert all(0 < x["elapsed_s"] < 10 for x in res)


def test_golden_failure_rejects_listing_the_failing_cases(client):
    src = "def verify(completion, reference, **fields):\n    return 0.5\n"
    golden = [{"completion": "a", "reference": "a", "expected_score": 1.0},
              {"completion": "b", "reference": "a", "expected_score": 0.5},
              {"completion": "c", "reference": "a", "expected_score": 0.5, "expected_status": "correct"}]
    r = register(client, "half", src, golden)
    assert r.status_code == 422
    detail = r.json()["detail"]
    assert [d["loc"] for d in detail] == [["body", "golden", 0], ["body", "golden", 2]]
    assert "score 0.5 != expected 1.0" in detail[0]["msg"]
    assert "status wrong != expected correct" in detail[1]["msg"]
    assert detail[0]["got"]["score"] == 0.5 and detail[0]["expected"] == {"score": 1.0, "status": None}
    assert client.get("/v1/verifiers/half").status_code == 404  # nothing stored


def test_golden_cases_that_crash_reject_with_the_error(client):
    src = "def verify(completion, reference, **fields):\n    return 1 / len(completion)\n"
    r = register(client, "crashy", src, [{"completion": "", "reference": None, "expected_score": 0.0}])
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"] == ["body", "golden", 0]
    assert "runtime_error" in r.json()["detail"][0]["msg"] and "ZeroDivisionError" in r.json()["detail"][0]["msg"]


@pytest.mark.parametrize("source, why", [
    ("def verify(:\n", "SyntaxError"),
    ("x = 1\n", "defines no function verify"),
    ("import not_a_module_anywhere\ndef verify(c, r): return 1\n", "ModuleNotFoundError"),
    ("while True:\n    pass\n", "out of time"),
])
def test_source_that_does_not_load_is_rejected_naming_source(client, source, why):
    r = register(client, "broken", source, config={"timeout_s": 1})
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == ["body", "source"] and why in r.json()["detail"][0]["msg"]


def test_registration_input_errors_are_4xx_naming_the_field(client):
    assert register(client, "math", EQ).status_code == 409  # a built-in's name
    r = client.post("/v1/verifiers", json={"name": "g", "source": EQ, "golden": []})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "golden"]
    r = client.post("/v1/verifiers", json={"name": "bad name!", "source": EQ, "golden": GOLDEN})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "name"]
    r = register(client, "g", EQ, config={"timeout_s": 1000})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "config", "timeout_s"]


# ------------------------------------------------------------------------------------------ versions
V1 = "def verify(completion, reference, **fields):\n    return 1.0 if completion == reference else 0.0\n"
V2 = ("def verify(completion, reference, **fields):\n"
      "    return 1.0 if completion.lower() == reference.lower() else 0.0\n")
CASE = [{"completion": "a", "reference": "a", "expected_score": 1.0}]


def test_reregistering_creates_v2_and_a_job_pinned_to_v1_keeps_v1(client, store):
    from service.jobs.stored_verifiers import pin_job_spec, resolve_job_spec
    from trainer.config import JobSpec
    from trainer.scoring import Scorer

    assert register(client, "ci", V1, CASE).json()["version"] == 1
    submitted, errors = pin_job_spec(JobSpec(verifiers=[{"name": "ci"}, {"name": "math"}]), store.engine, ALL)
    assert errors == [] and submitted.verifiers[0].version == 1 and submitted.verifiers[1].version is None
    stored_spec = submitted.model_dump(mode="json")  # what the job row keeps

    assert register(client, "ci", V2, CASE).json()["version"] == 2
    assert client.get("/v1/verifiers/ci").json()["versions"] == [1, 2]
    item = [{"completion": "A", "reference": "a"}]
    assert dry_run(client, "ci", item)[0]["score"] == 1.0             # latest = v2
    assert dry_run(client, "ci", item, version=1)[0]["score"] == 0.0  # pinned v1

    # the worker resolves the job's pinned version, not the latest
    spec = resolve_job_spec(JobSpec.model_validate(stored_spec), store.engine)
    assert spec.verifiers[0].config["source"] == V1 and spec.verifiers[1].config == {}
    sc = Scorer(spec.verifiers[:1])(["A", "a"], ["a", "a"])
    assert sc.per_verifier["ci"] == [0.0, 1.0]
    # a new job gets v2
    new, _ = pin_job_spec(JobSpec(verifiers=[{"name": "ci"}]), store.engine, ALL)
    assert new.verifiers[0].version == 2


def test_pinning_errors_name_the_field_and_multi_subverifiers_are_pinned(client, store):
    from service.jobs.stored_verifiers import pin_job_spec, resolve_job_spec
    from trainer.config import JobSpec

    assert register(client, "ci2", V1, CASE).status_code == 201
    _, errors = pin_job_spec(JobSpec(verifiers=[{"name": "nope"}, {"name": "ci2", "version": 7}]), store.engine,
                             ALL)
    assert [e["loc"] for e in errors] == [("body", "verifiers", 0, "name"), ("body", "verifiers", 1, "version")]
    bad = [{"name": "ci2", "config": {"timeout_s": 1000}},
           {"name": "multi", "config": {"verifiers": {"a": {"name": "exact"}}, "formula": "a.b"}},
           {"name": "multi", "config": {"verifiers": {"a": {"name": "exact", "config": {"operation": "like"}}}}}]
    _, errors = pin_job_spec(JobSpec(verifiers=bad), store.engine, ALL)
    assert [e["loc"] for e in errors] == [("body", "verifiers", 0, "config"), ("body", "verifiers", 1, "config"),
                                          ("body", "verifiers", 2, "config", "verifiers", "a", "config")]
    assert "timeout_s" in errors[0]["msg"] and "Attribute is not allowed" in errors[1]["msg"]
    multi = {"name": "multi", "config": {"verifiers": {"a": {"name": "ci2"}, "b": {"name": "exact"}},
                                         "formula": "a + b"}}
    pinned, errors = pin_job_spec(JobSpec(verifiers=[multi]), store.engine, ALL)
    assert errors == [] and pinned.verifiers[0].config["verifiers"]["a"]["version"] == 1
    resolved = resolve_job_spec(pinned, store.engine)
    assert resolved.verifiers[0].config["verifiers"]["a"]["config"]["source"] == V1
    from trainer.scoring import Scorer

    assert Scorer(resolved.verifiers)(["a"], ["a"]).rewards == [2.0]


# ------------------------------------------------------------------------------------------ dry run
@pytest.mark.parametrize("source, status, kind, says", [
    ("def verify(c, r, **f):\n    raise ValueError('nope')\n", "error", "runtime_error", "ValueError: nope"),
    ("def verify(c, r, **f):\n    return 'yes'\n", "error", "invalid_return", "str"),
    ("def verify(c, r, **f):\n    return float('nan')\n", "error", "invalid_return", "not JSON"),
    ("def verify(c, r, **f):\n    return {'scor': 1}\n", "error", "invalid_return", "unexpected keys"),
    ("def verify(c, r, **f):\n    return None\n", "unparseable", "unparseable", "None"),
    ("def verify(c, r, **f):\n    return {'score': 0, 'status': 'unparseable', 'reason': 'no number'}\n",
     "unparseable", "unparseable", "no number"),
    ("def verify(c, r, **f):\n    import os\n    os._exit(3)\n", "error", "runtime_error", ""),
    ("def verify(c, r, **f):\n    x = 'x' * (1 << 30)\n    return 1\n", "error", "runtime_error", "memory"),
    ("def verify(c, r, **f):\n    while True:\n        pass\n", "timeout", "timeout", "out of time"),
])
def test_dry_run_error_taxonomy(client, source, status, kind, says):
    t0 = time.monotonic()
    res = dry_run(client, "python", [{"completion": "x"}], **only(source, timeout_s=1, memory_mb=64))[0]
    assert (res["status"], res["error"]["kind"]) == (status, kind), res
    assert says in res["error"]["message"] and res["score"] == 0.0
    assert time.monotonic() - t0 < 15


def test_dry_run_sub_scores_fields_and_prints(client):
    src = ("def verify(completion, reference, *, bonus=0.0, **fields):\n"
           "    print('debug output goes nowhere harmful', completion)\n"
           "    return {'score': 0.5 + bonus, 'sub_scores': {'len': len(completion)}, 'reason': 'ok'}\n")
    res = dry_run(client, "python", [{"completion": "abc", "fields": {"bonus": 0.25}}], **only(src))[0]
    assert (res["score"], res["status"], res["sub_scores"], res["reason"]) == (0.75, "wrong", {"len": 3.0}, "ok")


def test_dry_run_builtins_multi_and_errors(client):
    res = dry_run(client, "multiple_choice", [{"completion": "Answer: B", "reference": "B"},
                                              {"completion": "no idea", "reference": "B"},
                                              {"completion": "Answer: B", "reference": 7}])
    assert [(x["status"], (x["error"] or {}).get("kind")) for x in res] == [
        ("correct", None), ("unparseable", "unparseable"), ("error", "runtime_error")]
    res = dry_run(client, "multi", [{"completion": "<t>x</t> 4", "reference": "4"}],
                  config={"verifiers": {"f": {"name": "format", "config": {"tags": ["t"]}},
                                        "e": {"name": "string_check", "config": {"operation": "contains"}}},
                          "formula": "f * e"})
    assert res[0]["score"] == 1.0 and res[0]["sub_scores"] == {"f": 1.0, "e": 1.0}
    assert client.post("/v1/verifiers/nope/run", json={"items": [{"completion": "x"}]}).status_code == 404
    r = client.post("/v1/verifiers/multi/run", json={"items": [{"completion": "x"}],
                                                      "config": {"verifiers": {"a": {"name": "exact"}},
                                                                 "formula": "a.b"}})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "config"]
    r = client.post("/v1/verifiers/exact/run", json={"items": [{"completion": "x", "fields": {"a": 1}}]})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "items", 0, "fields"]
    r = client.post("/v1/verifiers/exact/run", json={"items": [{"completion": "x"}] * 33})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "items"]


def _specs(dicts):
    return [VerifierSpec.model_validate(d) for d in dicts]


# ------------------------------------------------------------------------------------------ containment
SNOOP = """
import os, glob
def verify(completion, reference, **fields):
    seen = {p: os.path.exists(p) for p in fields["paths"]}
    found = sorted(glob.glob("/home/*") + glob.glob("/root/*") + glob.glob("/work/*"))
    try:
        environ1 = open("/proc/1/environ", "rb").read().decode("latin-1")
    except OSError as e:
        environ1 = "unreadable: " + type(e).__name__
    return {"score": 0.0, "details": {"seen": seen, "found": found, "env": dict(os.environ), "environ1": environ1}}
"""


def test_registered_verifier_cannot_see_files_or_the_callers_environment(client, monkeypatch):
    monkeypatch.setenv("RLVR_TEST_SECRET", "s3cr3t-value-for-the-test")
    paths = ["/etc/shadow", "/etc/passwd", str(REPO / "README.md"), str(REPO / ".venv"),
             os.path.expanduser("~/.ssh"), str(Path(os.environ.get("RLVR_HOME", "~/.rlvr")).expanduser())]
    res = dry_run(client, "python", [{"completion": "x", "fields": {"paths": paths}}], **only(SNOOP))[0]
    assert res["error"] is None, res
    details = res["details"]
    assert details["seen"] == {p: False for p in paths}
    assert details["found"] == []
    assert "s3cr3t" not in json.dumps(details) and "RLVR_TEST_SECRET" not in details["env"]
    # the jail's own minimal environment, nothing inherited from this process
    assert set(details["env"]) <= {"PATH", "LANG", "HOME", "PWD", "LC_CTYPE"}, details["env"]
    assert details["env"].get("HOME") != os.environ.get("HOME")

    reader = "def verify(c, r, **f):\n    return 1.0 if 'root:' in open('/etc/shadow').read() else 0.0\n"
    res = dry_run(client, "python", [{"completion": "x"}], **only(reader))[0]
    assert (res["status"], res["error"]["kind"]) == ("error", "runtime_error")
    assert "FileNotFoundError" in res["error"]["message"] or "PermissionError" in res["error"]["message"]


def test_registered_verifier_cannot_open_sockets(client):
    with socket.socket() as listener:  # a real service on the host's loopback, like Redis on 6379
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.settimeout(0.5)
        port = listener.getsockname()[1]
        src = ("import socket\n"
               "def verify(c, r, **f):\n"
               f"    for port in (6379, {port}):\n"
               "        socket.create_connection(('127.0.0.1', port), timeout=2).close()\n"
               "    return 1.0\n")
        res = dry_run(client, "python", [{"completion": "x"}], **only(src))[0]
        assert (res["status"], res["error"]["kind"], res["score"]) == ("error", "runtime_error", 0.0)
        assert "Error" in res["error"]["message"]  # PermissionError (seccomp) or a connection error
        with pytest.raises(socket.timeout):
            listener.accept()  # nothing ever connected


def test_endless_loop_is_a_timeout_that_blocks_only_its_own_completion(client):
    src = ("def verify(completion, reference, **fields):\n"
           "    while completion == 'hang':\n"
           "        pass\n"
           "    return 1.0\n")
    assert register(client, "hangs", src, [{"completion": "ok", "reference": None, "expected_score": 1.0}],
                    config={"timeout_s": 1}).status_code == 201
    t0 = time.monotonic()
    res = dry_run(client, "hangs", [{"completion": "ok"}, {"completion": "hang"}, {"completion": "fine"}])
    assert [x["status"] for x in res] == ["correct", "timeout", "correct"]
    assert res[1]["error"]["kind"] == "timeout" and res[1]["elapsed_s"] < 5
    assert time.monotonic() - t0 < 20
    r = register(client, "hangs2", src, [{"completion": "hang", "reference": None, "expected_score": 1.0}],
                 config={"timeout_s": 1})
    assert r.status_code == 422 and "timeout" in r.json()["detail"][0]["msg"]


def test_sandboxed_verifier_timeouts_and_crashes_are_measured_per_call():
    from trainer.scoring import Scorer

    src = ("def verify(completion, reference, **fields):\n"
           "    if completion == 'hang':\n"
           "        while True:\n"
           "            pass\n"
           "    if completion == 'boom':\n"
           "        raise RuntimeError('boom')\n"
           "    return {'score': len(completion) / 10, 'sub_scores': {'n': len(completion)}}\n")
    specs = [{"name": "python", "weight": 2.0, "config": {"source": src, "timeout_s": 1}},
             {"name": "exact", "weight": 1.0, "config": {}}]
    comps = ["a" * (i % 7) for i in range(18)] + ["hang", "boom"]
    refs = ["aa"] * len(comps)
    sc = Scorer(_specs(specs))(comps, refs)
    # a crash of the verifier is an infrastructure failure: retried once, then flagged (not a 0 to learn
    # from); a timeout is the verifier's verdict on that completion and stands
    assert sc.statuses["python"]["timeout"] == 1 and sc.statuses["python"]["error"] == 1
    assert sc.retried == 1 and sc.infra == [False] * 19 + [True]
    h = sc.health["python"]
    assert h["latency_p95_s"] > h["latency_p50_s"]  # the hung call's ~1 s pulls the tail, measured per call
    assert sc.verdicts["python"][-2].details["elapsed_s"] >= 0.9
    assert sc.rewards[:18] == pytest.approx([2 * (i % 7) / 10 + (i % 7 == 2) for i in range(18)])


def test_tenants_cannot_replace_or_read_each_others_verifiers(settings, store):
    from fastapi.testclient import TestClient

    from service.access.keys import create_key
    from service.app import create_app

    settings.auth = True
    alice, bob = create_key(store, "alice"), create_key(store, "bob")
    with TestClient(create_app(settings, store)) as c:
        as_ = lambda key: {"Authorization": f"Bearer {key}"}  # noqa: E731
        assert c.get("/v1/verifiers").status_code == 401
        body = {"name": "shared", "source": V1, "golden": CASE}
        assert c.post("/v1/verifiers", json=body, headers=as_(alice)).status_code == 201
        r = c.post("/v1/verifiers", json={**body, "source": V2}, headers=as_(bob))
        assert r.status_code == 409 and "alice" not in r.text  # bob's code must not become v2 of alice's
        assert c.get("/v1/verifiers/shared", headers=as_(bob)).status_code == 404  # private: as if missing
        assert c.get("/v1/verifiers/shared", headers=as_(alice)).json()["source"] == V1
        assert c.post("/v1/verifiers", json={**body, "source": V2}, headers=as_(alice)).json()["version"] == 2


@pytest.mark.parametrize("path, body", [
    ("/v1/verifiers/multi/run",
     {"items": [{"completion": "x"}], "config": {"verifiers": {"a": "str", "b": {"name": 5}}}}),
    ("/v1/verifiers/multi/run",
     {"items": [{"completion": "x"}], "config": {"verifiers": {"a": {"name": "exact", "config": [1]}}}}),
    ("/v1/verifiers/multi/run",
     {"items": [{"completion": "x"}], "config": {"verifiers": {"a": {"name": "g", "version": 10**30}}}}),
    ("/v1/verifiers/multi/run", {"items": [{"completion": "x"}], "config": []}),
    ("/v1/verifiers/python/run",
     {"items": [{"completion": "x"}], "config": {"source": EQ, "correct_threshold": "nan"}}),
    ("/v1/verifiers/ghost/run", {"items": [{"completion": "x"}], "version": 10**30}),
    ("/v1/verifiers", {"name": "a", "source": EQ, "golden": [{"completion": "", "expected_score": "Infinity"}]}),
    ("/v1/verifiers", {"name": "a", "source": EQ, "description": "nul\x00", "golden": GOLDEN}),
])
def test_hostile_verifier_requests_are_4xx(client, path, body):
    r = client.post(path, json=body)
    assert 400 <= r.status_code < 500, r.text
    assert client.get("/v1/verifiers/x", params={"version": 10**30}).status_code == 422


def test_a_plugin_verdict_that_is_not_json_still_gets_a_reply(client):
    from service.jobs.schemas import result_of
    from verifiers import Verdict

    r = result_of(Verdict(float("nan"), Status.correct, "x",
                          {"obj": object(), "sub_scores": {"a": float("inf"), "b": 1},
                                                             "error_kind": "weird", "x": float("nan")}), 0.1)
    assert (r.score, r.status, r.error.kind) == (0.0, Status.error, "invalid_return")
    assert r.sub_scores == {"b": 1.0} and r.details["x"] is None and "object" in r.details["obj"]
    json.dumps(r.model_dump(mode="json"), allow_nan=False)


@pytest.mark.parametrize("field,value", [("memory_mb", 10**9), ("max_output_bytes", 10**12), ("max_rounds", 10**9),
                                         ("timeout_s", 1e9)])
def test_a_dry_runs_code_limits_are_bounded_naming_the_field(client, field, value):
    """Issue 33: memory_mb became the jail's memory limit, unbounded; max_output_bytes and max_rounds too."""
    item = {"completion": "print(1)", "reference": {"tests": [{"stdout": "1"}]}}
    r = client.post("/v1/verifiers/code/run", json={"items": [item], "config": {field: value}})
    err = r.json()["detail"][0]
    assert r.status_code == 422 and err["loc"] == ["body", "config"] and err["msg"].startswith(f"{field}: "), r.text
    assert "less than or equal" in err["msg"]
    grader = {"type": "code", "name": "t", "reference": "{{item.tests}}", "config": {field: value}}
    r = client.post("/v1/fine_tuning/alpha/graders/run", json={"grader": grader, "model_sample": "print(1)",
                                                                "item": {"tests": item["reference"]}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "grader" and field in r.text, r.text
