"""Asynchronous rollouts vs the synchronous loop: the same GRPO job at max_staleness k = 0, 1, 2, 3 for the
same wall-clock budget — steps per minute, and held-out accuracy at 1/4, 1/2 and all of the budget.

Each run is the same spec but `rollout.max_staleness`; the synchronous run uses both cores for one
process (train.threads = 2), an async run gives one to the trainer and one to the producer
(train.threads = 1, rollout.producer_threads = 1), so every run has the same two cores. At k = 3 the
producer samples two training batches per engine call (rollout.producer_batches' default, (k + 1) // 2).
Weights are copied (off the clock) when a run's clock passes each fraction of the budget and scored after
training by the same greedy held-out evaluation. Clocks start at the first step (after model load and the
step-0 eval). Each run also prints where its time went per step (rollout / update; producer busy / idle,
trainer wait).

Disaggregated layout (``--disaggregated``, on by default; issue 31): the largest k again with the producer
as a Ray actor (train.producer: ray) on a "node" of its own — a raylet of Ray's local multi-node cluster
started on one core — while the trainer runs on the other core: each phase has a core to itself and the
weights travel through Ray's object store, as they would between two machines (on one host the two still
share its caches and memory bandwidth, which two machines would not).

    .venv/bin/python bench/async.py --quick     # tiny model, k = 0, 3 and k = 3 disaggregated x 60 s (< 5 min)
    .venv/bin/python bench/async.py --model smollm2-135m --budget-s 600
    .venv/bin/python bench/async.py --smoke    # CI: k = 0 (the synchronous peer) and 1 for 1 s each, 4 prompts x 4,
                                                 # 16 held out (checks the script runs end to end; not a measurement)

Last line: ``async_speedup= async_k= acc_sync= acc_async= budget_s=`` — the fastest k > 0 whose held-out
accuracy is no worse than k = 0's at every budget (within one standard error of the difference; flagged
``no_worse=0`` when none is), its steps per minute over k = 0's, accuracies at the full budget —
``disaggregated_speedup=`` (the disaggregated run's steps per minute over k = 0's, on the same footing as
async_speedup) and ``disaggregated_vs_shared=`` (over the shared layout at the same k), then the per-k figures.
"""
from __future__ import annotations

import argparse
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
# per-step means the bench prints: where each run's time goes (sync: rollout then update on 2 threads;
# async: the producer's busy and idle time per batch beside the trainer's update and wait, 1 thread each)
PHASES = ("time/rollout_s", "time/update_s", "async/producer_busy_s", "async/producer_wait_s",
          "async/trainer_wait_s", "async/staleness", "async/dropped_batches")


def cluster(cores: list[int]):
    """Ray's local multi-node cluster for the disaggregated layout: a head with no CPUs (nothing runs there)
    and one "node" of one CPU started on ``cores[1]`` — its raylet, and every worker it starts, inherit
    that affinity, so the producer actor has that core to itself."""
    import ray
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False,
                                                       "object_store_memory": 512 * 2**20})
    every = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cores[1]})
    try:
        c.add_node(num_cpus=1, object_store_memory=1024 * 2**20)
    finally:
        os.sched_setaffinity(0, every)
    c.wait_for_nodes()
    ray.init(address=c.address, log_to_driver=False)
    return c


def run(spec_dict: dict, k: int, budget_s: float, models: Path, work: Path, core: int | None = None) -> dict:
    """One run; ``core``: the disaggregated layout — the producer on the Ray node, the trainer pinned here."""
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
                                             "threads": 1 if async_ else 2,
                                             "producer": "ray" if core is not None else "local"}})
    snaps = Snapshots(budget_s)
    live, stamps = {}, []
    setup = loop.setup

    def keep(*a, **kw):
        r = setup(*a, **kw)
        live["run"] = r
        return r

    records = []

    def on_step(step, m):
        if step == 0:
            snaps.t0, snaps.paused = time.perf_counter(), 0.0
            return
        stamps.append(time.perf_counter())
        records.append({k: m[k] for k in PHASES if k in m})
        _take(snaps, live["run"].ctx.policy)

    loop.setup = keep
    every = os.sched_getaffinity(0)
    if core is not None:  # this thread trains (train.threads 1): on its own core, apart from the producer's node
        os.sched_setaffinity(0, {core})
    try:
        train(spec, work / f"k{k}{'-dis' if core is not None else ''}", models_dir=models, log=lambda m: None,
              on_step=on_step, should_stop=lambda: "pause" if snaps.over() else None)
    finally:
        loop.setup = setup
        os.sched_setaffinity(0, every)
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
    phases = {k: sum(r.get(k, 0.0) for r in records) / max(len(records), 1) for k in PHASES}
    return {"k": k, "steps": len(stamps), "steps_per_min": 60 * len(stamps) / max(wall, 1e-9), "wall_s": wall,
            "accuracy_at": acc, "eval_n": len(eval_set), "phases": phases,
            "batches_per_call": spec.rollout.batches_per_call(spec.algo.zero_variance == "resample"),
            "dropped": max((r.get("async/dropped_batches", 0) for r in records), default=0)}


def ceiling(spec_dict: dict, models: Path, work: Path, reps: int = 3) -> dict:
    """What overlap can buy on this machine for this job, from its phases timed alone on fixed batches.

    Sync runs rollout then update, each on 2 threads: r2 + u2 (+ scoring). Async runs them side by side,
    one thread each: at best max(r1 / c + scoring, u1), c = the per-batch gain of sampling two batches in
    one call. With a = r1 / r2 and b = u1 / u2 (2-thread scaling), a perfectly balanced job gains at most
    c / a + 1 / b — whatever the implementation, before the two processes slow each other down."""
    import copy
    import statistics

    import torch

    from trainer import distributed, loop, online
    from trainer.config import JobSpec
    from trainer.rollout import SamplingParams

    spec = JobSpec.model_validate({**spec_dict, "train": {**spec_dict["train"], "threads": 1}})
    ro_cfg, n = spec.rollout, spec.train.prompts_per_step
    sampling = SamplingParams(ro_cfg.max_new_tokens, ro_cfg.temperature, ro_cfg.top_p, stop=tuple(ro_cfg.stop))
    with distributed.group(1, spec.model_dump_json(), work / "ceiling", models, "cpu") as dist:
        run = loop.setup(spec, work / "ceiling", models, dist, None, lambda m: None)
        ctx = run.ctx
        batches = [online.sample_groups(ctx) for _ in range(reps)]  # fixed work for every timing below
        prompts = [p["prompt"] for p in ctx.stream.next_batch(2 * n)]
        weights, opt = copy.deepcopy(ctx.policy.state_dict()), copy.deepcopy(ctx.opt.state_dict())

        def timed(fn, threads: int, min_s: float = 3.0) -> float:
            """Median of at least two timings and ``min_s`` seconds, after a warm-up call."""
            torch.set_num_threads(threads)
            fn()  # warm-up: allocator, caches
            out, t_end = [], time.perf_counter() + min_s
            while len(out) < 2 or time.perf_counter() < t_end:
                t = time.perf_counter()
                fn()
                out.append(time.perf_counter() - t)
            return statistics.median(out)

        def update(grp) -> None:
            online._update(ctx, grp, online._prepare(ctx, grp))
            ctx.policy.load_state_dict(weights)
            ctx.opt.load_state_dict(opt)

        def updates() -> None:
            for g in batches:
                update(g)

        def sample(m: int):
            return lambda: ctx.engine.generate(prompts[: m * n], ro_cfg.group_size, sampling)

        out = {"r1": [], "r2": [], "u1": [], "u2": [], "r1_two_per_call": []}
        for _ in range(2):  # interleaved rounds: a drifting machine load moves every figure alike
            for threads in (1, 2):
                out[f"r{threads}"].append(timed(sample(1), threads))
                out[f"u{threads}"].append(timed(updates, threads) / len(batches))
            out["r1_two_per_call"].append(timed(sample(2), 1) / 2)
        out = {k: statistics.median(v) for k, v in out.items()}
        texts = [t for g in batches for t in g.ro.texts]
        out["score"] = timed(lambda: ctx.scorer(texts, ["0"] * len(texts)), 1, 0.0) / len(batches)
    a, b = out["r1"] / out["r2"], out["u1"] / out["u2"]
    c = out["r1"] / out["r1_two_per_call"]
    sync = out["r2"] + out["u2"] + out["score"]
    out.update(a=a, b=b, c=c, bound=c / a + 1 / b,
               job_k1=sync / max(out["r1"] + out["score"], out["u1"]),
               job_k3=sync / max(out["r1_two_per_call"] + out["score"], out["u1"]))
    return out


def _take(snaps: Snapshots, model, final: bool = False) -> None:
    t = time.perf_counter()
    for f in FRACTIONS:
        if f not in snaps.taken and (final or snaps.elapsed() >= f * snaps.budget_s):
            snaps.taken[f] = {k: v.detach().clone() for k, v in model.state_dict().items()}
    snaps.paused += time.perf_counter() - t


def _no_worse(sync: dict, other: dict) -> bool:
    """Held-out accuracy no worse than synchronous at every budget: not lower by more than one standard
    error of the difference of two binomial estimates on the same eval set."""
    for f in FRACTIONS:
        p, q, n = sync["accuracy_at"][f], other["accuracy_at"][f], sync["eval_n"]
        se = (max(p * (1 - p), 1e-9) / n + max(q * (1 - q), 1e-9) / n) ** 0.5
        if q < p - se:
            return False
    return True


def _best(sync: dict, runs: list[dict]) -> dict:
    """The fastest async run whose accuracy is no worse at every budget (else the fastest, flagged)."""
    ok = [r for r in runs if _no_worse(sync, r)] or runs or [sync]
    return max(ok, key=lambda r: r["steps_per_min"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="builtin:tiny-arith")
    ap.add_argument("--budget-s", type=float, default=300.0)
    ap.add_argument("--ks", default="0,1,2,3", help="max_staleness values, 0 first (the synchronous peer)")
    ap.add_argument("--quick", action="store_true", help="tiny model, k = 0, 3 and k = 3 disaggregated, 60 s per run")
    ap.add_argument("--smoke", action="store_true", help="k = 0, 1 (and 1 disaggregated) for 1 s each on a small "
                    "batch: checks the script runs (seconds; not a measurement)")
    ap.add_argument("--ceiling", action="store_true", help="also time each phase alone at 1 and 2 threads "
                    "on fixed batches: the speedup overlap can reach on this machine (printed; no training run)")
    ap.add_argument("--disaggregated", action=argparse.BooleanOptionalAction, default=True,
                    help="also the largest k with the producer on a Ray node of its own core (needs the ray extra)")
    ap.add_argument("--models", default=os.environ.get("RLVR_MODELS", str(REPO / ".cache" / "models")))
    a = ap.parse_args()
    from service.cli.recipes import recipe

    if a.quick:  # three runs of 60 s (k = 1 lies between the two): under 5 minutes with the evals and Ray's start
        a.budget_s, a.model, a.ks = 60.0, "builtin:tiny-arith", "0,3"
    if a.smoke:  # k = 3 runs this script's code as k = 1 does (its two batches per call are the producer's)
        a.budget_s, a.model, a.ks = 1.0, "builtin:tiny-arith", "0,1"
    if a.model == "builtin:tiny-arith":
        spec = recipe("demo-math")
        if a.smoke:
            spec["data"]["eval_size"], spec["train"]["prompts_per_step"], spec["rollout"]["group_size"] = 16, 4, 4
    else:
        spec = recipe("real-math")
        if a.model == "smollm2-135m":
            from trainer.models.pull import pull

            pull(a.model, Path(a.models), log=lambda m: print(m, file=sys.stderr))
        spec["model"]["path"] = a.model
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="async-bench-") as tmp:
        ceil = ceiling(spec, Path(a.models), Path(tmp)) if a.ceiling else None
        res = {int(k): run(spec, int(k), a.budget_s, Path(a.models), Path(tmp)) for k in a.ks.split(",")}
        dis = None
        cores = sorted(os.sched_getaffinity(0))
        if a.disaggregated and max(res) > 0 and len(cores) >= 2:
            c = cluster(cores)
            try:
                dis = run(spec, max(res), a.budget_s, Path(a.models), Path(tmp), core=cores[0])
            finally:
                import ray

                ray.shutdown()
                c.shutdown()
    if ceil:
        print("phases alone (fixed batches, s): "
              + " ".join(f"{k}={v:.3f}" for k, v in ceil.items()
                         if k not in ("a", "b", "c", "bound", "job_k1", "job_k3")))
        print(f"2-thread scaling: rollout a={ceil['a']:.2f}, update b={ceil['b']:.2f}; two batches per call: c="
              f"{ceil['c']:.2f}. Best case of overlap (no interference): this job k=1 {ceil['job_k1']:.2f}x, "
              f"k=3 {ceil['job_k3']:.2f}x; any balance of phases: c/a + 1/b = {ceil['bound']:.2f}x")
    for k, r in list(res.items()) + ([("dis", dis)] if dis else []):
        ph = r["phases"]
        k = f"{r['k']} disaggregated" if k == "dis" else r["k"]
        print(f"k={k}: {r['steps']} steps in {r['wall_s']:.0f} s = {r['steps_per_min']:.1f}/min "
              f"({r['batches_per_call']} batch(es) per sampling call, {r['dropped']} dropped); held-out "
              + " ".join(f"@{f:g}={r['accuracy_at'][f]:.3f}" for f in FRACTIONS)
              + f"; per step: rollout {ph['time/rollout_s']:.3f} s, update {ph['time/update_s']:.3f} s"
              + (f", producer busy {ph['async/producer_busy_s']:.3f} s / idle {ph['async/producer_wait_s']:.3f} s, "
                 f"trainer waits {ph['async/trainer_wait_s']:.3f} s, staleness {ph['async/staleness']:.2f}"
                 if k else ""),
              flush=True)
    sync = res[min(res)]
    best = _best(sync, [r for k, r in res.items() if k > 0])
    print(f"(load average at start: {load:.1f}; 'no worse' = within one standard error of the difference "
          f"at every budget, {sync['eval_n']} held-out problems)")
    print(f"async_speedup={best['steps_per_min'] / sync['steps_per_min']:.2f} async_k={best['k']} "
          f"acc_sync={sync['accuracy_at'][1.0]:.3f} acc_async={best['accuracy_at'][1.0]:.3f} budget_s={a.budget_s:g} "
          f"model={a.model} no_worse={int(_no_worse(sync, best))} "
          + (f"ceiling_job={max(ceil['job_k1'], ceil['job_k3']):.2f} ceiling_any={ceil['bound']:.2f} " if ceil else "")
          + (f"disaggregated_speedup={dis['steps_per_min'] / sync['steps_per_min']:.2f} disaggregated_k={dis['k']} "
             f"disaggregated_vs_shared={dis['steps_per_min'] / res[dis['k']]['steps_per_min']:.2f} "
             f"acc_disaggregated={dis['accuracy_at'][1.0]:.3f} " if dis else "")
          + " ".join(f"k{k}_speedup={r['steps_per_min'] / sync['steps_per_min']:.2f} "
                     f"k{k}_steps_per_min={r['steps_per_min']:.1f} " + " ".join(
                         f"k{k}_acc@{f:g}={r['accuracy_at'][f]:.3f}" for f in FRACTIONS) for k, r in res.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
