"""Real tasks on a real model: held-out accuracy gained in a fixed wall-clock budget, ours vs TRL.

For each task (math: reasoning-gym arithmetic at a difficulty where SmolLM2-135M-Instruct starts between
15% and 50%; code: our procedural function-synthesis problems, difficulty 2, run in the sandbox) this
trains SmolLM2 with our GRPO (examples/jobs/real-*.yaml: the recipe `rlvr demo --task … --model
smollm2-135m` runs) and with TRL's GRPOTrainer on the same model, prompts (same chat messages), verifier,
G, prompts per step, temperature, completion cap and stop strings, learning rate, β = 0 and thread count,
for the same wall-clock budget. Each trainer's weights are copied (off the clock) at 1/8, 1/4, 1/2 and all of its budget and
scored afterwards by the same greedy held-out evaluation (trainer.loop.evaluate with the job's verifier):
accuracy against wall-clock, for both, in one run. A PNG of the curves is written next to the JSON.

    rlvr models pull smollm2-135m
    .venv/bin/python bench/learning.py                      # both tasks, 30 min per trainer per task
    .venv/bin/python bench/learning.py --quick              # the tiny code model's task, ≤ 5 min
    .venv/bin/python bench/learning.py --tasks code --trainers trl --out /tmp/trl   # one trainer per process,
    .venv/bin/python bench/learning.py --merge bench/results/learning.json /tmp/trl/learning.json  # then one plot

Needs `pip install 'rlvr[bench]'` (trl, matplotlib). Last line:
``math_gain= code_gain= trl_math_gain= trl_code_gain= minutes=`` (absolute held-out accuracy gains).
"""
from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import torch  # noqa: E402

from grpo_vs_trl import FRACTIONS, Snapshots  # noqa: E402
from service.cli.recipes import REAL, recipe  # noqa: E402
from trainer.models.resolve import resolve_model  # noqa: E402
from trainer.config import JobSpec  # noqa: E402
from trainer.splits import load_splits  # noqa: E402
from trainer.engines import ENGINES  # noqa: E402
from trainer.loop import evaluate, train  # noqa: E402
from trainer.scoring import Scorer  # noqa: E402


def model_dir(name: str, models: Path) -> Path:
    if name == "smollm2-135m":
        from trainer.models.pull import pull

        return pull(name, models, log=lambda m: print(m, file=sys.stderr))
    return resolve_model(name, models, log=lambda m: None)


def held_out(model, tok, spec: JobSpec, eval_set) -> dict[str, float]:
    return evaluate(ENGINES["hf"](model, tok), Scorer(spec.verifiers), eval_set, spec.rollout.max_new_tokens,
                    batch=64, stop=spec.rollout.stop)


def score_snapshots(snaps: Snapshots, model, tok, spec, eval_set) -> dict[float, float]:
    out = {}
    for f, state in sorted(snaps.taken.items()):
        model.load_state_dict(state)
        out[f] = held_out(model.eval(), tok, spec, eval_set)["eval/accuracy"]
    return out


def run_ours(spec: JobSpec, mdir: Path, budget_s: float, work: Path, eval_set) -> dict:
    import trainer.loop as loop

    live, stamps = {}, []
    setup = loop.setup

    def keep(*a, **kw):  # the bench holds the live policy, to snapshot it (bench-only hook)
        run = setup(*a, **kw)
        live["model"] = run.ctx.policy
        return run

    def on_step(step, m):
        if step == 0:  # the clock starts after our step-0 eval: TRL runs none
            snaps.t0, snaps.paused = time.perf_counter(), 0.0
        stamps.append(time.perf_counter())
        snaps.maybe_take(live["model"])

    spec.model.path = str(mdir)
    spec.train.eval_every = 0
    loop.setup = keep
    snaps = Snapshots(budget_s)
    try:
        res = train(spec, work / "ours", models_dir=work, log=lambda m: None, on_step=on_step,
                    should_stop=lambda: "pause" if snaps.over() else None)
    finally:
        loop.setup = setup
    wall = snaps.elapsed()
    snaps.maybe_take(live["model"], final=True)
    from transformers import AutoTokenizer

    acc = score_snapshots(snaps, live["model"], AutoTokenizer.from_pretrained(mdir), spec, eval_set)
    steps = [b - a for a, b in zip(stamps, stamps[1:])]
    return {"steps": res.step, "s_per_step": statistics.median(steps[1:] or steps or [0]), "wall_s": wall,
            "accuracy": acc[1.0], "accuracy_at": acc}


def run_trl(spec: JobSpec, mdir: Path, budget_s: float, work: Path, train_set, eval_set) -> dict:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    scorer = Scorer(spec.verifiers)  # the job's verifiers, weighted as in ours
    G, P = spec.rollout.group_size, spec.train.prompts_per_step

    def reward(completions, reference, **_):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return scorer(texts, [json.loads(r) for r in reference]).rewards

    msgs = lambda p: [{"role": "user", "content": p}] if isinstance(p, str) else p  # noqa: E731
    rows = [{"prompt": msgs(s["prompt"]), "reference": json.dumps(s["reference"])} for s in train_set]
    cfg = GRPOConfig(
        output_dir=str(work / "trl"), num_generations=G, per_device_train_batch_size=P * G,
        gradient_accumulation_steps=1, max_completion_length=spec.rollout.max_new_tokens,
        learning_rate=spec.optim.lr, beta=spec.algo.kl_coef, temperature=spec.rollout.temperature, top_k=0,
        loss_type="dapo", scale_rewards="group", num_iterations=1, epsilon=spec.algo.clip_eps_low,
        max_steps=100_000, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        max_grad_norm=spec.optim.max_grad_norm, gradient_checkpointing=False, bf16=False, use_cpu=True,
        logging_steps=1, save_strategy="no", report_to="none", seed=spec.train.seed,
        disable_tqdm=True, dataloader_num_workers=0,
        generation_kwargs={"stop_strings": list(spec.rollout.stop)} if spec.rollout.stop else None,
    )
    stamps: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kw):
            stamps.append(time.perf_counter())
            snaps.maybe_take(model)
            if snaps.over():
                control.should_training_stop = True

    tok = AutoTokenizer.from_pretrained(mdir)
    model = AutoModelForCausalLM.from_pretrained(mdir, dtype=torch.float32)
    if spec.rollout.stop:
        # the same stop strings as ours: TRL 1.16 calls generate() without the tokenizer that
        # transformers needs to match `stop_strings`, so it is bound here (bench only). Generate pads a
        # stopped row with pad = <|im_end|> = EOS on SmolLM2, so TRL's mask ends there, as after an EOS.
        model.generate = functools.partial(model.generate, tokenizer=tok)
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=cfg, train_dataset=Dataset.from_list(rows),
                          processing_class=tok, callbacks=[Clock()])
    snaps = Snapshots(budget_s)  # the clock starts here for TRL too: after model load, before step 1
    trainer.train()
    wall = snaps.elapsed()
    snaps.maybe_take(trainer.model, final=True)
    steps = [b - a for a, b in zip(stamps, stamps[1:])]
    acc = score_snapshots(snaps, trainer.model, tok, spec, eval_set)
    return {"steps": len(stamps), "s_per_step": statistics.median(steps or [0]), "wall_s": wall,
            "accuracy": acc[1.0], "accuracy_at": acc}


def run_task(name: str, spec_dict: dict, model: str, minutes: float, threads: int, models: Path, work: Path,
             who: set[str]) -> dict:
    spec = JobSpec.model_validate({**spec_dict, "train": {**spec_dict["train"], "steps": 100_000,
                                                          "threads": threads}})
    mdir = model_dir(model, models)
    torch.set_num_threads(threads)
    spec.model.path = str(mdir)
    train_set, eval_set = load_splits(spec.data)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    start = held_out(AutoModelForCausalLM.from_pretrained(mdir), AutoTokenizer.from_pretrained(mdir), spec, eval_set)
    print(f"{name}: held-out start {start}", file=sys.stderr, flush=True)
    budget = minutes * 60
    ours = run_ours(spec.model_copy(deep=True), mdir, budget, work / name, eval_set) if "ours" in who else None
    print(f"{name}: ours {ours}", file=sys.stderr, flush=True)
    gc.collect()  # our policy, reference and snapshots go before TRL loads its own
    theirs = run_trl(spec, mdir, budget, work / name, train_set, eval_set) if "trl" in who else None
    print(f"{name}: trl {theirs}", file=sys.stderr, flush=True)
    return {"start": start, "ours": ours, "trl": theirs, "budget_s": budget, "spec": spec_dict}


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4), squeeze=False)
    for ax, (task, r) in zip(axes[0], results.items()):
        start = r["start"]["eval/accuracy"]
        for who, style in (("ours", "o-"), ("trl", "s--")):
            if r[who] is None:
                continue
            xs = [0.0] + [f * r[who]["wall_s"] / 60 for f in FRACTIONS]
            ys = [start] + [r[who]["accuracy_at"][f] for f in FRACTIONS]
            ax.plot(xs, ys, style, label=f"{'rlvr GRPO' if who == 'ours' else 'TRL GRPOTrainer'} "
                                          f"({r[who]['steps']} steps)")
        ax.set_title(f"{task}: held-out accuracy vs wall-clock")
        ax.set_xlabel("minutes of training (2 CPU cores)")
        ax.set_ylabel("held-out pass@1 (greedy)")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def merged(paths: list[str]) -> dict:
    """Per task, each trainer's figures from whichever run has them (the start eval is deterministic:
    greedy, same model and held-out set, so the runs must agree on it)."""
    out: dict = {}
    for p in paths:
        for task, r in json.loads(Path(p).read_text()).items():
            if not isinstance(r, dict):  # a free-text entry ("note") kept beside the figures
                continue
            for who in ("ours", "trl"):
                if r.get(who):
                    r[who]["accuracy_at"] = {float(k): v for k, v in r[who]["accuracy_at"].items()}
            have = out.setdefault(task, r)
            if abs(have["start"]["eval/accuracy"] - r["start"]["eval/accuracy"]) > 1e-9:
                raise SystemExit(f"{p}: {task} starts at {r['start']['eval/accuracy']}, the other run at "
                                 f"{have['start']['eval/accuracy']}: not the same setup")
            for who in ("ours", "trl"):
                have[who] = have.get(who) or r.get(who)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--tasks", default="math,code")
    ap.add_argument("--minutes", type=float, default=30.0, help="wall-clock training budget per trainer per task")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-trl", action="store_true", help="ours only (then TRL's figures are not reported)")
    ap.add_argument("--trainers", default="ours,trl", help="which trainers run: ours, trl or both (each alone "
                    "in its own process keeps the other's memory out of it; the 24 GB VM once ran out in TRL's "
                    "code run after ours)")
    ap.add_argument("--quick", action="store_true", help="the tiny code model's task, 2 minutes per trainer")
    ap.add_argument("--merge", nargs="*", default=[], metavar="JSON", help="no training: merge the per-task "
                    "figures of earlier runs (ours and TRL run in separate processes), re-plot, print the last line")
    ap.add_argument("--out", default=str(REPO / "bench" / "results"), help="where the JSON and the PNG go")
    ap.add_argument("--models", default=os.environ.get("RLVR_MODELS", str(REPO / ".cache" / "models")))
    a = ap.parse_args()
    specs = {t: recipe(REAL[t]) for t in a.tasks.split(",")}
    if a.quick:
        a.minutes, a.threads, a.model = 2.0, 1, "builtin:tiny-code"
        specs = {"code": recipe("demo-code")}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    who = set(a.trainers.split(",")) - ({"trl"} if a.no_trl else set())
    if not who or who - {"ours", "trl"}:
        ap.error(f"--trainers: ours, trl or both (got {a.trainers!r})")
    t0 = time.time()
    stem = "learning-quick" if a.quick else "learning"
    results = merged(a.merge) if a.merge else {}
    with tempfile.TemporaryDirectory(prefix="learning-") as tmp:
        for t, s in ({} if a.merge else specs).items():
            results[t] = run_task(t, s, a.model, a.minutes, a.threads, Path(a.models), Path(tmp), who)
            # each task's figures are kept as soon as they exist: a run killed later (the 2-core VM's
            # memory ran out in TRL's code run once) loses only the task it was in
            (out / f"{stem}.json").write_text(json.dumps(results, indent=1, default=str))
            gc.collect()
    if a.merge:
        (out / f"{stem}.json").write_text(json.dumps(results, indent=1, default=str))
        a.minutes = max(r["budget_s"] for r in results.values()) / 60
    plot(results, out / f"{stem}.png")

    def gain(task: str, who: str) -> str:
        r = results.get(task)
        if not r or not r[who]:
            return "na"
        return f"{r[who]['accuracy'] - r['start']['eval/accuracy']:+.3f}"

    print(json.dumps({t: {"start": r["start"]["eval/accuracy"], "ours": r["ours"] and r["ours"]["accuracy_at"],
                          "trl": r["trl"] and r["trl"]["accuracy_at"]} for t, r in results.items()}))
    print(f"(total {time.time() - t0:.0f} s)", flush=True)
    print(f"math_gain={gain('math', 'ours')} code_gain={gain('code', 'ours')} trl_math_gain={gain('math', 'trl')} "
          f"trl_code_gain={gain('code', 'trl')} minutes={a.minutes:g} model={a.model} png={out / (stem + '.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
