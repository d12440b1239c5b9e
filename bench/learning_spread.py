"""How much the learning tests' held-out gains vary across CPU kernel paths and seeds.

The learning tests (tests/test_learning.py, tests/test_learning_algos.py) run the demo's recipe from the
committed tiny model and assert a gain over the measured start. Their margins come from this script: each
(algorithm, kernel path, seed) run is a separate process with ``ATEN_CPU_CAPABILITY`` set, single-threaded,
exactly as the tests run; the table shows the held-out accuracy at each eval and the gains the tests
assert on (last eval, and the mean of the last two evals). Not a speed measurement.

    python bench/learning_spread.py --algos grpo,ppo,ppo-critic,dpo --capabilities native,avx2 --seeds 0,1

A capability is a value of ``ATEN_CPU_CAPABILITY`` for the run's process, or ``native``: the variable unset, so
torch takes this CPU's best path (AVX-512 where it has it), the one the tests run here. ``default`` is torch's
portable path, not the machine's default.
Last line: ``min_gain_last= min_gain_late= runs=`` (per algorithm in the table above it).

    python bench/learning_spread.py --wrong flipped,ppo,dead-critic --seeds 0,1,2,3,4,5,6,7 --jobs 2
The wrong-algorithm tests' spread (tests/test_learning_wrong.py): per kind, over the seeds, the figure its
test reads — how far held-out accuracy falls with GRPO's advantage sign flipped; the critic's explained
bias |mean value - mean return| (last 10 steps) of PPO and of PPO with its value loss zeroed — with mean,
s.d., mean -/+ 3 s.d. Last line: ``fall_mean= fall_sd= fall_low= … bias_high= … dead_bias_min= runs=``.
    python bench/learning_spread.py --tinker 6 --capabilities avx2,default
The Tinker example's spread (tests/integration/test_tinker_grpo_example.py): examples/tinker_grpo.py run
end to end against a live ``rlvr serve`` + ``rlvr worker`` (auth on, float32), --tinker times per kernel path
(the worker trains, so ATEN_CPU_CAPABILITY is set there); its draws are unseeded, so every run is a new
trajectory. Per run the held-out gain (after - before); then mean, s.d., min and mean - 3 s.d. Last line:
``tinker_gain_mean= tinker_gain_sd= tinker_gain_min= tinker_gain_low= runs=``.
``--smoke`` (CI, tests/test_bench_smoke.py): ``--quick``'s two runs cut to 2 steps (an eval after each, 16 problems),
side by side: checks the script runs end to end in seconds; its gains mean nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# the learning tests' spec: the demo's, with only the algorithm (and here the seed) changed, one thread
ONE_RUN = """
import json, sys
from service.cli.recipes import learning_spec
from trainer.loop import train
spec = learning_spec(sys.argv[1], seed=int(sys.argv[2]))
if sys.argv[5] != "-":
    spec.model.path = sys.argv[5]
for section, values in json.loads(sys.argv[6]).items():  # --smoke: a shorter run
    for key, value in values.items():
        setattr(getattr(spec, section), key, value)
train(spec, sys.argv[3], models_dir=sys.argv[4], log=lambda m: None)
rows = [json.loads(x) for x in open(sys.argv[3] + "/metrics.jsonl")]
print(json.dumps({r["step"]: r["eval/accuracy"] for r in rows if "eval/accuracy" in r}))
"""


# the wrong-algorithm tests' runs (tests/test_learning_wrong.py): a short job, broken on purpose or not
ONE_WRONG = """
import json, sys
from pathlib import Path
from tests.learning import critic_figures, evals, short_spec, wrong
from trainer.loop import train
kind, seed, run, models = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]
algo = "grpo" if kind == "flipped" else "ppo"
with wrong(None if kind == "ppo" else kind):
    train(short_spec(algo, seed), run, models_dir=models, log=lambda m: None)
out = {"evals": evals(run)}
if algo == "ppo":
    out.update(critic_figures(run))
print(json.dumps(out))
"""
# what each kind is judged by: flipped -> how far held-out accuracy falls; ppo, dead-critic -> the critic's
# explained variance over the last 10 steps
WRONG_KINDS = ("flipped", "ppo", "dead-critic")
CRITIC_FIGURE = "value_bias"


def run_wrong(kind: str, seed: int, models: str) -> float:
    with tempfile.TemporaryDirectory() as d:
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        out = subprocess.run([sys.executable, "-c", ONE_WRONG, kind, str(seed), d + "/run", models], env=env,
                             cwd=REPO, capture_output=True, text=True, timeout=3600)
        if out.returncode:
            raise RuntimeError(out.stderr[-2000:])
        r = json.loads(out.stdout.strip().splitlines()[-1])
        ev = {int(k): v for k, v in r["evals"].items()}
        return ev[0] - ev[max(ev)] if kind == "flipped" else r[CRITIC_FIGURE]


def wrong_spread(kinds: list[str], seeds: list[int], models: str, jobs: int) -> None:
    """Per kind, the figure its test reads over every seed: mean, s.d., mean - 3 s.d. (the test's threshold)."""
    from concurrent.futures import ThreadPoolExecutor
    from statistics import mean, stdev

    combos = [(k, s) for k in kinds for s in seeds]
    got: dict[str, list[float]] = {k: [] for k in kinds}
    with ThreadPoolExecutor(jobs) as ex:
        for (k, s), x in zip(combos, ex.map(lambda c: run_wrong(*c, models), combos)):
            got[k].append(x)
            print(f"{k:12s} seed {s}: {'fall' if k == 'flipped' else CRITIC_FIGURE} {x:+.4f}", flush=True)
    line = {}
    for k, xs in got.items():
        m, sd = mean(xs), stdev(xs) if len(xs) > 1 else float("nan")
        print(f"{k:12s} n={len(xs)} values {[round(x, 4) for x in xs]} mean {m:+.4f} sd {sd:.4f} "
              f"mean-3sd {m - 3 * sd:+.4f} mean+3sd {m + 3 * sd:+.4f} min {min(xs):+.4f} max {max(xs):+.4f}")
        key = {"flipped": "fall", "ppo": "bias", "dead-critic": "dead_bias"}[k]
        line[f"{key}_mean"], line[f"{key}_sd"] = m, sd
        line[f"{key}_low"], line[f"{key}_high"] = m - 3 * sd, m + 3 * sd
        line[f"{key}_min"], line[f"{key}_max"] = min(xs), max(xs)
    print(" ".join(f"{k}={v:.4f}" for k, v in line.items()) + f" runs={len(combos)}")


def run_tinker(cap: str, models: str, extra: list[str]) -> tuple[float, float]:
    """One run of examples/tinker_grpo.py against a fresh live server; (before, after) held-out accuracy."""
    from tests.tinker_server import Server

    with tempfile.TemporaryDirectory() as d:
        server = Server(Path(d), Path(models), dtype="float32",
                        extra_env={} if cap == "native" else {"ATEN_CPU_CAPABILITY": cap})
        try:
            out = subprocess.run([sys.executable, "examples/tinker_grpo.py", "--base-url", server.url, "--api-key",
                                  server.keys["acme"], "--models", models, *extra], cwd=REPO, capture_output=True,
                                 text=True, timeout=3600, env={**os.environ, "PYTHONPATH": str(REPO)})
            if out.returncode:
                raise RuntimeError(out.stderr[-2000:] + server.logs())
            r = json.loads(out.stdout.strip().splitlines()[-1])
            return r["accuracy_before"], r["accuracy_after"]
        finally:
            server.close()


def tinker_spread(n: int, caps: list[str], models: str, extra: list[str]) -> None:
    from statistics import mean, stdev

    gains = []
    for cap in caps:
        for i in range(n):
            t0 = time.time()
            before, after = run_tinker(cap, models, extra)
            gains.append(after - before)
            print(f"tinker {cap:8s} run {i}: {before:.4f} -> {after:.4f} gain {after - before:+.4f} "
                  f"({time.time() - t0:.0f}s)", flush=True)
    m, sd = mean(gains), stdev(gains) if len(gains) > 1 else float("nan")
    print(f"tinker_gain_mean={m:.4f} tinker_gain_sd={sd:.4f} tinker_gain_min={min(gains):.4f} "
          f"tinker_gain_low={m - 3 * sd:.4f} runs={len(gains)}")


def _capability_env(cap: str) -> dict[str, str]:
    """This process's environment with the run's kernel path: ``native`` unsets ATEN_CPU_CAPABILITY."""
    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    return env if cap == "native" else {**env, "ATEN_CPU_CAPABILITY": cap}


def run(algo: str, cap: str, seed: int, models: str, model: str = "-",
        overrides: dict | None = None) -> dict[int, float]:
    with tempfile.TemporaryDirectory() as d:
        env = {**_capability_env(cap), "OMP_NUM_THREADS": "1"}
        out = subprocess.run([sys.executable, "-c", ONE_RUN, algo, str(seed), d + "/run", models, model,
                              json.dumps(overrides or {})], env=env, cwd=REPO, capture_output=True, text=True,
                             timeout=3600)
        if out.returncode:
            raise RuntimeError(out.stderr[-2000:])
        return {int(k): v for k, v in json.loads(out.stdout.strip().splitlines()[-1]).items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--algos", default="grpo")
    ap.add_argument("--capabilities", default="native,avx2",
                    help="ATEN_CPU_CAPABILITY values, or native (unset: this CPU's best path, as the tests run)")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--models", default=str(REPO / ".cache" / "models"))
    ap.add_argument("--model", default="-", help="another starting model (an HF folder) than the bundled one")
    ap.add_argument("--jobs", type=int, default=1, help="runs at once (each is single-threaded)")
    ap.add_argument("--quick", action="store_true", help="grpo only, one seed, two kernel paths")
    ap.add_argument("--smoke", action="store_true", help="--quick cut to 2 steps per run: checks the script runs "
                    "(seconds; not a measurement)")
    ap.add_argument("--wrong", default="", help=f"the wrong-algorithm tests' spread instead: kinds from "
                    f"{','.join(WRONG_KINDS)} (each over --seeds)")
    ap.add_argument("--tinker", type=int, default=0, metavar="N", help="the Tinker example's spread instead: N "
                    "runs per kernel path of examples/tinker_grpo.py against a live server")
    ap.add_argument("--tinker-steps", type=int, default=None, help="the example's --steps (default: its own)")
    args = ap.parse_args()
    overrides = {}
    if args.quick or args.smoke:
        args.algos, args.seeds = "grpo", "0"
    if args.smoke:
        overrides = {"train": {"steps": 2, "eval_every": 1, "prompts_per_step": 4}, "data": {"eval_size": 16}}
        args.jobs = 2
    sys.path.insert(0, str(REPO))
    from trainer.models.tiny_arith import ensure_tiny_model

    ensure_tiny_model(args.models, log=lambda m: None)
    if args.tinker:  # --smoke: 2 runs of one step each, 16 held out
        extra = ["--steps", "1", "--eval", "16"] if args.smoke else \
            ["--steps", str(args.tinker_steps)] if args.tinker_steps else []
        tinker_spread(2 if args.smoke else args.tinker, ["default"] if args.smoke else args.capabilities.split(","),
                      args.models, extra)
        return
    if args.wrong:
        bad = set(args.wrong.split(",")) - set(WRONG_KINDS)
        if bad:
            ap.error(f"--wrong: unknown {sorted(bad)}; known: {', '.join(WRONG_KINDS)}")
        wrong_spread(args.wrong.split(","), [int(s) for s in args.seeds.split(",")], args.models, args.jobs)
        return
    from concurrent.futures import ThreadPoolExecutor

    combos = [(a, c, int(s)) for a in args.algos.split(",") for c in args.capabilities.split(",")
              for s in args.seeds.split(",")]
    gains_last, gains_late = [], []

    def one(combo):
        t0 = time.time()
        return combo, run(*combo, args.models, args.model, overrides), time.time() - t0

    with ThreadPoolExecutor(args.jobs) as ex:
        for (algo, cap, seed), ev, secs in ex.map(one, combos):
            steps = sorted(ev)
            last, late = ev[steps[-1]] - ev[0], (ev[steps[-1]] + ev[steps[-2]]) / 2 - ev[0]
            gains_last.append(last)
            gains_late.append(late)
            print(f"{algo:10s} {cap:8s} seed {seed}: " + " ".join(f"{s}:{ev[s]:.4f}" for s in steps)
                  + f"  gain_last {last:+.4f} gain_late {late:+.4f}  ({secs:.0f}s)", flush=True)
    print(f"min_gain_last={min(gains_last):.4f} min_gain_late={min(gains_late):.4f} runs={len(combos)}")


if __name__ == "__main__":
    main()
