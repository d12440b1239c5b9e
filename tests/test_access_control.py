"""Access control with auth on: every route but /healthz needs a key; tenant scope comes from the key's
admin flag (never a name); another tenant's jobs, files, checkpoints, metrics and private verifiers are
indistinguishable from missing ones."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from tests.conftest import REPO

ADMIN_KEY = "bootstrap-admin-key-for-tests"
JOB = {"name": "t", "train": {"steps": 3, "prompts_per_step": 2}, "rollout": {"group_size": 4}}
ROW = b'{"prompt": "1+1", "reference": "2"}\n'


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
def auth_app(tmp_path, models_dir):
    from service.app import create_app
    from service.settings import Settings

    settings = Settings(home=tmp_path / "home", models=models_dir, auth=True, admin_key=ADMIN_KEY)
    return create_app(settings, reaper=False)


@pytest.fixture
def api(auth_app):
    """(client, keys by name): an admin key from the API, tenants alice and bob."""
    with TestClient(auth_app) as c:
        keys = {"admin": ADMIN_KEY}
        for tenant in ("alice", "bob"):
            r = c.post("/v1/keys", json={"tenant": tenant}, headers=bearer(ADMIN_KEY))
            assert r.status_code == 201, r.text
            keys[tenant] = r.json()["key"]
        yield c, keys


def _concrete(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "x1", path)


def flat_routes(routes):
    """Every route object, whether the app holds it directly or in an included router."""
    for route in routes:
        included = getattr(route, "original_router", None)  # FastAPI's lazily included routers
        if included is not None:
            yield from flat_routes(included.routes)
        else:
            yield route


def _every_route(app):
    """(method, concrete path) for every route the app serves: API routes and FastAPI's own (docs)."""
    out = []
    for route in flat_routes(app.routes):
        for method in sorted(getattr(route, "methods", None) or {"GET"}):
            if method != "HEAD":
                out.append((method, _concrete(route.path)))
    return out


def test_every_route_but_the_public_ones_is_401_without_a_key_or_with_a_forged_one(auth_app):
    from service.access.gate import PUBLIC_PATHS

    assert PUBLIC_PATHS == {"/healthz", "/dashboard", "/"}  # adding one is a security decision: test it below
    with TestClient(auth_app) as c:
        routes = _every_route(auth_app)
        documented = {(m.upper(), _concrete(p)) for p, ops in auth_app.openapi()["paths"].items() for m in ops}
        assert documented <= set(routes)  # the walk covers the whole OpenAPI document
        assert ("POST", "/v1/fine_tuning/alpha/graders/run") in routes and ("GET", "/metrics") in routes
        forged = ["rlvr_" + "A" * 43, ADMIN_KEY + "x", "x" * 10_000]
        checked = 0
        for method, path in routes + [("GET", "/no/such/route"), ("POST", "/v1/nothing")]:
            if path in PUBLIC_PATHS and method == "GET":
                continue
            for headers in [{}, {"Authorization": "Basic " + ADMIN_KEY}, {"Authorization": "Bearer"}] + \
                    [bearer(k) for k in forged]:
                r = c.request(method, path, headers=headers, json={"grader": {"type": "python", "source": "x"}})
                assert r.status_code == 401, (method, path, headers, r.status_code, r.text[:200])
                checked += 1
        assert checked > 200
        assert c.get("/healthz").json() == {"status": "ok"}
        assert c.post("/dashboard").status_code == 401  # public means GET of the page, nothing else


def test_the_dashboard_page_is_the_same_static_bytes_for_everyone(api):
    """Public so a browser can show the key form: it must carry no data, whoever asks."""
    from service.api.dashboard import PAGE

    c, keys = api
    job = c.post("/v1/jobs", json=JOB, headers=bearer(keys["alice"])).json()["id"]
    anonymous = c.get("/dashboard")
    assert anonymous.status_code == 200 and anonymous.text == PAGE.read_text(encoding="utf-8")
    assert c.get("/dashboard", headers=bearer(keys["alice"])).text == anonymous.text
    assert job not in anonymous.text and "alice" not in anonymous.text
    csp = anonymous.headers["content-security-policy"]
    assert "connect-src 'self'" in csp and "default-src 'none'" in csp and "frame-ancestors 'none'" in csp
    assert c.get("/", follow_redirects=False).headers["location"] == "/dashboard"
    # every /v1 call the page makes still needs the key
    for path in ("/v1/jobs", f"/v1/jobs/{job}/metrics", f"/v1/jobs/{job}/rollouts?step=1",
                 f"/v1/jobs/{job}/checkpoints"):
        assert c.get(path).status_code == 401, path


def test_every_tenant_data_route_is_scoped_by_the_one_scope_dependency(auth_app):
    from service.deps import get_scope, require_admin
    from service.http.guard import GuardedRoute, SafeJSONResponse

    def deps(dependant):
        for d in dependant.dependencies:
            yield d.call
            yield from deps(d)

    no_tenant_data = {"/healthz", "/", "/dashboard", "/v1/fine_tuning/alpha/graders/validate"}
    api_routes = [r for r in flat_routes(auth_app.routes) if isinstance(r, APIRoute)]
    assert len(api_routes) > 30
    for route in api_routes:
        assert isinstance(route, GuardedRoute), route.path
        assert route.response_class is SafeJSONResponse or route.response_class.__name__ in (
            "StreamingResponse", "EventSourceResponse", "Response", "FileResponse", "HTMLResponse",
            "RedirectResponse"), route.path
        if route.path not in no_tenant_data:
            calls = set(deps(route.dependant))
            assert get_scope in calls or require_admin in calls, f"{route.path} does not go through ScopeDep"


def test_no_code_decides_scope_by_a_tenant_name():
    offenders = []
    for path in (REPO / "service").rglob("*.py"):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"""tenant\s*[!=]=\s*["']|["']admin["']\s*[!=]=""", line):
                offenders.append(f"{path.relative_to(REPO)}:{n}: {line.strip()}")
    assert offenders == []


@pytest.mark.parametrize("name", ["admin", "Admin", "ADMIN", "default", "public", "root", "system"])
def test_reserved_tenant_names_are_refused_by_the_api_and_the_cli(api, name, tmp_path):
    c, keys = api
    r = c.post("/v1/keys", json={"tenant": name}, headers=bearer(keys["admin"]))
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "tenant"] and "reserved" in r.text
    env = {**os.environ, "RLVR_HOME": str(tmp_path / "cli-home")}
    out = subprocess.run([sys.executable, "-m", "service.cli", "keys", "create", "--tenant", name], env=env, cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "reserved" in out.stderr and "rlvr_" not in out.stdout


def test_scope_comes_from_the_admin_flag_not_the_tenant_name(api, auth_app):
    """A non-admin key whose tenant is literally `admin` (a row from before names were reserved) sees
    only its own tenant; the bootstrap admin key sees everything."""
    from service.access.keys import BOOTSTRAP_ADMIN, _hash, authenticate
    from service.store.tables import ApiKey

    c, keys = api
    store = auth_app.state.store
    with store.Session.begin() as s:
        s.add(ApiKey(tenant="admin", key_hash=_hash("rlvr_named-admin"), admin=False))
    named = bearer("rlvr_named-admin")
    job = c.post("/v1/jobs", json=JOB, headers=bearer(keys["alice"])).json()["id"]
    fid = c.post("/v1/files", files={"file": ("d.jsonl", ROW)}, headers=bearer(keys["alice"])).json()["id"]
    assert c.get(f"/v1/jobs/{job}", headers=named).status_code == 404
    assert c.get("/v1/jobs", headers=named).json()["data"] == []
    assert c.get(f"/v1/files/{fid}", headers=named).status_code == 404 and c.get("/v1/files",
                                                                                 headers=named).json()["data"] == []
    assert c.get("/v1/fine_tuning/jobs", headers=named).json()["data"] == []
    assert job not in c.get("/metrics", headers=named).text
    assert c.post("/v1/keys", json={"tenant": "mallory"}, headers=named).status_code == 403
    # the bootstrap key: all tenants, by flag
    assert authenticate(store, ADMIN_KEY, ADMIN_KEY) == BOOTSTRAP_ADMIN and BOOTSTRAP_ADMIN.scope.all_tenants
    assert [j["id"] for j in c.get("/v1/jobs", headers=bearer(ADMIN_KEY)).json()["data"]] == [job]
    assert c.get(f"/v1/files/{fid}", headers=bearer(ADMIN_KEY)).status_code == 200


def test_another_tenants_resources_read_exactly_like_missing_ones(api, auth_app):
    c, keys = api
    alice, bob = bearer(keys["alice"]), bearer(keys["bob"])
    job = c.post("/v1/jobs", json=JOB, headers=alice).json()["id"]
    fid = c.post("/v1/files", files={"file": ("d.jsonl", ROW)}, headers=alice).json()["id"]
    store = auth_app.state.store
    ckdir = Path(auth_app.state.settings.home_dir) / "ck"
    ckdir.mkdir(parents=True)
    (ckdir / "config.json").write_text("{}")
    store.put_checkpoint(job, 2, "step-0000002", str(ckdir), {"eval/accuracy": 0.5})
    routes = [("GET", "/v1/jobs/{}"), ("GET", "/v1/jobs/{}/metrics"), ("GET", "/v1/jobs/{}/events"),
              ("GET", "/v1/jobs/{}/events/stream"), ("GET", "/v1/jobs/{}/checkpoints"),
              ("GET", "/v1/jobs/{}/checkpoints/step-0000002/download"), ("GET", "/v1/jobs/{}/rollouts"),
              ("POST", "/v1/jobs/{}/cancel"), ("POST", "/v1/jobs/{}/pause"), ("DELETE", "/v1/jobs/{}"),
              ("GET", "/v1/fine_tuning/jobs/{}"), ("GET", "/v1/fine_tuning/jobs/{}/events"),
              ("GET", "/v1/fine_tuning/jobs/{}/checkpoints"), ("POST", "/v1/fine_tuning/jobs/{}/cancel")]
    missing = "job-0123456789abcdef"
    for method, path in routes:
        theirs = c.request(method, path.format(job), headers=bob)
        none = c.request(method, path.format(missing), headers=bob)
        assert theirs.status_code == none.status_code == 404, (path, theirs.text)
        assert theirs.text.replace(job, "ID") == none.text.replace(missing, "ID"), path
    for path in ("/v1/files/{}", "/v1/files/{}/content"):
        theirs, none = c.get(path.format(fid), headers=bob), c.get(path.format("file-nope"), headers=bob)
        assert theirs.status_code == none.status_code == 404
        assert theirs.text.replace(fid, "ID") == none.text.replace("file-nope", "ID")
    r = c.post("/v1/jobs", json={**JOB, "data": {"dataset": fid}}, headers=bob)
    r2 = c.post("/v1/jobs", json={**JOB, "data": {"dataset": "file-nope"}}, headers=bob)
    assert r.status_code == r2.status_code == 422 and r.text.replace(fid, "ID") == r2.text.replace("file-nope", "ID")
    for listing in ("/v1/jobs", "/v1/files", "/v1/fine_tuning/jobs"):
        assert c.get(listing, headers=bob).json()["data"] == [], listing
    assert job not in c.get("/metrics", headers=bob).text
    assert f'job="{job}"' not in c.get("/metrics", headers=bob).text
    # alice herself still has everything, and the checkpoint download works for her
    assert c.get(f"/v1/jobs/{job}/checkpoints/step-0000002/download", headers=alice).status_code == 200
    assert c.get(f"/v1/files/{fid}/content", headers=alice).content == ROW


# ------------------------------------------------------------------------------------------ verifiers
SRC = "def verify(completion, reference, **fields):\n    return 1.0 if completion.strip() == str(reference) else 0.0\n"
GOLDEN = [{"completion": "4", "reference": "4", "expected_score": 1.0}]


@pytest.fixture
def sandbox_ok():
    import sandbox

    try:
        sandbox.get_backend("local")
    except sandbox.SandboxUnavailable as e:
        pytest.skip(f"registered verifiers run only in the local sandbox, unavailable here: {e}")


def test_verifiers_are_private_unless_public_and_public_ones_show_only_their_interface(api, sandbox_ok):
    c, keys = api
    alice, bob = bearer(keys["alice"]), bearer(keys["bob"])
    secret = {"timeout_s": 2, "fields": {"api_token": "s3cr3t-field"}}
    golden = [{"completion": "4", "reference": "golden-secret-4", "expected_score": 0.0}]
    assert c.post("/v1/verifiers", json={"name": "alices", "source": SRC, "golden": golden, "config": secret},
                  headers=alice).status_code == 201
    assert c.post("/v1/verifiers", json={"name": "shared", "source": SRC, "golden": golden, "config": secret,
                                         "public": True, "description": "exact match"},
                  headers=alice).status_code == 201
    # private: absent for bob everywhere, exactly like a name nobody registered
    names = [d["name"] for d in c.get("/v1/verifiers", headers=bob).json()["data"]]
    assert "alices" not in names and "shared" in names
    for path in ("/v1/verifiers/{}", "/v1/verifiers/{}?version=1"):
        theirs, none = c.get(path.format("alices"), headers=bob), c.get(path.format("ghost"), headers=bob)
        assert theirs.status_code == none.status_code == 404
        assert theirs.text.replace("alices", "N") == none.text.replace("ghost", "N")
    run = {"items": [{"completion": "4", "reference": "4"}]}
    theirs, none = c.post("/v1/verifiers/alices/run", json=run, headers=bob), c.post("/v1/verifiers/ghost/run",
                                                                                     json=run, headers=bob)
    assert theirs.status_code == none.status_code == 404 and theirs.text.replace("alices",
                                                                                 "N") == none.text.replace("ghost", "N")
    theirs = c.post("/v1/jobs", json={**JOB, "verifiers": [{"name": "alices"}]}, headers=bob)
    none = c.post("/v1/jobs", json={**JOB, "verifiers": [{"name": "ghost"}]}, headers=bob)
    assert theirs.status_code == none.status_code == 422
    assert theirs.json()["detail"][0]["loc"] == ["body", "verifiers", 0, "name"] and "alices" in theirs.text
    assert theirs.text.replace("alices", "N") == none.text.replace("ghost", "N")
    nested = {"name": "multi", "config": {"verifiers": {"a": {"name": "alices"}}}}
    assert c.post("/v1/jobs", json={**JOB, "verifiers": [nested]}, headers=bob).status_code == 422
    taken = c.post("/v1/verifiers", json={"name": "alices", "source": SRC, "golden": GOLDEN}, headers=bob)
    assert taken.status_code == 409 and "alice" not in taken.text.replace("alices", "")
    # public: the interface, never the config, goldens, source or owner
    for info in (c.get("/v1/verifiers/shared", headers=bob).json(),
                 next(d for d in c.get("/v1/verifiers", headers=bob).json()["data"] if d["name"] == "shared")):
        assert {"name", "version", "description", "config_schema"} <= set(info)
        assert not {"source", "config", "golden", "tenant", "sha256"} & set(info)
        text = str(info)
        assert "s3cr3t" not in text and "golden-secret" not in text and "alice" not in text and "def verify" not in text
    assert c.post("/v1/verifiers/shared/run", json=run, headers=bob).json()["results"][0]["score"] == 1.0
    assert c.post("/v1/jobs", json={**JOB, "verifiers": [{"name": "shared"}]}, headers=bob).status_code == 201
    # the owner (and an admin) see what it is made of
    mine = c.get("/v1/verifiers/alices", headers=alice).json()
    assert mine["source"] == SRC and mine["config"]["fields"] == {"api_token": "s3cr3t-field"} and mine["golden"]
    assert c.get("/v1/verifiers/alices", headers=bearer(keys["admin"])).json()["tenant"] == "alice"


def test_datasets_list_builtin_tasks_and_only_the_callers_files(api):
    c, keys = api
    for tenant in ("alice", "bob"):
        r = c.post("/v1/files", files={"file": (f"{tenant}.jsonl", ROW)}, data={"purpose": "dataset"},
                   headers=bearer(keys[tenant]))
        assert r.status_code == 201, r.text
    assert c.get("/v1/datasets").status_code == 401
    r = c.get("/v1/datasets", headers=bearer(keys["alice"]))
    assert r.status_code == 200, r.text
    data = {d["id"]: d for d in r.json()["data"]}
    code = data["builtin:code_functions"]
    assert code["kind"] == "builtin" and "difficulty" in code["params"] and code["verifiers"] == [{"name": "code"}]
    assert data["builtin:humaneval"]["eval_only"] is True
    files = [d for d in data.values() if d["kind"] == "file"]
    assert [f["file"]["filename"] for f in files] == ["alice.jsonl"]  # bob's file is not alice's to see
    admin = c.get("/v1/datasets", headers=bearer(keys["admin"])).json()["data"]
    assert sorted(d["file"]["filename"] for d in admin if d["kind"] == "file") == ["alice.jsonl", "bob.jsonl"]
    r = c.get("/v1/datasets?files_limit=0", headers=bearer(keys["alice"]))
    assert r.json()["has_more_files"] is True and all(d["kind"] == "builtin" for d in r.json()["data"])
    r = c.get("/v1/datasets?files_limit=1001", headers=bearer(keys["alice"]))
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", "files_limit"]
