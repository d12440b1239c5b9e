"""The policy losses at equal wall-clock on a multi-pass recipe, and on-policy distillation vs GRPO alone.

Every arm is the recipe ``demo-math-multipass`` (the bundled tiny model, 2 epochs x 4 minibatches per step, so
the ratio leaves 1 and each loss's clip acts) with only ``algo`` changed (``ARMS``): GRPO (symmetric clip,
sequence-mean), Dr. GRPO (no std, constant normaliser), DAPO (clip-higher, token-mean, dynamic sampling;
not its soft overlong punishment, which here punishes correct answers: ``ARMS``), CISPO, GSPO, GMPO, each at
its paper's clip range. Each trains for ``--minutes`` of wall-clock per seed, single-threaded, one arm after
another; its weights are copied (off the clock) when its clock passes 1/4, 1/2 and all of the budget and
every copy is scored after training by the same greedy held-out evaluation, the task's strict judge
(``eval/strict_accuracy``: math, evaluated answers only). Clocks start at the first step (after model load and
the step-0 eval).

Differences to GRPO are paired: the same seed, the same held-out problems. The s.e. of a difference is
sqrt(se_problems^2 + se_seeds^2): se_problems from the per-problem differences (averaged over seeds),
se_seeds from the per-seed differences (needs 2 seeds; 0 with one, said in the output). No loss is called
better than GRPO unless its difference at the full budget is beyond two such standard errors
(``best_loss=none`` otherwise). Step metrics are means over each arm's steps: clip_frac (and its low / high
sides), entropy over every sampled row, approx-KL(old || new) at the last epoch.

Distillation: seed ``seeds[0]``'s GRPO run goes on past the budget to ``--teacher-factor`` x it (its marks
are taken inside the budget, so its GRPO figures are those of an arm like the others); that end state is
the teacher. The student (the bundled model again) is distilled from it (``distill``: reverse KL alone,
verifier_weight 0) for the same budget per seed; ``distill_gain`` = its held-out accuracy minus GRPO's at
the full budget, paired as above. The teacher's own training time is not on the student's clock.
``--teacher``: distill from that model instead.

    .venv/bin/python bench/losses.py                 # 6 losses x 3 seeds x 3 min + distillation (~75 min)
    nice -n 10 .venv/bin/python bench/losses.py --quick   # grpo, cispo, gspo + distillation, 1 seed, 40 s each
    .venv/bin/python bench/losses.py --smoke         # CI: grpo, cispo + distillation, 2 s each, 4 prompts x 4,
                                                     # 16 held out (checks the script runs; not a measurement)

Last line: ``best_loss= best_vs_grpo= best_vs_grpo_se= distill_gain= seeds=`` then per-arm figures.
JSON: bench/results/losses[-quick].json (not written by --smoke).
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

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

FRACTIONS = (0.25, 0.5, 1.0)
# each loss as its paper runs it; everything else is the recipe's
ARMS: dict[str, dict] = {
    "grpo": {"clip_eps_low": 0.2, "clip_eps_high": 0.2, "loss_agg": "seq-mean-token-mean"},
    "dr_grpo": {"advantage": "grpo_no_std", "clip_eps_low": 0.2, "clip_eps_high": 0.2,
                "loss_agg": "seq-mean-token-sum-norm"},
    # No soft overlong punishment: this recipe's correct answer is 11-12 tokens of its 12 (`\\boxed{46}` + EOS),
    # so any buffer punishes correct answers and a short wrong one beats a well-formed wrong one; with 4 (the
    # ramp from 8 tokens) all 3 DAPO seeds collapsed to 0.000 held out, entropy 0.03-0.09 (2026-12-02). DAPO's
    # own ramp starts at 16k of 20k tokens, past its answers.
    "dapo": {"clip_eps_low": 0.2, "clip_eps_high": 0.28, "loss_agg": "token-mean", "zero_variance": "resample"},
    # MiniMax-M1 bounds the weight above only: 1 - 1.0 = 0 leaves no lower bound
    "cispo": {"policy_loss": "cispo", "clip_eps_low": 1.0, "clip_eps_high": 0.28, "loss_agg": "token-mean"},
    "gspo": {"policy_loss": "gspo", "clip_eps_low": 3e-4, "clip_eps_high": 4e-4, "loss_agg": "seq-mean-token-mean"},
    "gmpo": {"policy_loss": "gmpo", "clip_eps_low": 0.33, "clip_eps_high": 0.49, "loss_agg": "seq-mean-token-mean"},
}
STEP_KEYS = ("clip_frac", "clip_frac_low", "clip_frac_high", "entropy")


def spec_for(base: dict, arm: str, seed: int, teacher: str | None = None):
    from trainer.config import JobSpec

    algo = {**base["algo"], **ARMS["grpo" if arm == "distill" else arm]}
    extra = {"distill": {"teacher": teacher, "coef": 1.0, "verifier_weight": 0.0}} if arm == "distill" else {}
    return JobSpec.model_validate({**base, **extra, "name": f"losses-{arm}-{seed}", "algo": algo,
                                   "train": {**base["train"], "seed": seed, "steps": 100_000, "eval_every": 0,
                                             "threads": 1}})


def run(spec, budget_s: float, models: Path, work: Path, run_for_s: float | None = None,
        keep: Path | None = None) -> dict:
    """One arm: train ``run_for_s`` (default the budget) of wall-clock, weights copied at each fraction of
    ``budget_s``; then each copy's held-out records. ``keep``: the final weights are saved there (a teacher)."""
    import torch

    from trainer import loop
    from trainer.engines import ENGINES
    from trainer.evaluation import evaluate

    run_for_s = run_for_s or budget_s
    live, taken, steps, start = {}, {}, [], {}
    clock = {"t0": time.perf_counter(), "paused": 0.0}

    def elapsed() -> float:
        return time.perf_counter() - clock["t0"] - clock["paused"]

    def take(final: bool = False) -> None:
        t = time.perf_counter()
        for f in FRACTIONS:
            if f not in taken and (elapsed() >= f * budget_s or final):
                taken[f] = {k: v.detach().clone() for k, v in live["run"].ctx.policy.state_dict().items()}
        clock["paused"] += time.perf_counter() - t

    def on_step(step, m):
        if step == 0:  # the loop's step-0 eval: the starting model's held-out accuracy
            start["acc"] = m.get("eval/strict_accuracy")
            clock["t0"], clock["paused"] = time.perf_counter(), 0.0
            return
        if elapsed() <= budget_s or len(taken) < len(FRACTIONS):  # the budget's steps (the teacher goes on)
            kl = [k for k in m if k.startswith("update/approx_kl_epoch_")]
            steps.append({**{k: m.get(k) for k in STEP_KEYS}, "approx_kl": m[max(kl)] if kl else None,
                          "t": elapsed()})
        take()

    setup = loop.setup

    def keep_run(*a, **kw):
        live["run"] = r = setup(*a, **kw)
        return r

    loop.setup = keep_run
    try:
        loop.train(spec, work / spec.name, models_dir=models, log=lambda m: None, on_step=on_step,
                   should_stop=lambda: "pause" if elapsed() > run_for_s else None)
    finally:
        loop.setup = setup
    take(final=True)  # a run shorter than its budget (a slow step): its last weights stand for the rest
    r = live["run"]
    ctx = r.ctx
    if keep is not None:
        ctx.policy.save_pretrained(keep)
        ctx.tok.save_pretrained(keep)
    engine = ENGINES["hf"](ctx.policy.eval(), ctx.tok)
    ro = spec.rollout

    def score() -> list[int]:
        recs: list[dict] = []
        evaluate(engine, ctx.scorer, r.eval_set, ro.max_new_tokens, strict=r.strict, records=recs, stop=ro.stop)
        return [int(bool(x["strict_correct"])) for x in recs]

    final = score() if keep is not None else None  # the teacher's own end state
    correct = {}
    for f, state in sorted(taken.items()):
        ctx.policy.load_state_dict(state)
        correct[f] = score()
    torch.set_num_threads(1)
    mean = {k: _mean([s[k] for s in steps]) for k in (*STEP_KEYS, "approx_kl")}
    return {"correct_at": correct, "accuracy_at": {f: sum(c) / len(c) for f, c in correct.items()},
            "steps": len(steps), "budget_s": budget_s, "ran_s": min(elapsed(), run_for_s), "step_means": mean,
            "start_accuracy": start.get("acc"),
            "final_accuracy": sum(final) / len(final) if final else None}


def _mean(xs: list) -> float | None:
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def paired_diff(arm: list[list[int]], base: list[list[int]]) -> tuple[float, float, float, float]:
    """Mean accuracy difference arm - base over seeds x problems (each seed's lists: the same problems in
    the same order) and its s.e.: sqrt(se_problems^2 + se_seeds^2), and those two parts."""
    n, s = len(base[0]), len(base)
    per_problem = [sum(a[i] - b[i] for a, b in zip(arm, base)) / s for i in range(n)]
    diff = sum(per_problem) / n
    se_p = statistics.stdev(per_problem) / n ** 0.5 if n > 1 else 0.0
    per_seed = [(sum(a) - sum(b)) / n for a, b in zip(arm, base)]
    se_s = statistics.stdev(per_seed) / s ** 0.5 if s > 1 else 0.0
    return diff, (se_p ** 2 + se_s ** 2) ** 0.5, se_p, se_s


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--losses", default=",".join(ARMS), help=f"arms, grpo first (the peer); known: {','.join(ARMS)}")
    ap.add_argument("--minutes", type=float, default=3.0, help="wall-clock budget per arm and seed")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--teacher-factor", type=float, default=2.0, help="the teacher: GRPO for this x the budget")
    ap.add_argument("--teacher", help="a model to distill from instead (an HF folder or a name a job can "
                    "load, e.g. the learning test's end state): the first GRPO seed then stops at the budget too")
    ap.add_argument("--no-distill", action="store_true")
    ap.add_argument("--quick", action="store_true", help="grpo, cispo, gspo + distillation, 1 seed, 40 s each")
    ap.add_argument("--smoke", action="store_true", help="grpo, cispo + distillation, 1 seed, 2 s each, a small "
                    "batch: checks the script runs (seconds; not a measurement)")
    ap.add_argument("--models", default=os.environ.get("RLVR_MODELS", str(REPO / ".cache" / "models")))
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    a = ap.parse_args()
    from service.cli.recipes import recipe

    if a.quick:
        a.losses, a.seeds, a.minutes = "grpo,cispo,gspo", 1, 40 / 60
    if a.smoke:
        a.losses, a.seeds, a.minutes = "grpo,cispo", 1, 2 / 60
    losses = a.losses.split(",")
    if losses[0] != "grpo" or set(losses) - set(ARMS):
        ap.error(f"--losses: grpo first, then any of {','.join(ARMS)}")
    base = recipe("demo-math-multipass")
    if a.smoke:
        base["data"]["eval_size"], base["train"]["prompts_per_step"], base["rollout"]["group_size"] = 16, 4, 4
        base["algo"]["minibatch_size"] = 8
    budget, models = a.minutes * 60, Path(a.models)
    seeds = list(range(a.seeds))
    load = os.getloadavg()[0]
    res: dict[str, list[dict]] = {}
    teacher_acc = None
    with tempfile.TemporaryDirectory(prefix="losses-bench-") as tmp:
        work, teacher = Path(tmp), a.teacher or Path(tmp) / "teacher"
        for arm in losses:
            for seed in seeds:
                make_teacher = arm == "grpo" and seed == seeds[0] and not (a.no_distill or a.teacher)
                r = run(spec_for(base, arm, seed), budget, models, work,
                        run_for_s=budget * a.teacher_factor if make_teacher else None,
                        keep=teacher if make_teacher else None)
                if make_teacher:
                    teacher_acc = r["final_accuracy"]
                res.setdefault(arm, []).append(r)
                print(f"{arm:8s} seed {seed}: {r['steps']} steps; held-out " + " ".join(
                    f"@{f:g}={r['accuracy_at'][f]:.3f}" for f in FRACTIONS) + "; " + " ".join(
                    f"{k}={v:.4f}" if v is not None else f"{k}=null" for k, v in r["step_means"].items()), flush=True)
        if not a.no_distill:
            if teacher_acc is not None:
                print(f"teacher (grpo seed {seeds[0]}, {a.teacher_factor:g} x the budget): held-out {teacher_acc:.3f}")
            for seed in seeds:
                r = run(spec_for(base, "distill", seed, str(teacher)), budget, models, work)
                res.setdefault("distill", []).append(r)
                print(f"distill  seed {seed}: {r['steps']} steps; held-out " + " ".join(
                    f"@{f:g}={r['accuracy_at'][f]:.3f}" for f in FRACTIONS), flush=True)
    n = len(res["grpo"][0]["correct_at"][1.0])
    acc_start = res["grpo"][0]["start_accuracy"]
    table = {}
    for arm, runs in res.items():
        table[arm] = {"steps": [r["steps"] for r in runs],
                      "accuracy_at": {f: _mean([r["accuracy_at"][f] for r in runs]) for f in FRACTIONS},
                      "step_means": {k: _mean([r["step_means"][k] for r in runs]) for k in runs[0]["step_means"]},
                      "vs_grpo": {}}
        for f in FRACTIONS:
            d, se, se_p, se_s = paired_diff([r["correct_at"][f] for r in runs],
                                            [r["correct_at"][f] for r in res["grpo"]])
            table[arm]["vs_grpo"][f] = {"diff": d, "se": se, "se_problems": se_p, "se_seeds": se_s}
    print(f"\nheld-out strict accuracy (mean of {len(seeds)} seed(s), {n} problems) at each equal-wall-clock mark "
          f"of {budget:g} s (the start: {acc_start:.3f}); vs grpo: paired difference ± s.e."
          + ("" if len(seeds) > 1 else
                                                                  " (one seed: problem sampling only, no seed spread)"))
    for arm, t in table.items():
        print(f"{arm:8s} steps {sum(t['steps']) / len(t['steps']):5.1f} " + "  ".join(
            f"@{f:g} {t['accuracy_at'][f]:.3f} ({t['vs_grpo'][f]['diff']:+.3f}±{t['vs_grpo'][f]['se']:.3f})"
            for f in FRACTIONS) + "  " + " ".join(
            f"{k}={v:.4f}" for k, v in t["step_means"].items() if v is not None))
    others = [arm for arm in losses if arm != "grpo"]
    best = max(others, key=lambda arm: table[arm]["vs_grpo"][1.0]["diff"], default=None)
    beyond = best is not None and table[best]["vs_grpo"][1.0]["diff"] > 2 * table[best]["vs_grpo"][1.0]["se"]
    top = table[best]["vs_grpo"][1.0] if best else {"diff": 0.0, "se": 0.0}
    dist = table.get("distill", {}).get("vs_grpo", {}).get(1.0)
    print(f"(load average at start: {load:.1f}; shared host. best = the largest difference at the full budget; "
          f"called better only beyond 2 s.e.: {'yes' if beyond else 'no'}"
          + (f"; teacher held-out {teacher_acc:.3f}" if teacher_acc is not None else "") + ")")
    out = {"budget_s": budget, "seeds": seeds, "losses": losses, "load_at_start": load, "held_out_n": n,
           "start_accuracy": acc_start, "teacher_accuracy": teacher_acc, "arms": table,
           "arms_config": {k: ARMS[k] for k in losses},
           "recipe": "demo-math-multipass", "best_loss": best if beyond else "none",
           "raw": {arm: [{k: v for k, v in r.items() if k != "correct_at"} for r in runs] for arm, runs in res.items()}}
    if not a.smoke:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / f"losses{'-quick' if a.quick else ''}.json").write_text(json.dumps(out, indent=1, default=str))
    print(f"best_loss={best if beyond else 'none'} best_candidate={best} best_vs_grpo={top['diff']:.4f} "
          f"best_vs_grpo_se={top['se']:.4f} distill_gain={dist['diff'] if dist else float('nan'):.4f} "
          f"distill_gain_se={dist['se'] if dist else float('nan'):.4f} "
          f"teacher_acc={teacher_acc if teacher_acc is not None else float('nan'):.4f} seeds={len(seeds)} "
          f"budget_s={budget:g} acc_start={acc_start:.4f} acc_grpo={table['grpo']['accuracy_at'][1.0]:.4f} " + " ".join(
              f"acc_{arm}={t['accuracy_at'][1.0]:.4f} clip_frac_{arm}="
              f"{t['step_means']['clip_frac'] if t['step_means']['clip_frac'] is not None else float('nan'):.4f}"
              for arm, t in table.items() if arm != "grpo"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
