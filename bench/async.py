"""Asynchronous rollouts vs the synchronous loop: the same GRPO job at max_staleness k = 0, 1, 2 for the same
wall-clock budget — steps per minute, and held-out accuracy at 1/4, 1/2 and all of the budget.

Each run is the same spec but `rollout.max_staleness`; the synchronous run uses both cores for one
process (train.threads = 2), an async run gives one to the trainer and one to the producer
(train.threads = 1, rollout.producer_threads = 1), so every run has the same two cores. Weights are
copied (off the clock) when a run's clock passes each fraction of the budget and scored after training by
the same greedy held-out evaluation. Clocks start at the first step (after model load and the step-0
eval).

    .venv/bin/python bench/async.py --quick                     # tiny model, 3 x 100 s
    .venv/bin/python bench/async.py --model smollm2-135m --budget-s 600

Last line: ``async_speedup= acc_sync= acc_async= budget_s=`` (speedup: k = 1's steps per minute over
k = 0's; accuracies at the full budget), then the per-k figures.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from grpo_vs_trl import Snapshots  # noqa: E402

FRACTIONS = (0.25, 0.5, 1.0)


def run(spec_dict: dict, k: int, budget_s: float, models: Path, work: Path) -> dict:
    import torch

    import trainer.loop as loop
    from trainer.config import JobSpec
    from trainer.engines import ENGINES
    from trainer.loop import evaluate, train
    from trainer.scoring import Scorer

    async_ = k > 0
    spec = JobSpec.model_validate({**spec_dict, "rollout": {**spec_dict["rollout"], "max_staleness": k,
                                                             "producer_threads": 1},
                                   "train": {**spec_dict["train"], "steps": 100_000, "eval_every": 0,
                                             "threads": 1 if async_ else 2}})
    snaps = Snapshots(budget_s)
    live, stamps = {}, []
    setup = loop.setup

    def keep(*a, **kw):
        r = setup(*a, **kw)
        live["run"] = r
        return r

    def on_step(step, m):
        if step == 0:
            snaps.t0, snaps.paused = time.perf_counter(), 0.0
            return
        stamps.append(time.perf_counter())
        _take(snaps, live["run"].ctx.policy)

    loop.setup = keep
    try:
        train(spec, work / f"k{k}", models_dir=models, log=lambda m: None, on_step=on_step,
              should_stop=lambda: "pause" if snaps.over() else None)
    finally:
        loop.setup = setup
    wall = snaps.elapsed()
    _take(snaps, live["run"].ctx.policy, final=True)
    ctx = live["run"].ctx
    torch.set_num_threads(2)
    eval_set = live["run"].eval_set
    acc = {}
    for f, state in sorted(snaps.taken.items()):
        ctx.policy.load_state_dict(state)
        acc[f] = evaluate(ENGINES["hf"](ctx.policy.eval(), ctx.tok), Scorer(spec.verifiers), eval_set,
                          spec.rollout.max_new_tokens, stop=spec.rollout.stop)["eval/accuracy"]
    return {"k": k, "steps": len(stamps), "steps_per_min": 60 * len(stamps) / max(wall, 1e-9), "wall_s": wall,
            "accuracy_at": acc}


def _take(snaps: Snapshots, model, final: bool = False) -> None:
    t = time.perf_counter()
    for f in FRACTIONS:
        if f not in snaps.taken and (final or snaps.elapsed() >= f * snaps.budget_s):
            snaps.taken[f] = {k: v.detach().clone() for k, v in model.state_dict().items()}
    snaps.paused += time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="builtin:tiny-arith")
    ap.add_argument("--budget-s", type=float, default=300.0)
    ap.add_argument("--ks", default="0,1,2")
    ap.add_argument("--quick", action="store_true", help="tiny model, 100 s per run")
    ap.add_argument("--models", default=os.environ.get("RLVR_MODELS", str(REPO / ".cache" / "models")))
    a = ap.parse_args()
    from service.demo import DEMO_SPEC, REAL_SPECS

    if a.quick:
        a.budget_s, a.model = 100.0, "builtin:tiny-arith"
    if a.model == "builtin:tiny-arith":
        spec = json.loads(json.dumps(DEMO_SPEC))
    else:
        spec = json.loads(json.dumps(REAL_SPECS["math"]))
        if a.model == "smollm2-135m":
            from trainer.models import pull

            pull(a.model, Path(a.models), log=lambda m: print(m, file=sys.stderr))
        spec["model"]["path"] = a.model
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="async-bench-") as tmp:
        res = {int(k): run(spec, int(k), a.budget_s, Path(a.models), Path(tmp)) for k in a.ks.split(",")}
    for k, r in res.items():
        print(f"k={k}: {r['steps']} steps in {r['wall_s']:.0f} s = {r['steps_per_min']:.1f}/min; held-out "
              + " ".join(f"@{f:g}={r['accuracy_at'][f]:.3f}" for f in FRACTIONS), flush=True)
    sync, one = res[min(res)], res.get(1, res[max(res)])
    print(f"(load average at start: {load:.1f})")
    print(f"async_speedup={one['steps_per_min'] / sync['steps_per_min']:.2f} acc_sync={sync['accuracy_at'][1.0]:.3f} "
          f"acc_async={one['accuracy_at'][1.0]:.3f} budget_s={a.budget_s:g} model={a.model} "
          + " ".join(f"k{k}_steps_per_min={r['steps_per_min']:.1f} " + " ".join(
              f"k{k}_acc@{f:g}={r['accuracy_at'][f]:.3f}" for f in FRACTIONS) for k, r in res.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
