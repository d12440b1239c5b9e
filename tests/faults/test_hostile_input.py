"""Hostile input never gets a 500, a hang or a stuck job: one test per class of attack, then schemathesis
fuzzing (every operation, and stateful walks along the OpenAPI links into file, verifier and checkpoint
routes). Apps and their homes are built in fixtures, never at import."""
from __future__ import annotations

import json
import logging
import re
import threading
import time

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings as hsettings
from hypothesis.errors import Unsatisfiable

from service.app import create_app
from service.settings import Settings

GOOD = {"name": "t", "train": {"steps": 3, "prompts_per_step": 2}, "rollout": {"group_size": 4}}
ROW = '{"prompt": "1+1", "reference": "2"}'
JSON = {"content-type": "application/json"}


@pytest.fixture(autouse=True)
def no_tracebacks(caplog):
    """Hostile input is the client's fault: nothing here may log a traceback (or a 500)."""
    caplog.set_level(logging.WARNING)
    yield
    bad = [r for r in caplog.records if r.exc_info or "Traceback" in r.getMessage() or "unhandled" in r.getMessage()]
    assert not bad, [r.getMessage()[:300] for r in bad]


def post_raw(client, path: str, text: str, headers=None):
    return client.post(path, content=text.encode("utf-8"), headers={**JSON, **(headers or {})})


def deep(levels: int, leaf: str = "1", key: str | None = "a") -> str:
    if key is None:
        return "[" * levels + leaf + "]" * levels
    return ('{"%s": ' % key) * levels + leaf + "}" * levels


# ------------------------------------------------------------------------------------------ limits
def test_oversized_bodies_are_413_declared_or_chunked(client, settings):
    big = b'{"name": "' + b"x" * (settings.max_body_bytes + 10) + b'"}'
    assert client.post("/v1/jobs", content=big, headers=JSON).status_code == 413

    def chunks():  # no Content-Length: the limit must hold on the stream too
        for _ in range(settings.max_body_bytes // 65536 + 2):
            yield b" " * 65536

    assert client.post("/v1/jobs", content=chunks(), headers=JSON).status_code == 413


def test_upload_over_limit_is_413(tmp_path, models_dir):
    app = create_app(Settings(home=tmp_path, models=models_dir, max_upload_bytes=2048), reaper=False)
    with TestClient(app) as c:
        assert c.post("/v1/files", files={"file": ("d.jsonl", ((ROW + "\n") * 200).encode())}).status_code == 413


@pytest.mark.parametrize("spec,field", [
    ({"rollout": {"group_size": 10_000}}, "group_size"),
    ({"rollout": {"max_new_tokens": 10**9}}, "max_new_tokens"),
    ({"train": {"prompts_per_step": 10**7}}, "prompts_per_step"),
    ({"train": {"steps": -1}}, "steps"),
    ({"name": "tab\tname"}, "name"),
    ({"name": "x" * 10_000}, "name"),
    ({"verifiers": [{"name": "../../etc/passwd"}]}, "name"),
    ({"verifiers": [{"name": "math", "weight": float("inf")}]}, "weight"),
    ({"metadata": {"k": {"nested": 1}}}, "metadata"),
])
def test_out_of_bounds_values_are_422(client, spec, field):
    r = post_raw(client, "/v1/jobs", json.dumps(spec).replace("Infinity", "1e999"))
    assert r.status_code == 422, r.text
    assert any(field in map(str, e["loc"]) for e in r.json()["detail"]), r.json()


def test_unicode_names_are_kept_intact(client):
    r = client.post("/v1/jobs", json={"name": "训练 ✓ émoji 🚀"})
    assert r.status_code == 201 and r.json()["name"] == "训练 ✓ émoji 🚀"


def test_malformed_json_is_422_not_500(client):
    assert post_raw(client, "/v1/jobs", '{"name": ').status_code == 422
    r = client.get("/v1/jobs", params={"after": "!!notacursor"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", "after"]


# ------------------------------------------------------------------------------------------ text
@pytest.mark.parametrize("path,body,where", [
    ("/v1/jobs", '{"name": "x", "metadata": {"k": "\\ud800"}}', ["body", "metadata", "k"]),
    ("/v1/jobs", '{"name": "x", "metadata": {"\\udfff": "v"}}', ["body", "metadata"]),
    ("/v1/jobs", '{"name": "a\\ud800b"}', ["body", "name"]),
    ("/v1/jobs", '{"verifiers": [{"name": "math", "config": {"x": [1, {"y": "\\udc00"}]}}]}',
     ["body", "verifiers", 0, "config", "x", 1, "y"]),
    ("/v1/jobs", '{"name": "nul\\u0000"}', ["body", "name"]),
    ("/v1/verifiers/exact/run", '{"items": [{"completion": "\\ud83d", "reference": "x"}]}',
     ["body", "items", 0, "completion"]),
    ("/v1/verifiers", '{"name": "v", "source": "x", "description": "\\ud800", "golden": []}', ["body", "description"]),
])
def test_lone_surrogates_and_nul_anywhere_are_422_before_anything_is_stored(client, path, body, where):
    r = post_raw(client, path, body)
    assert r.status_code == 422, r.text
    locs = [e["loc"][:len(where)] for e in r.json()["detail"]]
    assert where in locs, r.json()
    assert client.get("/v1/jobs").json()["data"] == []


def test_openai_bodies_with_lone_surrogates_are_400_in_openai_shape(client):
    r = post_raw(client, "/v1/fine_tuning/jobs", '{"model": "builtin:tiny-arith", "training_file": "file-x", '
                 '"metadata": {"team": "\\ud800"}, "method": {"type": "reinforcement"}}')
    assert r.status_code == 400 and r.json()["error"]["param"] == "metadata.team", r.text


def test_one_bad_row_never_breaks_a_list(client, store):
    """Rows stored before input was checked (or by an older server): a lone surrogate, a spec this
    schema no longer accepts, a malformed record — the list still answers, naming what it left out."""
    good = client.post("/v1/jobs", json=GOOD).json()["id"]
    surrogate = store.create_job({**GOOD, "train": {"steps": 3}}, meta={"k": "bad\ud800"}).id
    old_spec = store.create_job({"name": "old", "train": {"steps": 2, "seed": 2**70}}).id
    broken = store.create_job({"name": "broken", "train": {"steps": 2}}, meta=["not", "a", "dict"]).id
    r = client.get("/v1/jobs")
    assert r.status_code == 200, r.text
    body = r.json()
    assert {j["id"] for j in body["data"]} == {good, surrogate, old_spec} and body["unreadable"] == [broken]
    shown = next(j for j in body["data"] if j["id"] == surrogate)
    assert shown["metadata"]["k"] == "bad\ufffd"
    assert next(j for j in body["data"] if j["id"] == old_spec)["spec"] is None
    for job_id in (surrogate, old_spec):
        assert client.get(f"/v1/jobs/{job_id}").status_code == 200
        assert client.get(f"/v1/fine_tuning/jobs/{job_id}").status_code == 200
    assert client.get("/v1/fine_tuning/jobs").status_code == 200
    store.add_event(surrogate, "warning", "odd", detail="odd \udfff text")  # JSON columns keep surrogates
    for path in (f"/v1/jobs/{surrogate}/events", f"/v1/fine_tuning/jobs/{surrogate}/events"):
        r = client.get(path)
        assert r.status_code == 200
        row = r.json()["data"][-1 if "fine" not in path else 0]
        assert "odd \ufffd text" in row["data"]["detail"]
    with client.stream("GET", f"/v1/jobs/{surrogate}/events/stream", params={"timeout": 2}) as r:
        assert r.status_code == 200 and any("odd \ufffd text" in line for line in r.iter_lines())


# ------------------------------------------------------------------------------------------ depth, size
@pytest.mark.parametrize("path,body", [
    ("/v1/verifiers/python/run", '{"items": [{"completion": "x"}], "config": {"source": "x", "fields": %s}}'
     % deep(300)),
    ("/v1/verifiers/multi/run", '{"items": [{"completion": "x"}], "config": %s}'
     % ('{"verifiers": {"a": {"name": "multi", "config": ' * 150 + '{"verifiers": {"b": {"name": "exact"}}}'
        + "}}}" * 150)),
    ("/v1/jobs", '{"verifiers": [{"name": "multi", "config": %s}]}'
     % ('{"verifiers": {"a": {"name": "multi", "config": ' * 150 + '{"verifiers": {"b": {"name": "exact"}}}'
        + "}}}" * 150)),
    ("/v1/fine_tuning/alpha/graders/run", '{"grader": %s, "model_sample": "x"}'
     % ('{"type": "multi", "graders": {"g": ' * 150 + '{"type": "string_check"}' + "}}" * 150)),
    ("/v1/fine_tuning/alpha/graders/validate", '{"grader": {"type": "math", "config": %s}}' % deep(300)),
    ("/v1/verifiers", '{"name": "v", "source": "x", "golden": [{"completion": "x", "expected_score": 1, '
     '"reference": %s}]}' % deep(5000, key=None)),
])
def test_deep_nesting_is_4xx_naming_the_limit(client, path, body):
    r = post_raw(client, path, body)
    assert 400 <= r.status_code < 500, r.text[:500]
    assert "64 levels" in r.text, r.text[:500]


@pytest.mark.parametrize("literal", ["1" * 5000, "-" + "9" * 4400, str(2**64), str(-(2**63) - 1)])
def test_huge_integers_in_bodies_are_4xx_naming_the_limit(client, literal):
    for path, body in [("/v1/jobs", '{"train": {"seed": %s}}'),
                       ("/v1/verifiers/exact/run", '{"items": [{"completion": "x", "reference": %s}]}'),
                       ("/v1/fine_tuning/jobs", '{"model": "m", "training_file": "file-x", "seed": %s}')]:
        r = post_raw(client, path, body % literal)
        assert 400 <= r.status_code < 500, (path, r.text[:300])
        assert "64-bit" in r.text, r.text[:300]


@pytest.mark.parametrize("line,why", [
    (deep(3000, key=None), "64 levels"), (deep(5000, leaf='"x"'), "64 levels"), (deep(900), "64 levels"),
    ('{"prompt": "p", "reference": %s}' % ("7" * 5000), "integer"),
    ('{"prompt": "p", "reference": %s}' % (2**70), "64-bit"),
    ('{"prompt": "p", "reference": NaN}', "finite"),
    ('{"prompt": "p", "reference": "\\ud800"}', "surrogate"),
])
def test_hostile_jsonl_lines_are_400_naming_the_line_and_limit(client, line, why):
    body = (ROW + "\n" + line + "\n").encode()
    r = client.post("/v1/files", files={"file": ("d.jsonl", body)})
    assert r.status_code == 400, r.text[:300]  # /v1/files answers in OpenAI's error shape
    assert r.json()["error"]["param"] == "file"
    msg = r.json()["error"]["message"]
    assert why in msg and "line" in msg, msg
    assert client.get("/v1/files").json()["data"] == []


def test_malformed_jsonl_upload_names_the_lines(client):
    # rows are checked one by one (every bad row named); the reader stops at the first line that is not JSON
    body = '{"prompt": "1+1", "reference": "2"}\n{"reference": "3"}\n[1, 2]\n{"prompt": \n{"prompt": 1}\n'
    r = client.post("/v1/files", files={"file": ("d.jsonl", body.encode())}, data={"purpose": "fine-tune"})
    assert r.status_code == 400
    msgs = r.json()["error"]["message"].split("; ")  # every bad line, each "file: line N: …"
    assert any(m.startswith("file: line 2:") and "prompt" in m for m in msgs), msgs
    assert any(m.startswith("file: line 3:") for m in msgs), msgs
    assert any(m.startswith("file: line 4: invalid JSON") for m in msgs), msgs
    assert client.get("/v1/files").json()["data"] == []


def test_non_utf8_and_empty_uploads_are_400(client):
    r = client.post("/v1/files", files={"file": ("d.jsonl", b"\xff\xfe\x00")})
    assert r.status_code == 400 and "UTF-8" in r.json()["error"]["message"]
    assert client.post("/v1/files", files={"file": ("d.jsonl", b"\n\n")}).status_code == 400


@pytest.mark.parametrize("sep",
                         ["\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029", "\x0b", "\x0c", "\r", "\r\n", "\n"])
def test_upload_check_and_job_reader_agree_on_every_line_separator(client, store, sep):
    """str.splitlines breaks at \\x1c and friends, a file read line by line does not: the upload is
    checked by the job's own reader, so what the upload accepts is exactly what the job reads."""
    from service.jobs.files import get_file
    from trainer.data import load_jsonl

    r = client.post("/v1/files", files={"file": ("d.jsonl", (ROW + sep + ROW + "\n").encode())})
    if r.status_code == 400:
        assert sep not in ("\r", "\r\n", "\n")  # real line breaks are never refused
        return
    assert r.status_code == 201, r.text
    rows = load_jsonl(get_file(store, r.json()["id"], None).path)  # what a job with this file reads
    assert len(rows) == r.json()["lines"] == 2
    assert client.post("/v1/jobs", json={**GOOD, "data": {"dataset": r.json()["id"]}}).status_code == 201


# ------------------------------------------------------------------------------------------ numbers
@pytest.mark.parametrize("patch,loc", [
    ('{"optim": {"max_grad_norm": Infinity}}', ["body", "optim", "max_grad_norm"]),
    ('{"optim": {"max_grad_norm": 1e999}}', ["body", "optim", "max_grad_norm"]),
    ('{"model": {"lora": {"alpha": Infinity}}}', ["body", "model", "lora", "alpha"]),
    ('{"algorithm": "ppo", "ppo": {"value_clip": Infinity}}', ["body", "ppo", "value_clip"]),
    ('{"algorithm": "ppo", "ppo": {"gamma": NaN}}', ["body", "ppo", "gamma"]),
    ('{"optim": {"lr": -Infinity}}', ["body", "optim", "lr"]),
    ('{"train": {"seed": %d}}' % 2**70, ["body", "train", "seed"]),
    ('{"train": {"eval_every": %d}}' % 2**64, ["body", "train", "eval_every"]),
])
def test_non_finite_floats_and_out_of_range_ints_are_422_naming_the_field(client, patch, loc):
    r = post_raw(client, "/v1/jobs", patch)
    assert r.status_code == 422, r.text
    assert loc in [e["loc"] for e in r.json()["detail"]], r.json()
    assert client.get("/v1/jobs").json()["data"] == []


@pytest.mark.parametrize("data",
                         [{"optim": {"max_grad_norm": float("inf")}}, {"model": {"lora": {"alpha": float("nan")}}},
                                  {"algorithm": "ppo", "ppo": {"value_clip": float("inf")}},
                                  {"train": {"seed": 2**70}}])
def test_the_job_spec_itself_refuses_them_for_yaml_specs_too(data):
    from pydantic import ValidationError

    from trainer.config import JobSpec

    with pytest.raises(ValidationError):
        JobSpec.model_validate(data)


# ------------------------------------------------------------------------------------------ query, headers
def _routes_with_int_queries(app):
    doc = app.openapi()
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            for p in op.get("parameters", []):
                schema = p.get("schema", {})
                types = {schema.get("type")} | {s.get("type") for s in schema.get("anyOf", [])}
                if p["in"] == "query" and ("integer" in types or p["name"] == "after"):
                    yield method.upper(), path, p["name"]


@pytest.mark.parametrize("value", [str(2**64), str(-(2**70)), "9" * 5000, "²", "١٢", "１２", "12abc", "1e3", " ", "-"])
def test_every_integer_query_parameter_refuses_overflows_and_unicode_digits(client, value):
    job = client.post("/v1/jobs", json=GOOD).json()["id"]
    routes = list(_routes_with_int_queries(client.app))
    assert len(routes) >= 8
    for method, path, name in routes:
        concrete = path.replace("{job_id}", job).replace("{name}", "math").replace("{file_id}", "file-x")
        r = client.request(method, concrete, params={name: value}, json={"items": [{"completion": "x"}]},
                           headers={"last-event-id": "0"})
        assert 400 <= r.status_code < 500 or (r.status_code == 200 and value.strip() in ("", "-")
                                              and name == "after"), \
            (method, path, name, value, r.status_code, r.text[:200])


@pytest.mark.parametrize("value", ["²", "abc", str(2**70), "-1", "1.5", "9" * 40])
def test_last_event_id_must_be_a_plain_integer(client, value):
    job = client.post("/v1/jobs", json=GOOD).json()["id"]
    client.post(f"/v1/jobs/{job}/cancel")
    r = client.get(f"/v1/jobs/{job}/events/stream", headers={"Last-Event-ID": value.encode("utf-8")})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["header", "Last-Event-ID"], r.text


def test_sse_stream_of_a_job_deleted_meanwhile_ends_cleanly(client):
    job = client.post("/v1/jobs", json=GOOD).json()["id"]  # queued: the stream stays open
    lines: list[str] = []

    def delete_soon():
        time.sleep(1.0)
        assert client.delete(f"/v1/jobs/{job}").status_code == 204

    deleter = threading.Thread(target=delete_soon)
    deleter.start()
    with client.stream("GET", f"/v1/jobs/{job}/events/stream", params={"timeout": 60}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            lines.append(line)
    deleter.join(10)
    assert "event: end" in lines and 'data: {"reason": "deleted"}' in lines, lines[-5:]


# ------------------------------------------------------------------------------------------ OpenAI bodies
GRADER = {"type": "string_check", "name": "g", "input": "{{sample.output_text}}", "reference": "{{item.answer}}",
          "operation": "eq"}


def _ft(**over):
    body = {"model": "builtin:tiny-arith", "training_file": "file-abc", "seed": 1,
            "method": {"type": "reinforcement", "reinforcement": {"grader": GRADER}}}
    body.update(over)
    return body


def _rl(**over):
    return {"type": "reinforcement", "reinforcement": {"grader": GRADER, **over}}


@pytest.mark.parametrize("body,param", [
    (_ft(seed="abc"), "seed"), (_ft(seed=1.5), "seed"), (_ft(seed=True), "seed"), (_ft(seed=2**40), "seed"),
    (_ft(seed=-1), "seed"),
    (_ft(method="reinforcement"), "method"), (_ft(method={"type": "supervised"}), "method.type"),
    (_ft(method={"type": "reinforcement", "reinforcement": "x"}), "method.reinforcement"),
    (_ft(method={"type": "reinforcement"}), "method.reinforcement"),
    (_ft(metadata=[1]), "metadata"), (_ft(metadata={"k": 1}), "metadata.k"), (_ft(metadata="x"), "metadata"),
    (_ft(validation_file=5), "validation_file"), (_ft(validation_file="../../etc/passwd"), "validation_file"),
    (_ft(training_file=None), "training_file"), (_ft(model=5), "model"), (_ft(model="m" * 300), "model"),
    (_ft(model="a\nb"), "model"), (_ft(suffix="s" * 65), "suffix"),
                                        (_ft(integrations=[{"type": "wandb"}]), "integrations"),
    (_ft(hyperparameters={"n_epochs": 1}), "hyperparameters"), (_ft(warp=1), "warp"),
    (_ft(method=_rl(hyperparameters={"learning_rate_multiplier": "inf"})),
     "method.reinforcement.hyperparameters.learning_rate_multiplier"),
    (_ft(method=_rl(hyperparameters={"n_epochs": "3"})), "method.reinforcement.hyperparameters.n_epochs"),
    (_ft(method=_rl(hyperparameters={"batch_size": 10**6})), "method.reinforcement.hyperparameters.batch_size"),
    (_ft(method=_rl(hyperparameters={"compute_multiplier": -1})),
     "method.reinforcement.hyperparameters.compute_multiplier"),
    (_ft(method=_rl(hyperparameters=[1])), "method.reinforcement.hyperparameters"),
    (_ft(method=_rl(hyperparameters={"warp": 1})), "method.reinforcement.hyperparameters.warp"),
    (_ft(method={"type": "reinforcement", "reinforcement": {"grader": "x"}}), "method.reinforcement.grader"),
    (_ft(method={"type": "reinforcement", "reinforcement": {"grader": {"type": "score_model"}}}),
     "method.reinforcement.grader.type"),
    (_ft(method={"type": "reinforcement", "reinforcement": {"grader": {**GRADER, "operation": 5}}}),
     "method.reinforcement.grader.operation"),
    (_ft(method={"type": "reinforcement", "reinforcement": {"grader": {**GRADER, "reference": 7}}}),
     "method.reinforcement.grader.reference"),
    (_ft(method={"type": "reinforcement", "reinforcement": {"grader": {"type": "python", "source": 5}}}),
     "method.reinforcement.grader.source"),
    (_ft(method={"type": "reinforcement", "reinforcement": {"grader": {
        "type": "multi", "graders": {"a": {**GRADER, "operation": "regex"}}}}}),
     "method.reinforcement.grader.graders.a.operation"),
])
def test_openai_job_bodies_with_wrong_types_are_400_naming_the_parameter(client, body, param):
    r = client.post("/v1/fine_tuning/jobs", json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error" and err["message"], err


@pytest.mark.parametrize("raw,param", [
    ('{"model": "m", "training_file": "file-x", "method": {"type": "reinforcement", "reinforcement": {"grader": '
     '{"type": "string_check"}, "hyperparameters": {"learning_rate_multiplier": 1e999}}}}',
     "method.reinforcement.hyperparameters.learning_rate_multiplier"),
    ('{"model": "m", "training_file": "file-x", "seed": NaN}', "seed"),
])
def test_openai_non_finite_numbers_are_400_naming_the_parameter(client, raw, param):
    r = post_raw(client, "/v1/fine_tuning/jobs", raw)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


@pytest.mark.parametrize("body,param", [
    ({"grader": {"type": "string_check", "operation": 1}, "model_sample": "x"}, "grader.operation"),
    ({"grader": GRADER, "model_sample": 5}, "model_sample"),
    ({"grader": GRADER, "model_sample": "x", "item": [1]}, "item"),
    ({"grader": GRADER, "model_sample": "x", "item": {}}, "item"),
    ({"grader": {"type": "nope"}, "model_sample": "x"}, "grader.type"),
])
def test_openai_grader_run_bodies_are_400_naming_the_parameter(client, body, param):
    r = client.post("/v1/fine_tuning/alpha/graders/run", json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


# ------------------------------------------------------------------------------------------ fuzzing
TENANT_KEY = "rlvr_fuzz-tenant-key"
AUTH = {"Authorization": f"Bearer {TENANT_KEY}"}


@pytest.fixture
def fuzz_app(tmp_path, models_dir):
    """Auth on, one tenant whose key the fuzzer uses, with a finished job and its checkpoint, an
    uploaded file and a registered verifier already there, so links lead into real resources."""
    from service.access.keys import _hash
    from service.store.tables import ApiKey

    settings = Settings(home=tmp_path / "home", models=models_dir, auth=True, admin_key="fuzz-admin-key-xx",
                        max_body_bytes=64 * 1024, max_upload_bytes=64 * 1024)
    app = create_app(settings, reaper=False)
    with app.state.store.Session.begin() as s:
        s.add(ApiKey(tenant="fuzzer", key_hash=_hash(TENANT_KEY), admin=False))
    seed(app)
    return app


def seed(app) -> dict[str, str]:
    """A finished job with metrics and a checkpoint on disk, an upload and a registered verifier, all the
    fuzzing tenant's (fuzzers delete things: each scenario seeds afresh). Returns their ids."""
    from service.jobs.files import store_upload
    from service.jobs.stored_verifiers import VerifierStore
    from service.store.jobs import JobStatus

    store, home = app.state.store, app.state.settings.home_dir
    job = store.create_job({**GOOD, "name": "seeded"}, tenant="fuzzer")
    ckpt = home / "runs" / job.id / "checkpoints" / "step-0000002"
    ckpt.mkdir(parents=True)
    (ckpt / "config.json").write_text("{}")
    store.claim(job.id, "fuzz-worker", 60, str(ckpt.parent.parent))
    store.put_checkpoint(job.id, 2, ckpt.name, str(ckpt), {"eval/accuracy": 0.5})
    store.put_metrics(job.id, 1, {"reward/mean": 0.5}, owner="fuzz-worker")
    store.finish(job.id, "fuzz-worker", JobStatus.succeeded, result={"checkpoint": ckpt.name, "steps": 2})
    f, errors = store_upload(store, home / "files", "fuzzer", "d.jsonl", "fine-tune", (ROW + "\n").encode())
    assert not errors
    VerifierStore(store.engine).create("seeded_v", "def verify(c, r, **f):\n    return 1.0\n", tenant="fuzzer",
                                       config={"timeout_s": 1.0})
    return {"job_id": job.id, "file_id": f.id, "checkpoint": ckpt.name, "verifier": "seeded_v"}


def _real_ids(op, ids: dict[str, str]) -> dict[str, str]:
    """Path parameters of ``op`` filled with seeded resources, so fuzzed queries and bodies reach the
    database and the verifiers instead of stopping at a 404."""
    names = {p.name for p in op.path_parameters}
    out = {k: ids[k] for k in ("job_id", "file_id") if k in names}
    if "name" in names:
        out["name"] = ids["checkpoint"] if "checkpoints" in op.path else ids["verifier"]
    return out


EXTREMES = [2**63, 2**64, -(2**63) - 1, 10**30, "9" * 5000, "²", "１２", "-0", " 7"]


def _with_extremes(strategy, int_params: list[str]):
    """Hypothesis rarely draws integers past 64 bits from an unbounded schema; mix them in on purpose so
    a forgotten bound is found (half of the examples carry one in some integer query parameter)."""
    from hypothesis import strategies as st

    if not int_params:
        return strategy

    def put(case, name, value):
        case.query = {**(case.query or {}), name: value}
        return case

    return st.one_of(strategy, st.builds(put, strategy, st.sampled_from(int_params), st.sampled_from(EXTREMES)))


def test_fuzzed_requests_never_get_a_server_error(fuzz_app):
    """Every operation, valid and invalid inputs (schemathesis' positive and negative modes), as the tenant,
    on real resources and on made-up ids. (Hypothesis is driven per operation from here: schemathesis'
    pytest fixture loader does not run on this pytest.)"""
    from schemathesis.generation.modes import GenerationMode

    schema = schemathesis.openapi.from_asgi("/openapi.json", fuzz_app, headers=AUTH)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) > 30
    int_queries: dict[tuple[str, str], list[str]] = {}
    for method, path, name in _routes_with_int_queries(fuzz_app):
        int_queries.setdefault((method, path), []).append(name)
    statuses: dict[str, set[int]] = {}
    for op in operations:
        for mode, real in ((GenerationMode.POSITIVE, True), (GenerationMode.NEGATIVE, True),
                           (GenerationMode.NEGATIVE, False)):
            path_parameters = _real_ids(op, seed(fuzz_app)) if real else None
            if real and not path_parameters and mode is GenerationMode.NEGATIVE and op.path_parameters:
                continue

            @hsettings(max_examples=40, deadline=None, database=None, suppress_health_check=list(HealthCheck))
            @given(_with_extremes(op.as_strategy(mode, path_parameters=path_parameters),
                                  int_queries.get((op.method.upper(), op.path), [])))
            def call(case):
                r = case.call(headers=AUTH)
                statuses.setdefault(f"{case.method} {case.path}", set()).add(r.status_code)
                assert r.status_code < 500, (case.method, case.formatted_path, case.query, case.body, r.text[:500])

            try:
                call()
            except Unsatisfiable:  # nothing to make invalid (no parameters, no body)
                assert mode is GenerationMode.NEGATIVE, op.label
    assert len(statuses) == len(operations)
    for key in ("GET /v1/jobs/{job_id}/metrics", "GET /v1/files/{file_id}/content", "POST /v1/verifiers/{name}/run",
                "GET /v1/jobs/{job_id}/checkpoints/{name}/download"):
        assert any(st < 300 for st in statuses[key]), (key, statuses[key])


def _walk(app, schema, examples: int) -> set[tuple[str, str, int]]:
    """Stateful schemathesis run along the OpenAPI links; every response checked, (method, path, status) seen."""
    seen: set[tuple[str, str, int]] = set()

    class Walk(schema.as_state_machine()):
        def setup(self):
            seed(app)

        def get_call_kwargs(self, case):
            return {"headers": AUTH}

        def validate_response(self, response, case, **kwargs):
            seen.add((case.method.upper(), case.path, response.status_code))
            assert response.status_code < 500, (case.method, case.formatted_path, case.body, response.text[:500])

    # derandomize: the same walk every run, so whether it reaches a route is a property of the code (a
    # random walk reached POST /v1/verifiers/{name}/run in most runs, not all)
    Walk.run(settings=hsettings(max_examples=examples, stateful_step_count=5, deadline=None, database=None,
                                derandomize=True, suppress_health_check=list(HealthCheck)))
    return seen


def test_stateful_fuzzing_along_openapi_links_reaches_files_verifiers_and_checkpoints(fuzz_app):
    """Walks the OpenAPI links (service/http/openapi_links.py) over the whole API, then per resource family,
    which must reach its item routes with real ids (2xx), not only 404s for made-up ones."""
    schema = lambda: schemathesis.openapi.from_asgi("/openapi.json", fuzz_app, headers=AUTH)  # noqa: E731
    assert len(_walk(fuzz_app, schema(), 60)) > 20
    families = {
        "checkpoints": (dict(method="GET", path_regex=r"^/v1/jobs($|/\{job_id\}/checkpoints)"),
                        [("GET", "/v1/jobs/{job_id}/checkpoints"),
                         ("GET", "/v1/jobs/{job_id}/checkpoints/{name}/download")]),
        "files": (dict(path_regex=r"^/v1/files"),
                  [("GET", "/v1/files/{file_id}"), ("GET", "/v1/files/{file_id}/content"),
                   ("DELETE", "/v1/files/{file_id}")]),
        "verifiers": (dict(path_regex=r"^/v1/verifiers"),
                      [("GET", "/v1/verifiers/{name}"), ("POST", "/v1/verifiers/{name}/run")]),
    }
    for family, (include, needed) in families.items():
        seen = _walk(fuzz_app, schema().include(**include), 40)
        ok = {(m, p) for m, p, st in seen if 200 <= st < 300}
        for route in needed:
            assert route in ok, (family, route, sorted(seen))


def test_openapi_document_carries_links_for_files_verifiers_and_checkpoints(fuzz_app):
    doc = fuzz_app.openapi()
    links = {name: link["operationRef"] for path in doc["paths"].values() for op in path.values()
             for resp in op.get("responses", {}).values() for name, link in resp.get("links", {}).items()}
    refs = set(links.values())
    for target in ("/v1/files/{file_id}", "/v1/verifiers/{name}/run", "/v1/jobs/{job_id}/checkpoints/{name}/download"):
        assert any(re.sub("~1", "/", r).startswith("#/paths/" + target) for r in refs), target
