"""Every error under /v1/fine_tuning, /v1/files and /v1/models is OpenAI's {"error": {message, type, param,
code}} with OpenAI's status codes (service/openai_compat/errors.py); native routes keep FastAPI's {"detail"}."""
from __future__ import annotations

import json
import re

import pytest
from fastapi.testclient import TestClient

from tests.test_access_control import flat_routes

ADMIN = "openai-errors-admin-key"
ROWS = "".join(json.dumps({"messages": [{"role": "user", "content": f"{a}+1"}], "answer": str(a + 1)}) + "\n"
               for a in range(4))
GRADER = {"type": "string_check", "input": "{{sample.output_text}}", "reference": "{{item.answer}}"}


@pytest.fixture
def api(tmp_path, models_dir):
    from service.access.keys import create_key
    from service.app import create_app
    from service.settings import Settings

    app = create_app(Settings(home=tmp_path / "home", models=models_dir, auth=True, admin_key=ADMIN,
                              max_body_bytes=4096), reaper=False)
    with TestClient(app, raise_server_exceptions=False) as c:
        c.headers["Authorization"] = "Bearer " + create_key(app.state.store, "acme")
        yield c, app


def openai_error(r, status: int, param: str | None = "any") -> dict:
    assert r.status_code == status, (r.status_code, r.text[:300])
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    if param != "any":
        assert body["error"]["param"] == param, body
    return body["error"]


def _openai_routes(app):
    for route in flat_routes(app.routes):
        if re.match(r"^/v1/(fine_tuning|files|models)", getattr(route, "path", "")):
            for method in sorted(route.methods - {"HEAD"}):
                yield method, re.sub(r"\{[^}]+\}", "file-missing0", route.path)


def test_every_openai_route_answers_errors_in_openai_shape(api):
    c, app = api
    routes = list(_openai_routes(app))
    assert len(routes) >= 17
    for method, path in routes:
        anonymous = c.request(method, path, headers={"Authorization": ""})
        assert openai_error(anonymous, 401)["code"] == "invalid_api_key"
        r = c.request(method, path, params={"bogus": "1"})
        assert openai_error(r, 400, "bogus"), (method, path)
        if method == "GET" and "missing0" in path:  # a made-up id: 404, never a 200 or a 500
            openai_error(c.get(path), 404)
        if method == "POST" and "missing0" not in path:  # an empty body: 400 naming what is missing
            r = c.post(path, json={})
            assert openai_error(r, 400)["param"], (path, r.text)
    for path in ("/v1/fine_tuning/nope", "/v1/files/x/y/z", "/v1/models"):
        r = c.delete(path) if path == "/v1/models" else c.get(path)
        assert openai_error(r, 405 if path == "/v1/models" else 404)
    openai_error(c.post("/v1/fine_tuning/jobs", content=b"{" + b" " * 5000 + b"}",
                        headers={"content-type": "application/json"}), 413)
    # native routes keep their own shape
    assert c.get("/v1/jobs/job-missing").json() == {"detail": "job 'job-missing' not found"}
    assert "detail" in c.get("/v1/nope").json() and "detail" in c.get("/v1/jobs", headers={"Authorization": ""}).json()


def test_missing_and_bad_items_name_the_parameter(api):
    c, _ = api
    assert openai_error(c.get("/v1/fine_tuning/jobs/job-nope"), 404, "id")["code"] == "job_not_found"
    assert openai_error(c.get("/v1/files/file-nope"), 404, "id")["message"] == "No such File object: file-nope"
    assert openai_error(c.get("/v1/models/ft:x:job-nope"), 404, "model")["code"] == "model_not_found"
    openai_error(c.get("/v1/fine_tuning/jobs", params={"limit": 0}), 400, "limit")
    r = c.post("/v1/files", files={"file": ("d.jsonl", b'{"prompt": 1}\n[2]\n')})
    err = openai_error(r, 400, "file")
    assert "line 1" in err["message"] and "line 2" in err["message"]  # every bad line named
    openai_error(c.post("/v1/files", files={"file": ("d.jsonl", ROWS.encode())}, data={"purpose": "x"}), 400,
                 "purpose")


@pytest.mark.parametrize("hp,param", [
    ({"eval_samples": 5}, "method.reinforcement.hyperparameters.eval_samples"),
    ({"reasoning_effort": "high"}, "method.reinforcement.hyperparameters.reasoning_effort"),
    ({"warp": 9}, "method.reinforcement.hyperparameters.warp"),
])
def test_unsupported_hyperparameters_are_400s_naming_them_and_defaults_pass(api, hp, param):
    c, _ = api
    fid = c.post("/v1/files", files={"file": ("rft.jsonl", ROWS.encode())}).json()["id"]
    body = {"model": "builtin:tiny-arith", "training_file": fid,
            "method": {"type": "reinforcement", "reinforcement": {"grader": GRADER, "hyperparameters": hp}}}
    err = openai_error(c.post("/v1/fine_tuning/jobs", json=body), 400, param)
    assert "not supported" in err["message"] or "Extra inputs" in err["message"]
    body["method"]["reinforcement"]["hyperparameters"] = {"eval_samples": "auto", "reasoning_effort": "default"}
    assert c.post("/v1/fine_tuning/jobs", json=body).status_code == 200


def test_jobs_list_filters_by_metadata_and_refuses_what_it_does_not_read(api):
    c, _ = api
    fid = c.post("/v1/files", files={"file": ("rft.jsonl", ROWS.encode())}).json()["id"]
    ids = {}
    for team in ("math", "code"):
        ids[team] = c.post("/v1/fine_tuning/jobs", json={
            "model": "builtin:tiny-arith", "training_file": fid, "metadata": {"team": team},
            "method": {"type": "reinforcement", "reinforcement": {"grader": GRADER}}}).json()["id"]
    openai_error(c.get(f"/v1/fine_tuning/jobs/{ids['math']}/events", params={"after": "²"}), 400, "after")
    for cursor in ("-", "ftckpt-x-", " ", "ftckpt-x-²"):  # a checkpoint cursor without a step: 400, never a 500
        openai_error(c.get(f"/v1/fine_tuning/jobs/{ids['math']}/checkpoints", params={"after": cursor}), 400, "after")
    page = c.get(f"/v1/fine_tuning/jobs/{ids['math']}/checkpoints", params={"after": f"ftckpt-{ids['math']}-5"})
    assert page.status_code == 200 and page.json()["data"] == []
    listed = c.get("/v1/fine_tuning/jobs", params={"metadata[team]": "math"}).json()["data"]
    assert [j["id"] for j in listed] == [ids["math"]]
    assert len(c.get("/v1/fine_tuning/jobs").json()["data"]) == 2
    openai_error(c.get("/v1/fine_tuning/jobs", params={"status": "running"}), 400, "status")


def test_an_unexpected_failure_is_a_500_in_openai_shape_without_a_traceback(api, monkeypatch):
    c, _ = api

    def broken(*a, **kw):
        raise RuntimeError("secret internals at /srv/rlvr")

    monkeypatch.setattr("service.api.models.catalog", broken)
    err = openai_error(c.get("/v1/models"), 500)
    assert err["type"] == "server_error" and "secret" not in err["message"] and "/srv" not in err["message"]


def test_files_list_is_openais_cursor_page(api):
    c, _ = api
    ids = [c.post("/v1/files", files={"file": (f"{i}.jsonl", ROWS.encode())},
                  data={"purpose": "fine-tune" if i < 2 else "eval"}).json()["id"] for i in range(3)]
    page = c.get("/v1/files", params={"limit": 2}).json()
    assert [f["id"] for f in page["data"]] == ids[::-1][:2] and page["has_more"] and page["last_id"] == ids[1]
    rest = c.get("/v1/files", params={"limit": 2, "after": page["last_id"]}).json()
    assert [f["id"] for f in rest["data"]] == [ids[0]] and not rest["has_more"]
    assert [f["id"] for f in c.get("/v1/files", params={"order": "asc"}).json()["data"]] == ids
    assert [f["id"] for f in c.get("/v1/files", params={"purpose": "eval"}).json()["data"]] == [ids[2]]
    openai_error(c.get("/v1/files", params={"after": "file-nope"}), 404, "id")
    openai_error(c.get("/v1/files", params={"order": "sideways"}), 400, "order")


def test_a_refused_job_stores_nothing(api):
    """Issue 33: a refused POST /v1/fine_tuning/jobs (400) still stored converted copies of its training and
    validation files (three refusals: 4 -> 10 files). Nothing is written before a request is accepted."""
    c, app = api
    fid = c.post("/v1/files", files={"file": ("rft.jsonl", ROWS.encode())}).json()["id"]
    vid = c.post("/v1/files", files={"file": ("val.jsonl", ROWS.encode())}).json()["id"]
    files_dir = app.state.settings.home_dir / "files"

    def stored() -> tuple[int, int]:
        return len(c.get("/v1/files", params={"limit": 100}).json()["data"]), len(list(files_dir.iterdir()))

    before = stored()
    grader = {"reinforcement": {"grader": GRADER}}
    for bad, param in [({"model": "builtin:nope"}, "model"),
                       ({"method": {"type": "reinforcement", "reinforcement": {"grader": {
                           "type": "math", "name": "m", "reference": "{{item.answer}}",
                           "config": {"no_such_option": 1}}}}}, None),
                       ({"method": {"type": "reinforcement", "reinforcement": {"grader": {
                           "type": "code", "name": "c", "reference": "{{item.answer}}",
                           "config": {"memory_mb": 10**9}}}}}, None)]:
        body = {"model": "builtin:tiny-arith", "training_file": fid, "validation_file": vid,
                "method": {"type": "reinforcement", **grader}, **bad}
        r = c.post("/v1/fine_tuning/jobs", json=body)
        assert r.status_code == 400, r.text
        if param:
            assert r.json()["error"]["param"] == param, r.text
        assert stored() == before, bad
    ok = c.post("/v1/fine_tuning/jobs", json={"model": "builtin:tiny-arith", "training_file": fid,
                                               "validation_file": vid, "method": {"type": "reinforcement", **grader}})
    assert ok.status_code == 200, ok.text
    assert stored() == (before[0] + 2, before[1] + 2)  # the accepted job's two converted copies, no more


def test_a_job_that_fails_to_be_created_takes_its_copies_with_it(api, monkeypatch):
    c, app = api
    fid = c.post("/v1/files", files={"file": ("rft.jsonl", ROWS.encode())}).json()["id"]
    files_dir = app.state.settings.home_dir / "files"
    n = len(list(files_dir.iterdir()))

    def full(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(app.state.store, "create_job", full)
    r = c.post("/v1/fine_tuning/jobs", json={"model": "builtin:tiny-arith", "training_file": fid,
                                              "method": {"type": "reinforcement", "reinforcement": {"grader": GRADER}}})
    assert r.status_code == 500 and len(list(files_dir.iterdir())) == n
    assert len(c.get("/v1/files").json()["data"]) == 1
