"""One GRPO update on a CPU: our trainer's allocator setting (trainer.devices.keep_freed_memory: glibc
serves every block from the heap and keeps freed memory) against glibc's defaults, in the same run.

Each side is its own process (the setting is process-wide): the same job spec and seed give both the same
fixed batches, sampled once; each update (forward, backward, fused AdamW) restores the weights and the
optimiser state afterwards, so every timing does the same work. Reported: the median update time over
the batches, repeated, at one torch thread, the page faults and system time per update, and the
process's peak resident memory (what keeping freed memory costs).

    .venv/bin/python bench/update.py --quick                    # tiny model and SmolLM2 if pulled, ~3 min
    .venv/bin/python bench/update.py --model smollm2-135m --reps 4
    .venv/bin/python bench/update.py --smoke    # CI: the tiny model, each side once, one batch of 4 prompts x 4
                                                # (checks the script runs end to end; not a measurement)

Last line: ``update_speedup= ours_s= defaults_s= ours_faults= defaults_faults= ours_rss_gb= defaults_rss_gb=
model=`` (speedup:
defaults' median over ours).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def measure(model: str, models: Path, reps: int, ours: bool, smoke: bool = False) -> dict:
    """In this process: sample fixed batches, then time ``reps`` passes of one update per batch (``smoke``: one
    small batch)."""
    import copy

    import torch

    from service.cli.recipes import recipe
    from trainer import devices, distributed, loop, online
    from trainer.config import JobSpec

    if not ours:  # the peer: glibc's own malloc settings
        devices.keep_freed_memory = lambda: False
    spec = recipe("demo-math" if model == "builtin:tiny-arith" else "real-math")
    spec["model"]["path"] = model
    spec["train"]["threads"] = 1
    if smoke:
        spec["train"]["prompts_per_step"], spec["rollout"]["group_size"], spec["data"]["eval_size"] = 4, 4, 16
    spec = JobSpec.model_validate(spec)
    with tempfile.TemporaryDirectory() as tmp, \
            distributed.group(1, spec.model_dump_json(), Path(tmp), models, "cpu") as dist:
        ctx = loop.setup(spec, Path(tmp), models, dist, None, lambda m: None).ctx
        batches = [online.sample_groups(ctx) for _ in range(1 if smoke else 3)]
        weights, opt = copy.deepcopy(ctx.policy.state_dict()), copy.deepcopy(ctx.opt.state_dict())
        times, faults, sys_s = [], [], []
        for rep in range(reps + 1):  # the first pass warms up (and is not counted)
            for grp in batches:
                r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
                online._update(ctx, grp, online._prepare(ctx, grp))
                t1, r1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
                ctx.policy.load_state_dict(weights)
                ctx.opt.load_state_dict(opt)
                if rep:
                    times.append(t1 - t0)
                    faults.append(r1.ru_minflt - r0.ru_minflt)
                    sys_s.append(r1.ru_stime - r0.ru_stime)
        live = [float((~g.dead).float().mean()) for g in batches]
    return {"update_s": statistics.median(times), "faults": statistics.median(faults),
            "sys_s": statistics.median(sys_s), "live_group_frac": live, "threads": torch.get_num_threads(),
            "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="default: the tiny model, and smollm2-135m when pulled")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="2 repetitions")
    ap.add_argument("--smoke", action="store_true", help="the tiny model, each side once on one small batch: checks "
                    "the script runs (seconds; not a measurement)")
    ap.add_argument("--models", default=os.environ.get("RLVR_MODELS", str(REPO / ".cache" / "models")))
    ap.add_argument("--side", choices=("ours", "defaults"), help=argparse.SUPPRESS)  # one side, in a child
    a = ap.parse_args()
    if a.side:
        print(json.dumps(measure(a.model, Path(a.models), a.reps, a.side == "ours", a.smoke)))
        return 0
    if a.quick:
        a.reps = 2
    models = [a.model] if a.model else ["builtin:tiny-arith"] + (
        ["smollm2-135m"] if (Path(a.models) / "smollm2-135m").exists() else [])
    sides = ("defaults", "ours", "defaults", "ours")  # interleaved: load drift hits both alike
    if a.smoke:
        a.reps, models, sides = 1, [a.model or "builtin:tiny-arith"], ("defaults", "ours")
    last = {}
    for model in models:
        res = {}
        for side in sides:
            out = subprocess.run([sys.executable, __file__, "--side", side, "--model", model, "--models", a.models,
                                  "--reps", str(max(1, a.reps // 2))] + (["--smoke"] if a.smoke else []),
                                 capture_output=True, text=True, check=True)
            r = json.loads(out.stdout.strip().splitlines()[-1])
            res.setdefault(side, []).append(r)
        ours, peer = ({k: statistics.median(x[k] for x in res[s]) for k in ("update_s", "faults", "sys_s", "peak_rss_gb")}
                      for s in ("ours", "defaults"))
        print(f"{model}: update {ours['update_s']:.3f} s (glibc defaults {peer['update_s']:.3f} s), page faults "
              f"{ours['faults']:.0f} ({peer['faults']:.0f}), system time {ours['sys_s']:.2f} s ({peer['sys_s']:.2f} s) "
              f"per update; peak RSS {ours['peak_rss_gb']:.2f} GB ({peer['peak_rss_gb']:.2f} GB); live groups per "
              f"batch {res['ours'][0]['live_group_frac']}", flush=True)
        last[model] = (ours, peer)
    model, (ours, peer) = list(last.items())[-1]
    print(f"update_speedup={peer['update_s'] / ours['update_s']:.2f} ours_s={ours['update_s']:.3f} "
          f"defaults_s={peer['update_s']:.3f} ours_faults={ours['faults']:.0f} defaults_faults={peer['faults']:.0f} "
          f"ours_rss_gb={ours['peak_rss_gb']:.2f} defaults_rss_gb={peer['peak_rss_gb']:.2f} "
          f"model={model} " + " ".join(f"{m.split(':')[-1]}_speedup={p['update_s'] / o['update_s']:.2f}"
                                      for m, (o, p) in last.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
