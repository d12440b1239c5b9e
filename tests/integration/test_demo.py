"""`rlvr demo --json` end to end in embedded mode: API + worker subprocesses, filesystem broker, SQLite."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow


def test_demo_json_runs_a_real_job(tmp_path, models_dir):
    env = {**os.environ, "RLVR_HOME": str(tmp_path / "home"), "RLVR_MODELS": str(models_dir),
           "RLVR_WORKER_THREADS": "1"}
    env.pop("RLVR_BROKER_URL", None)
    env.pop("RLVR_DATABASE_URL", None)
    proc = subprocess.run([sys.executable, "-m", "service.cli", "demo", "--steps", "4", "--json"], env=env,
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-4000:])
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["status"] == "succeeded" and out["steps"] == 4 and out["job_id"].startswith("job-")
    assert 0.0 <= out["accuracy_before"] <= 1.0 and 0.0 <= out["accuracy_after"] <= 1.0
    # the default where the sandbox starts (make test installs bubblewrap): the tool-using episodes demo, its
    # table with the strict judge and the same problems without the tool
    assert out["task"] == "tools" and {"strict_after", "tools_off_before", "tools_off_after"} <= set(out), out
    # embedded defaults really were used: SQLite file and filesystem broker under RLVR_HOME
    assert (tmp_path / "home" / "rlvr.db").is_file()
    assert (tmp_path / "home" / "broker" / "queue").is_dir()
    assert (tmp_path / "home" / "runs" / out["job_id"] / "metrics.jsonl").is_file()


def test_code_demo_says_why_when_the_sandbox_cannot_start(monkeypatch, capsys, tmp_path):
    """Without a jail the code demo stops before starting anything, naming the reason — not a job that
    pauses after every verdict came back an error (what a fresh machine without bubblewrap saw)."""
    import sandbox
    from service.cli import demo

    def unavailable(name="local", **kw):
        raise sandbox.SandboxUnavailable("local backend: /usr/bin/bwrap not found (apt-get install -y bubblewrap)")

    monkeypatch.setattr(sandbox, "get_backend", unavailable)
    monkeypatch.setenv("RLVR_HOME", str(tmp_path))
    started = []
    monkeypatch.setattr(demo, "_spawn", lambda *a, **k: started.append(a))
    assert demo._sandbox_missing(demo.demo_spec("math")) is None  # arithmetic needs no jail
    assert demo.run_demo(task="code", as_json=True) == 2
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out == {"status": "sandbox_unavailable",
                   "error": "local backend: /usr/bin/bwrap not found (apt-get install -y bubblewrap)"}
    assert started == []  # no API, no worker, no job
    # the default (auto) falls back to arithmetic, which needs no jail, and says why
    assert demo.pick_task("auto") == ("math", "local backend: /usr/bin/bwrap not found (apt-get install -y bubblewrap)")
    assert demo.pick_task("code") == ("code", None)
