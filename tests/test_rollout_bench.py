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
    lines = r.stdout.strip().splitlines()
    last = dict(item.split("=", 1) for item in lines[-1].split())
    assert last["device"] == "cpu" and last["policy_and_reference_on"] == "cpu"  # 3 GRPO steps via the trainer
    assert float(last["step_s"]) > 0 and float(last["tokens_per_s"]) > 0 and "peak_mem_gb" in last
    kv = dict(item.split("=", 1) for item in next(x for x in lines if "dry_run=" in x).split())
    assert kv["dry_run"] == "1" and kv["arch"] == "toy"
    assert float(kv["rollout_tok_s"]) > 0 and float(kv["generate_tok_s"]) > 0
    assert float(kv["update_step_s"]) > 0 and int(kv["rows"]) == 4
