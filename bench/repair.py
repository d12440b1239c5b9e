"""Code repair episodes vs single-shot GRPO at equal wall clock (issue 29).

Two arms per seed, each trained for the same wall-clock budget from the same model: **single** — GRPO on
single completions of builtin:code_functions; **repair** — GRPO on 3-turn code-repair episodes of the same
problems (builtin:code_repair: a failing public test's message is shown and the model revises; the reward is
the hidden tests on the final answer). Both are then evaluated alike, greedy, on the same held-out problems
played as 3-turn repair episodes: strict pass@1 of the FINAL answer (hidden tests) and of the FIRST attempt,
and the fix rate (of the problems the first attempt failed, the share the final answer solves). The base
model is evaluated the same way (fix_rate_before). The clock starts at the first training step (after the
step-0 eval) and evaluation runs after training, so neither arm pays for it.

Full: SmolLM2-135M-Instruct (``rlvr models pull smollm2-135m``), difficulty 2, 30 minutes per arm, 3 seeds
(3 hours: run it on a quiet machine). ``--quick``: the bundled tiny code model on builtin:code_repair_tiny
(its one test is public and hidden alike: the plumbing and the clock, not generalisation), 3 seeds, 15 s per
arm, under 5 minutes. ``--smoke``: the same at the smallest size, seconds.

Last line: ``repair_gain= fix_rate_before= fix_rate_after= seeds= model=`` (gain in pass@1 points, final
answer, repair arm minus single arm, mean over seeds) plus the per-arm means.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("OMP_NUM_THREADS", "1")

from trainer import episodes  # noqa: E402
from trainer.config import EpisodesConfig, JobSpec  # noqa: E402
from trainer.engines import ENGINES  # noqa: E402
from trainer.rollout import SamplingParams  # noqa: E402
from trainer.scoring import Scorer  # noqa: E402
from trainer.splits import load_splits  # noqa: E402


def specs(a, seed: int) -> tuple[JobSpec, JobSpec]:
    """(single, repair) job specs: the same model, problems, sampling and optimiser."""
    tiny = a.model == "builtin:tiny-code"
    data = {"eval_size": a.eval_size, "seed": 0} | ({} if tiny else {"params": {"difficulty": [2]}})
    common = {"model": {"path": a.model}, "verifiers": [{"name": "code", "config": {"timeout_s": 5}}],
              "rollout": {"group_size": a.group_size, "max_new_tokens": a.max_new,
                          "temperature": 1.0 if tiny else 0.7, "stop": [] if tiny else ["\n```\n"]},
              "optim": {"lr": 1e-4 if tiny else 5e-6},
              # at most 2,048 padded tokens per forward/backward (the same gradient, accumulated): a 3-turn
              # episode runs to ~1,200 tokens with its prompt, SmolLM2 keeps ~1.6 MB of activations per token
              # (fp32), and 32 such rows at once were killed for memory; 8 rows per pass still held ~15 GB
              "algo": {"micro_batch_tokens": 2048},
              "train": {"steps": 100_000, "prompts_per_step": a.prompts, "eval_every": 0, "seed": seed,
                        "threads": a.threads}}
    single = JobSpec.model_validate({**common, "data": {**data, "dataset": "builtin:code_tiny" if tiny else
                                                        "builtin:code_functions"}})
    repair = JobSpec.model_validate({**common, "data": {**data, "dataset": "builtin:code_repair_tiny" if tiny else
                                                        "builtin:code_repair"},
                                     "episodes": episodes_cfg(a, tiny).model_dump()})
    return single, repair


def episodes_cfg(a, tiny: bool) -> EpisodesConfig:
    return EpisodesConfig(env={"type": "code_repair"}, format="tags" if tiny else "chat", max_turns=3,
                          max_episode_tokens=a.max_new * 3 + 600, max_observation_tokens=200, eval_tools_off=False)


def humaneval_spec(repair: JobSpec, n: int) -> JobSpec:
    """The repair job's evaluation on HumanEval played as repair (builtin:humaneval_repair), longer answers."""
    d = repair.model_dump()
    d["data"] = {"dataset": "builtin:humaneval_repair", "eval_size": n}
    d["rollout"]["max_new_tokens"] = max(256, d["rollout"]["max_new_tokens"])
    return JobSpec.model_validate(d)


def repair_eval(model, tok, spec: JobSpec, cfg: EpisodesConfig, held) -> dict[str, float]:
    """Greedy 3-turn repair episodes on the held-out problems: pass@1 of the final and first attempts (the
    hidden tests, strict), and the fix rate."""
    refs = [s["reference"] for s in held]
    r = spec.rollout
    eps, _ = episodes.run(ENGINES["hf"](model.eval(), tok), tok, [s["prompt"] for s in held], 1,
                          SamplingParams(r.max_new_tokens, greedy=True, stop=tuple(r.stop)), cfg,
                          episodes.Tools.from_spec(cfg, 0), references=refs)
    score = Scorer(spec.verifiers)
    final = score([e.model_text() for e in eps], refs).correct
    first = score([e.first_text() for e in eps], refs).correct
    failed = [f for f, ok in zip(final, first) if not ok]
    return {"final": sum(final) / len(held), "first": sum(first) / len(held),
            "fix_rate": sum(failed) / len(failed) if failed else 0.0,
            "final_outcomes": "".join("1" if c else "0" for c in final),
            "first_outcomes": "".join("1" if c else "0" for c in first)}


def run_arm(spec: JobSpec, budget_s: float, work: Path, models: Path) -> tuple[object, int]:
    """Train ``spec`` for ``budget_s`` of wall clock from its first step; (the trained policy, steps)."""
    import trainer.loop as loop

    live, clock = {}, {"t0": None}
    setup = loop.setup

    def keep_policy(*args, **kw):  # the bench holds the live policy to evaluate it after (bench-only hook)
        run = setup(*args, **kw)
        live["model"] = run.ctx.policy
        return run

    def on_step(step, m):
        if step == 0 or clock["t0"] is None:
            clock["t0"] = time.perf_counter()

    loop.setup = keep_policy
    try:
        res = loop.train(spec, work, models_dir=models, log=lambda m: None, on_step=on_step,
                         should_stop=lambda: "pause" if clock["t0"] and time.perf_counter() - clock["t0"] > budget_s
                         else None)
    finally:
        loop.setup = setup
    return live["model"], res.step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--budget-s", type=float, default=1800.0, help="wall clock per arm")
    ap.add_argument("--eval-size", type=int, default=100)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--first-seed", type=int, default=0, help="seeds --first-seed .. + --seeds - 1 (one process "
                    "per seed, then --merge: a killed run loses one seed)")
    ap.add_argument("--out", default=None, help="a JSON file for the per-seed rows (written after every seed)")
    ap.add_argument("--merge", nargs="*", default=[], metavar="JSON", help="no training: report earlier runs' rows")
    ap.add_argument("--humaneval", type=int, default=0, metavar="N",
                    help="also play the first N problems of builtin:humaneval_repair (public tests from the "
                    "docstrings, the check hidden) with the base model and each arm: fix rates on HumanEval")
    ap.add_argument("--quick", action="store_true", help="tiny code model, 15 s per arm, < 5 min")
    ap.add_argument("--smoke", action="store_true", help="--quick at the smallest size, seconds")
    a = ap.parse_args()
    if a.quick or a.smoke:
        a.model, a.group_size, a.prompts, a.max_new = "builtin:tiny-code", 4, 4, 16
        a.budget_s, a.eval_size = (15.0, 48) if a.quick else (1.0, 4)
        a.seeds = 3 if a.quick else 1
    a.threads = a.threads or 1
    t_start = time.perf_counter()
    rows = merged(a) if a.merge else train_seeds(a)
    if a.out and not a.merge:
        write(a.out, a, rows)
    report(a, rows, time.perf_counter() - t_start)


def train_seeds(a) -> list[dict]:
    from transformers import AutoTokenizer

    from trainer.models.resolve import resolve_model

    models = Path(os.environ.get("RLVR_MODELS", Path.home() / ".rlvr" / "models"))
    # the tests' cache of the built tiny model, for --quick/--smoke only: a named model stays where
    # RLVR_MODELS says (a test run that built .cache/models once sent every later SmolLM2 seed there)
    if a.model.startswith("builtin:") and not (models / "tiny-code").exists() \
            and (REPO / ".cache" / "models" / "tiny-code").exists():
        models = REPO / ".cache" / "models"
    mdir = resolve_model(a.model, models, log=lambda m: None)
    tok = AutoTokenizer.from_pretrained(mdir)
    rows: list[dict] = []
    base_eval = None
    with tempfile.TemporaryDirectory(prefix="bench-repair-") as tmp:
        for seed in range(a.first_seed, a.first_seed + a.seeds):
            single, repair = specs(a, seed)
            cfg = episodes_cfg(a, a.model == "builtin:tiny-code")
            _, held = load_splits(repair.data)
            he = humaneval_spec(repair, a.humaneval) if a.humaneval else None
            he_held = load_splits(he.data)[1] if he else []
            he_cfg = episodes_cfg(argparse.Namespace(max_new=he.rollout.max_new_tokens), False) if he else None
            out = {"seed": seed}
            for name, spec in (("single", single), ("repair", repair)):
                model, steps = run_arm(spec, a.budget_s, Path(tmp) / f"{name}-{seed}", models)
                out[name] = repair_eval(model, tok, repair, cfg, held) | {"steps": steps}
                if he:
                    out[f"{name}_humaneval"] = repair_eval(model, tok, he, he_cfg, he_held)
                del model
            if base_eval is None:  # the base model, greedy: the same held-out set every seed, evaluated once
                from transformers import AutoModelForCausalLM

                base = AutoModelForCausalLM.from_pretrained(mdir)
                base_eval = {"base": repair_eval(base, tok, repair, cfg, held)}
                if he:
                    base_eval["base_humaneval"] = repair_eval(base, tok, he, he_cfg, he_held)
            out |= base_eval
            rows.append(out)
            if a.out:  # after every seed: a run killed later keeps what it finished
                write(a.out, a, rows)
            print(f"seed={seed} " + " ".join(f"{arm}_{k}={v:.3f}" if isinstance(v, float) else f"{arm}_{k}={v}"
                                             for arm in out if arm != "seed" for k, v in out[arm].items()
                                             if not k.endswith("_outcomes")),
                  flush=True)
    return rows


def merged(a) -> list[dict]:
    """The rows of earlier runs, each seed once; the report names their model and budget, which must agree (a
    --merge run's own --model and --budget-s are defaults, not what the rows were trained with)."""
    runs = [json.loads(Path(p).read_text()) for p in a.merge]
    for key in ("model", "budget_s"):
        seen = {str(r["_meta"][key]) for r in runs}
        if len(seen) > 1:
            raise SystemExit(f"--merge: the runs differ in {key} ({', '.join(sorted(seen))})")
        setattr(a, key, runs[0]["_meta"][key])
    rows = [r for run in runs for r in run["rows"]]
    seeds = [r["seed"] for r in rows]
    if len(set(seeds)) < len(seeds):
        raise SystemExit(f"--merge: a seed is given twice ({sorted(seeds)})")
    return rows


def write(path: str, a, rows: list[dict]) -> None:
    meta = {"argv": sys.argv[1:], "model": a.model, "budget_s": a.budget_s, "threads": a.threads,
            "load_avg": os.getloadavg()}
    Path(path).write_text(json.dumps({"_meta": meta, "rows": rows}, indent=1))


def report(a, rows: list[dict], wall_s: float) -> None:
    """Means over seeds; the repair − single difference with the s.e. of a difference (trainer.stats.seeds_diff:
    the seeds' scatter plus the held-out problems' paired noise)."""
    from trainer.stats import seeds_diff

    mean = lambda arm, k: statistics.mean(r[arm][k] for r in rows)  # noqa: E731
    runs = lambda arm, k: [[c == "1" for c in r[arm][f"{k}_outcomes"]] for r in rows]  # noqa: E731
    d = seeds_diff(runs("repair", "final"), runs("single", "final"))
    first = seeds_diff(runs("repair", "first"), runs("single", "first"))
    gain_base = seeds_diff(runs("repair", "final"), runs("base", "final")[:1])
    print(f"wall_s={wall_s:.0f} load={os.getloadavg()[0]:.1f}", flush=True)
    print(f"repair - single, final answer: {100 * d['diff']:+.1f} ± {100 * d['se']:.1f} points (first attempt "
          f"{100 * first['diff']:+.1f} ± {100 * first['se']:.1f}); repair - base, final: "
          f"{100 * gain_base['diff']:+.1f} ± {100 * gain_base['se']:.1f}; a difference is called one beyond 2 s.e.",
          flush=True)
    tail = ""
    if "base_humaneval" in rows[0]:
        he = {arm: mean(f"{arm}_humaneval", "final") for arm in ("base", "single", "repair")}
        dh = seeds_diff(runs("repair_humaneval", "final"), runs("single_humaneval", "final"))
        print(f"humaneval (repair episodes, {len(rows[0]['base_humaneval']['final_outcomes'])} problems): final "
              f"pass@1 base {he['base']:.3f} single {he['single']:.3f} repair {he['repair']:.3f} (repair - single "
              f"{100 * dh['diff']:+.1f} ± {100 * dh['se']:.1f} points); fix rate base "
              f"{mean('base_humaneval', 'fix_rate'):.3f} single {mean('single_humaneval', 'fix_rate'):.3f} repair "
              f"{mean('repair_humaneval', 'fix_rate'):.3f}", flush=True)
        tail = " " + " ".join(f"humaneval_{k}={v:.3f}" for k, v in he.items())
    print(f"repair_gain={100 * d['diff']:.1f} repair_gain_se={100 * d['se']:.1f} "
          f"fix_rate_before={mean('base', 'fix_rate'):.3f} "
          f"fix_rate_after={mean('repair', 'fix_rate'):.3f} seeds={len(rows)} model={a.model} "
          f"single_final={mean('single', 'final'):.3f} single_first={mean('single', 'first'):.3f} "
          f"repair_final={mean('repair', 'final'):.3f} repair_first={mean('repair', 'first'):.3f} "
          f"base_final={mean('base', 'final'):.3f} fix_rate_single={mean('single', 'fix_rate'):.3f} "
          f"single_steps={mean('single', 'steps'):.1f} repair_steps={mean('repair', 'steps'):.1f} "
          f"budget_s={a.budget_s:g}" + tail)


if __name__ == "__main__":
    main()
