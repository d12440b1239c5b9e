"""Hostile input never gets a 500, a hang or a stuck job: explicit cases, then schemathesis fuzzing."""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, settings as hsettings

from service.app import create_app
from service.settings import Settings

_HOME = Path(tempfile.mkdtemp(prefix="rlvr-fuzz-"))
_APP = create_app(Settings(home=_HOME, max_body_bytes=64 * 1024, max_upload_bytes=64 * 1024), reaper=False)
schema = schemathesis.openapi.from_asgi("/openapi.json", _APP)


@schema.parametrize()
@hsettings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_fuzzed_requests_never_get_a_server_error(case):
    response = case.call()
    assert response.status_code < 500, (case.method, case.path, case.body, response.text[:500])


def test_oversized_bodies_are_413_declared_or_chunked(client, settings):
    big = b'{"name": "' + b"x" * (settings.max_body_bytes + 10) + b'"}'
    assert client.post("/v1/jobs", content=big, headers={"content-type": "application/json"}).status_code == 413

    def chunks():  # no Content-Length: the limit must hold on the stream too
        for _ in range(settings.max_body_bytes // 65536 + 2):
            yield b" " * 65536

    r = client.post("/v1/jobs", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413


def test_malformed_jsonl_upload_names_the_lines(client):
    # rows are checked one by one (every bad row named); the reader stops at the first line that is not JSON
    body = '{"prompt": "1+1", "reference": "2"}\n{"reference": "3"}\n[1, 2]\n{"prompt": \n{"prompt": 1}\n'
    r = client.post("/v1/files", files={"file": ("d.jsonl", body.encode())}, data={"purpose": "fine-tune"})
    assert r.status_code == 422
    msgs = [e["msg"] for e in r.json()["detail"]]
    assert any(m.startswith("line 2:") and "prompt" in m for m in msgs), msgs
    assert any(m.startswith("line 3:") for m in msgs), msgs
    assert any(m.startswith("line 4: invalid JSON") for m in msgs), msgs
    assert client.get("/v1/files").json()["data"] == []


def test_non_utf8_and_empty_uploads_are_422(client):
    r = client.post("/v1/files", files={"file": ("d.jsonl", b"\xff\xfe\x00")})
    assert r.status_code == 422 and "UTF-8" in r.text
    assert client.post("/v1/files", files={"file": ("d.jsonl", b"\n\n")}).status_code == 422


def test_upload_over_limit_is_413(tmp_path, models_dir):
    from fastapi.testclient import TestClient

    app = create_app(Settings(home=tmp_path, models=models_dir, max_upload_bytes=2048), reaper=False)
    row = json.dumps({"prompt": "1+1", "reference": "2"}) + "\n"
    with TestClient(app) as c:
        r = c.post("/v1/files", files={"file": ("d.jsonl", (row * 200).encode())})
        assert r.status_code == 413


@pytest.mark.parametrize("spec,field", [
    ({"rollout": {"group_size": 10_000}}, "group_size"),
    ({"rollout": {"max_new_tokens": 10**9}}, "max_new_tokens"),
    ({"train": {"prompts_per_step": 10**7}}, "prompts_per_step"),
    ({"train": {"steps": -1}}, "steps"),
    ({"name": "tab\tname"}, "name"),
    ({"name": "x" * 10_000}, "name"),
    ({"verifiers": [{"name": "../../etc/passwd"}]}, "name"),
    ({"verifiers": [{"name": "math", "weight": float("inf")}]}, None),
    ({"metadata": {"k": {"nested": 1}}}, "metadata"),
])
def test_out_of_bounds_values_are_422(client, spec, field):
    r = client.post("/v1/jobs", content=json.dumps(spec).replace("Infinity", "1e999"),
                    headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    if field:
        assert any(field in map(str, e["loc"]) for e in r.json()["detail"]), r.json()


def test_unicode_names_are_kept_intact(client):
    r = client.post("/v1/jobs", json={"name": "训练 ✓ émoji 🚀"})
    assert r.status_code == 201 and r.json()["name"] == "训练 ✓ émoji 🚀"


def test_malformed_json_is_422_not_500(client):
    r = client.post("/v1/jobs", content=b'{"name": ', headers={"content-type": "application/json"})
    assert r.status_code == 422
    r = client.get("/v1/jobs", params={"after": "!!notacursor"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", "after"]
