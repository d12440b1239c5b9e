"""trainer/models/gemm.py's rule against its two alternatives, on a real GRPO job: which library multiplies the layers'
float32 products (MKL, torch's own, or oneDNN), switched step by step in one process.

bench/update.py times one update on fixed batches, so each product's shapes repeat and oneDNN builds its kernel for
them once. A job's packed row has a new length at every step, and oneDNN builds a kernel for each new shape: what
gemm.py's size bound (``MIN_ENTRIES``) is for. Here the job itself runs (grpo_vs_trl --quick's spec: 16 prompts x
16 samples, 12 new tokens) and its steps take turns: gemm.py's rule on this CPU (``auto``), every product in MKL
(``mkl``), every product in oneDNN (``onednn``), then again. Alternating in one process keeps a spell of the host
and the process's memory placement (which moved the same update by up to 11% between processes, RESULTS "Session
75") off the comparison; each side's figure is the median of its steps' wall clock, the first steps left out (the
job's warm-up). The training differs from a job's only in which library sums each product (rounding), so the
three sides see the same kind of batches.

    .venv/bin/python bench/gemm_rule.py --quick                 # the tiny model, 60 steps a side (< 2 min)
    .venv/bin/python bench/gemm_rule.py --model smollm2-135m --steps 30 --group-size 8 --prompts 4 --max-new-tokens 24
    .venv/bin/python bench/gemm_rule.py --smoke                 # CI: 5 steps a side, 3 timed (not a measurement)

Last line: ``auto_s_per_step= mkl_s_per_step= onednn_s_per_step= auto_update_s= mkl_update_s= onednn_update_s=
mkl_over_auto= onednn_over_auto= rule_min_entries= family= threads= model=`` (``*_over_auto``: that side's step time
over the rule's; ``rule_min_entries``: the smallest weight gemm.py puts in oneDNN here, -1 for none).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

SIDES = ("auto", "mkl", "onednn")
WARMUP = 2  # steps per side left out: the job's first steps build kernels and settle its memory


def run(model: str, models: Path, steps: int, threads: int, group_size: int, prompts: int, new_tokens: int) -> dict:
    from trainer.config import JobSpec
    from trainer.loop import train
    from trainer.models import gemm

    torch.set_num_threads(threads)
    rule = gemm.min_entries()  # this CPU's, decided before any side replaces it
    bound = {"auto": rule, "mkl": None, "onednn": 0}
    decide = gemm.min_entries
    spec = JobSpec.model_validate({
        "model": {"path": model},
        "verifiers": [{"name": "math", "config": {"allow_unevaluated": False}}],
        "data": {"eval_size": 8},
        "rollout": {"group_size": group_size, "max_new_tokens": new_tokens, "temperature": 1.0},
        "algo": {"advantage": "grpo", "loss_agg": "token-mean", "kl_coef": 0.0},
        "optim": {"lr": 5e-5, "max_grad_norm": 1.0},
        "train": {"steps": steps * len(SIDES), "prompts_per_step": prompts, "eval_every": 0, "threads": threads},
    })
    times: dict[str, list[float]] = {s: [] for s in SIDES}
    updates: dict[str, list[float]] = {s: [] for s in SIDES}
    now: dict = {"side": None, "t": 0.0, "last": None}

    def on_step(step: int, m: dict) -> None:
        t = time.perf_counter()
        side = now["side"]
        if side is not None and step > WARMUP * len(SIDES):  # the step just ended ran under ``side``
            times[side].append(t - now["t"])
            updates[side].append(float(m.get("time/update_s", 0.0)))
            now["last"] = side
        nxt = SIDES[step % len(SIDES)]
        gemm.min_entries = lambda v=bound[nxt]: v
        now["side"], now["t"] = nxt, time.perf_counter()

    try:
        with tempfile.TemporaryDirectory(prefix="gemm-rule-") as tmp:
            train(spec, Path(tmp) / "job", models_dir=models, log=lambda m: None, on_step=on_step)
    finally:
        gemm.min_entries = decide
    last = now["last"]  # the job's last step also checkpoints: not a step time
    if last is not None and len(times[last]) > 1:
        times[last].pop()
        updates[last].pop()
    return {"rule": rule, "family": gemm.family(),
            "s_per_step": {s: statistics.median(v) for s, v in times.items()},
            "update_s": {s: statistics.median(v) for s, v in updates.items()},
            "steps": {s: len(v) for s, v in times.items()}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="builtin:tiny-arith", help="builtin:tiny-arith | smollm2-135m | HF dir")
    ap.add_argument("--models", default=os.environ.get("RLVR_MODELS", str(REPO / ".cache" / "models")))
    ap.add_argument("--steps", type=int, default=100, help="steps per side")
    ap.add_argument("--quick", action="store_true", help="60 steps a side")
    ap.add_argument("--smoke", action="store_true", help="5 steps a side (3 timed), 4 prompts x 4: a check")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--group-size", type=int, default=16)
    ap.add_argument("--prompts", type=int, default=16, help="prompts per step")
    ap.add_argument("--max-new-tokens", type=int, default=12)
    a = ap.parse_args()
    if a.quick:
        a.steps = 60
    if a.smoke:
        a.steps, a.group_size, a.prompts = WARMUP + 3, 4, 4
    r = run(a.model, Path(a.models), a.steps, a.threads, a.group_size, a.prompts, a.max_new_tokens)
    sps, upd = r["s_per_step"], r["update_s"]
    for s in SIDES:
        print(f"{s}: {sps[s]:.4f} s a step (update {upd[s]:.4f} s), median of {r['steps'][s]} steps", flush=True)
    kv = [f"{s}_s_per_step={sps[s]:.4f}" for s in SIDES] + [f"{s}_update_s={upd[s]:.4f}" for s in SIDES]
    kv += [f"mkl_over_auto={sps['mkl'] / sps['auto']:.3f}", f"onednn_over_auto={sps['onednn'] / sps['auto']:.3f}",
           f"rule_min_entries={-1 if r['rule'] is None else r['rule']}", f"family={r['family']}",
           f"threads={torch.get_num_threads()}", f"model={a.model}"]
    print(" ".join(kv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
