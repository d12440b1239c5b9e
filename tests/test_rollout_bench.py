"""The GPU measurement script's memory estimate (any machine): what fits a GPU runs, what does not is refused.
Its CPU dry run (toy config, end to end) is tests/test_bench_smoke.py's gpu_step case (``--smoke``)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _estimate(*args: str) -> tuple[int, dict, str]:
    r = subprocess.run([sys.executable, str(REPO / "bench" / "gpu_step.py"), "--estimate-only", *args], cwd=REPO,
                       capture_output=True, text=True, timeout=600)
    return r.returncode, dict(item.split("=", 1) for item in r.stdout.strip().splitlines()[-1].split()), r.stdout


def test_gpu_step_at_its_defaults_fits_a_gpu_and_refuses_what_does_not():
    """Defect 8 of issue 32: at its own defaults (Qwen2.5-0.5B shape, 16 prompts x 16, ~256 + 256 tokens)
    the GPU check ran one forward and backward over all 256 rows with full-vocabulary logits: ~148 GiB
    for the logits head alone, an out-of-memory on any GPU. It now micro-batches the update as the
    trainer does, and estimates its peak on the meta device before allocating anything: the defaults
    fit an 80 GiB GPU with room to spare, and one micro-batch of all 256 rows is refused on an H200."""
    code, kv, out = _estimate("--budget-gib", "80")
    assert code == 0 and kv["fits"] == "1" and kv["arch"] == "qwen2.5-0.5b" and kv["rows"] == "256", out
    assert float(kv["estimate_gib"]) < 40, out
    code, kv, out = _estimate("--micro-batch", "256", "--budget-gib", "139")
    assert code == 2 and kv["fits"] == "0" and float(kv["estimate_gib"]) > 139, out
    r = subprocess.run([sys.executable, str(REPO / "bench" / "gpu_step.py"), "--dry-run", "--budget-gib", "1e-6"],
                       cwd=REPO, capture_output=True, text=True, timeout=600)
    assert r.returncode != 0 and "lower --micro-batch" in r.stderr and "Nothing was allocated" in r.stderr, r.stderr
    assert "rollout ours" not in r.stdout  # refused before the model was built
