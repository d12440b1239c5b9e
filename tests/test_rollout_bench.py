"""The GPU measurement script runs end to end (CPU, toy config): it is ready for a GPU session."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_gpu_step_dry_run_finishes_with_figures():
    r = subprocess.run([sys.executable, str(REPO / "bench" / "gpu_step.py"), "--dry-run"], cwd=REPO,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    last = r.stdout.strip().splitlines()[-1]
    kv = dict(item.split("=", 1) for item in last.split())
    assert kv["dry_run"] == "1" and kv["arch"] == "toy"
    assert float(kv["rollout_tok_s"]) > 0 and float(kv["generate_tok_s"]) > 0
    assert float(kv["update_step_s"]) > 0 and int(kv["rows"]) == 4
