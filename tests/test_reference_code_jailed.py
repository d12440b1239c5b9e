"""Every place a verifier executes reference code runs it inside a jail.

A reference's ``prompt`` and ``test`` (and a Python verifier's source) probe the host: write a marker
file into a host directory anyone may write, read an environment variable and a file only the host
has, and note their uid. The check then asserts it saw exactly what a jail shows (no write, no
variable, no file, uid 65534), so a ``correct`` verdict proves the code ran, and ran jailed; and the
marker must not exist afterwards. Walked: the verifier itself, the worker's scoring (in-process and
the verify-queue task), the CLI, ``POST /v1/verifiers/{name}/run`` (code, multi, python), verifier
registration, and ``POST /v1/fine_tuning/alpha/graders/run``. A static walk then finds no exec, eval
or compile of anything in the packages except in the sources that run only in the jail.
"""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.conftest import REPO

JAILED = "no-write|no-env|no-file|65534"
ADD = "def add(a, b):\n    return a + b\n"


@pytest.fixture(scope="module", autouse=True)
def local_sandbox():
    from sandbox import local
    from sandbox.types import SandboxUnavailable

    try:
        local.probe()
    except SandboxUnavailable as e:
        pytest.skip(f"reference code runs only in the local sandbox, unavailable here: {e}")


@pytest.fixture
def host(tmp_path, monkeypatch):
    """A host directory anyone may write, a secret file there and a secret variable: the jail has none."""
    d = tmp_path / "host"
    d.mkdir()
    os.chmod(tmp_path, 0o755)
    os.chmod(d, 0o777)
    secret = d / "secret.txt"
    secret.write_text("host-only-secret")
    os.chmod(secret, 0o644)
    monkeypatch.setenv("RLVR_CANARY", "host-only-variable")
    return d


def probe(host: Path, tag: str) -> str:
    """Code that records what it can reach of the host in SEEN_<tag>."""
    return (f"import os as _os\n"
            f"def _probe():\n"
            f"    seen = []\n"
            f"    try:\n"
            f"        open({str(host / f'marker-{tag}')!r}, 'w').write('escaped')\n"
            f"        seen.append('wrote')\n"
            f"    except OSError:\n"
            f"        seen.append('no-write')\n"
            f"    seen.append(_os.environ.get('RLVR_CANARY', 'no-env'))\n"
            f"    try:\n"
            f"        seen.append(open({str(host / 'secret.txt')!r}).read())\n"
            f"    except OSError:\n"
            f"        seen.append('no-file')\n"
            f"    seen.append(str(_os.getuid()))\n"
            f"    return '|'.join(seen)\n"
            f"SEEN_{tag} = _probe()\n")


def reference(host: Path) -> dict:
    """A function reference whose prompt and test both probe, and whose check passes only if jailed."""
    test = (probe(host, "test") + "def check(candidate):\n"
            f"    assert SEEN_prompt == {JAILED!r}, SEEN_prompt\n"
            f"    assert SEEN_test == {JAILED!r}, SEEN_test\n"
            "    assert candidate(2, 3) == 5\n")
    return {"prompt": probe(host, "prompt"), "test": test, "entry_point": "add"}


def python_source(host: Path) -> str:
    return probe(host, "src") + ("def verify(completion, reference, **fields):\n"
                                 f"    return 1.0 if SEEN_src == {JAILED!r} else 0.0\n")


def assert_nothing_escaped(host: Path) -> None:
    assert sorted(p.name for p in host.iterdir()) == ["secret.txt"]


# -- in-process doors ------------------------------------------------------------------------------------
def test_the_code_verifier(host):
    from verifiers import get_verifier

    v = get_verifier("code")
    r = v.verify(ADD, reference(host))
    assert r.status.value == "correct", r
    assert [x.status.value for x in v.verify_batch([ADD, ADD], [reference(host), json.dumps(reference(host))])] \
        == ["correct", "correct"]
    assert_nothing_escaped(host)


def test_the_workers_scoring_in_process_and_on_the_verify_queue(host):
    from service.worker.verify_queue import verify_batch
    from trainer.scoring import run_specs

    specs = [{"name": "code", "weight": 1.0, "config": {}, "version": None},
             {"name": "python", "weight": 1.0, "config": {"source": python_source(host)}, "version": None}]
    for (verdicts, _lat, _s) in run_specs(specs, [ADD], [reference(host)]):
        assert [v.status.value for v in verdicts] == ["correct"], verdicts
    out = verify_batch.run(specs, [ADD], [reference(host)])  # the task's body, as a verify worker runs it
    assert [d["verdicts"][0]["status"] for d in out] == ["correct", "correct"], out
    assert_nothing_escaped(host)


def test_the_cli(host, tmp_path):
    sol, tests = tmp_path / "sol.py", tmp_path / "tests.json"
    sol.write_text(ADD)
    tests.write_text(json.dumps(reference(host)))
    r = subprocess.run([sys.executable, "-m", "verifiers.code", str(sol), str(tests)], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and json.loads(r.stdout)["status"] == "correct", r.stdout + r.stderr
    assert_nothing_escaped(host)


# -- HTTP doors (auth on, an ordinary tenant's key) ------------------------------------------------------
@pytest.fixture
def tenant(tmp_path, models_dir):
    from service.access.keys import create_key
    from service.app import create_app
    from service.settings import Settings

    settings = Settings(home=tmp_path / "home", models=models_dir, auth=True, admin_key="admin-key-for-the-walk")
    app = create_app(settings, reaper=False)
    with TestClient(app) as c:
        yield c, {"Authorization": "Bearer " + create_key(app.state.store, "alice")}, settings


def test_the_verifier_dry_runs(host, tenant):
    c, key, _ = tenant
    ref = reference(host)
    r = c.post("/v1/verifiers/code/run", json={"items": [{"completion": ADD, "reference": ref}]}, headers=key)
    assert r.status_code == 200 and r.json()["results"][0]["status"] == "correct", r.text
    multi = {"verifiers": {"a": {"name": "code"}, "b": {"name": "python", "config": {"source": python_source(host)}}}}
    r = c.post("/v1/verifiers/multi/run", json={"items": [{"completion": ADD, "reference": ref}], "config": multi},
               headers=key)
    assert r.status_code == 200 and r.json()["results"][0]["score"] == 2.0, r.text
    r = c.post("/v1/verifiers/python/run", json={"items": [{"completion": "x"}],
                                                  "config": {"source": python_source(host)}}, headers=key)
    assert r.status_code == 200 and r.json()["results"][0]["status"] == "correct", r.text
    assert_nothing_escaped(host)


def test_verifier_registration(host, tenant):
    c, key, _ = tenant
    body = {"name": "walk-probe", "source": python_source(host),
            "golden": [{"completion": "x", "expected_score": 1.0}]}
    r = c.post("/v1/verifiers", json=body, headers=key)
    assert r.status_code == 201, r.text
    assert_nothing_escaped(host)


def test_the_openai_grader_run(host, tenant):
    c, key, _ = tenant
    grader = {"type": "code", "name": "tests", "reference": "{{item.tests}}"}
    r = c.post("/v1/fine_tuning/alpha/graders/run",
               json={"grader": grader, "model_sample": ADD, "item": {"tests": reference(host)}}, headers=key)
    assert r.status_code == 200 and r.json()["reward"] == 1.0, r.text
    py = {"type": "python", "name": "p",
          "source": python_source(host).replace("def verify(completion, reference, **fields)",
                                                                              "def grade(sample, item)")}
    r = c.post("/v1/fine_tuning/alpha/graders/run", json={"grader": py, "model_sample": "x", "item": {}}, headers=key)
    assert r.status_code == 200 and r.json()["reward"] == 1.0, r.text
    assert_nothing_escaped(host)


def test_the_reference_cannot_read_the_servers_secrets(tenant):
    """The reproduction from the issue: a prompt that reads RLVR_ADMIN_KEY and the SQLite store, returned
    in the verdict's reason."""
    c, key, settings = tenant
    db = settings.home_dir / "rlvr.db"
    assert db.read_bytes().startswith(b"SQLite format 3")  # the store is there, on the host
    leak = ("import os\nfound = [os.environ.get('RLVR_ADMIN_KEY', '')]\n"
            f"try:\n    found.append(open({str(db)!r}, 'rb').read(64).hex())\nexcept OSError as e:\n"
            "    found.append(type(e).__name__)\n")
    ref = {"prompt": leak, "test": "def check(candidate):\n    assert False, repr(found)\n", "entry_point": "add"}
    os.environ["RLVR_ADMIN_KEY"] = "admin-key-for-the-walk"
    try:
        r = c.post("/v1/verifiers/code/run", json={"items": [{"completion": ADD, "reference": ref}]}, headers=key)
    finally:
        del os.environ["RLVR_ADMIN_KEY"]
    assert r.status_code == 200, r.text
    reason = r.json()["results"][0]["reason"]
    assert "['', 'FileNotFoundError']" in reason, reason  # it ran, and found neither
    assert "admin-key-for-the-walk" not in r.text and "53514c69" not in r.text


# -- the static walk ---------------------------------------------------------------------------------------
# (file, builtin) pairs allowed: programs the jail runs, and local.py compiling our own harnesses for it
ALLOWED = {("verifiers/code/_judge.py", "exec"), ("verifiers/code/_judge.py", "compile"),
           ("sandbox/_worker.py", "exec"), ("sandbox/_worker.py", "compile"), ("sandbox/local.py", "compile")}


def test_no_exec_eval_or_compile_outside_the_jails_own_sources():
    outside = []
    for pkg in ("service", "trainer", "verifiers", "sandbox"):
        for f in (REPO / pkg).rglob("*.py"):
            rel = f.relative_to(REPO).as_posix()
            for node in ast.walk(ast.parse(f.read_text())):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                        and node.func.id in ("exec", "eval", "compile", "__import__")
                        and (rel, node.func.id) not in ALLOWED):
                    outside.append(f"{rel}:{node.lineno} {node.func.id}")
    assert outside == []
