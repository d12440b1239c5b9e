"""Real tasks on a real model: held-out accuracy gained, ours vs TRL, over seeds, judged strictly.

For each task (math: reasoning-gym two-term chain sums, where SmolLM2-135M-Instruct starts near 0.3; code: our
procedural function-synthesis problems, difficulty 2, run in the sandbox) this trains SmolLM2 with our GRPO
(examples/jobs/real-*.yaml: the recipe `rlvr demo --task … --model smollm2-135m` runs) and with TRL's
GRPOTrainer on the same model, prompts (same chat messages), verifier, G, prompts per step, temperature,
completion cap and stop strings, learning rate, β = 0 and thread count, for the same wall-clock budget, once
per seed (``--seeds``, default 3). Per seed, TRL runs first; our run then also keeps its weights at TRL's
final step count, so the two compare at equal steps as well as at equal wall-clock. Weights are copied off
the clock at each ``--marks`` fraction of the budget and scored afterwards by one greedy held-out eval
(trainer.evaluation.evaluate) with two judges: the task's strict one (an answer that restates the question
earns nothing) — every figure reported — and the lenient one (math's ``allow_unevaluated: true``), only to
report the **echo share**: of the answers the lenient judge calls correct, the share the strict judge rejects.

Reported per task and trainer at each mark: mean strict gain over seeds with the s.e. of that difference
(after − before on the same problems: paired), and ours − TRL with the s.e. of the difference
(trainer.stats.seeds_diff: the seeds' scatter plus the problems' paired noise). Then where our advantage lies:
steps per minute (the equal-wall-clock difference) or learning per step (the equal-step difference).

    rlvr models pull smollm2-135m
    .venv/bin/python bench/learning.py                             # both tasks, 30 min per trainer per task per seed
    .venv/bin/python bench/learning.py --tasks math --minutes 3 --marks 0.5,1   # a short budget (what RESULTS has)
    .venv/bin/python bench/learning.py --quick                     # the tiny arithmetic model, 3 seeds, < 5 min
    .venv/bin/python bench/learning.py --smoke                     # seconds: every part runs, nothing measured
    .venv/bin/python bench/learning.py --merge a/learning.json b/learning.json   # runs from several processes

Needs `pip install 'rlvr[bench]'` (trl). The JSON carries the commit, package versions, CPU, kernel path and
every eval's per-problem outcomes. Last line: ``math_gain= code_gain= trl_math_gain= trl_code_gain=
math_diff_se= code_diff_se= seeds= strict=1`` (mean strict held-out gains at the full budget; the s.e. of
ours − TRL there).
"""
from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from service.cli.recipes import REAL, recipe  # noqa: E402
from trainer.config import JobSpec  # noqa: E402
from trainer.engines import ENGINES  # noqa: E402
from trainer.evaluation import evaluate, strict_verifiers  # noqa: E402
from trainer.loop import train  # noqa: E402
from trainer.models.resolve import resolve_model  # noqa: E402
from trainer.scoring import Scorer  # noqa: E402
from trainer.splits import load_splits  # noqa: E402
from trainer.stats import seeds_diff  # noqa: E402

TRAINERS = ("ours", "trl")


def model_dir(name: str, models: Path) -> Path:
    if name == "smollm2-135m":
        from trainer.models.pull import pull

        return pull(name, models, log=lambda m: print(m, file=sys.stderr))
    return resolve_model(name, models, log=lambda m: None)


def teacher_path(name: str, tenant: str, models: Path) -> Path:
    """The folder a distillation teacher loads from: a finished job's ``ft:`` id through the service's own
    resolution (service.jobs.catalog, the store under $RLVR_HOME: what the worker does with a job's spec), a
    pulled name or a folder as any model."""
    if name.startswith("ft:"):
        from service.jobs.catalog import fine_tuned_path
        from service.settings import Settings
        from service.store.jobs import Store

        path = fine_tuned_path(Store(Settings().db_url), name, tenant)
        if path is None:
            raise SystemExit(f"--distill: no finished job of tenant {tenant!r} has the model {name!r} "
                             f"(store: $RLVR_HOME={os.environ.get('RLVR_HOME', '~/.rlvr')})")
        return path
    return model_dir(name, models)


def lenient_verifiers(spec: JobSpec):
    """The judge the old recipes used: math's allow_unevaluated on (an unevaluated expression equal to the answer,
    e.g. the question echoed, counts); other verifiers as the task declares them."""
    return [v.model_copy(update={"config": {**v.config, "allow_unevaluated": True}}) if v.name == "math" else v
            for v in strict_verifiers(spec)]


def held_out(model, tok, spec: JobSpec, eval_set) -> dict:
    """Strict and lenient accuracy, the echo share, and the per-problem strict outcomes (as a 0/1 string)."""
    rows: list[dict] = []
    evaluate(ENGINES["hf"](model, tok), Scorer(lenient_verifiers(spec)), eval_set, spec.rollout.max_new_tokens,
             batch=64, stop=spec.rollout.stop, strict=Scorer(strict_verifiers(spec)), records=rows)
    lenient = sum(r["correct"] for r in rows)
    echo = sum(r["correct"] and not r["strict_correct"] for r in rows)
    return {"strict": sum(r["strict_correct"] for r in rows) / len(rows), "lenient": lenient / len(rows),
            "echo_share": echo / lenient if lenient else 0.0, "echoes": echo, "lenient_correct": lenient,
            "outcomes": "".join("1" if r["strict_correct"] else "0" for r in rows)}


class Marks:
    """Weights copied when the training clock passes each fraction of the budget, and at given step counts; the
    copy's own time is taken off the clock, and evaluation happens after training, so neither trainer pays."""

    def __init__(self, budget_s: float, fractions: tuple[float, ...], steps: tuple[int, ...] = ()):
        self.budget_s, self.fractions, self.steps = budget_s, fractions, set(steps)
        self.t0, self.paused = time.perf_counter(), 0.0
        self.taken: dict[str, dict] = {}  # "t0.5" / "s12" -> state dict

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0 - self.paused

    def maybe_take(self, model, step: int | None = None, final: bool = False) -> None:
        t = time.perf_counter()
        want = [f"t{f:g}" for f in self.fractions if final or self.elapsed() >= f * self.budget_s]
        want += [f"s{step}"] if step in self.steps else []
        for key in want:
            if key not in self.taken:
                self.taken[key] = {k: v.detach().clone() for k, v in model.state_dict().items()}
        self.paused += time.perf_counter() - t

    def over(self) -> bool:
        return self.elapsed() > self.budget_s

    def scored(self, model, tok, spec, eval_set) -> dict[str, dict]:
        out = {}
        for key, state in sorted(self.taken.items()):
            model.load_state_dict(state)
            out[key] = held_out(model.eval(), tok, spec, eval_set)
        self.taken.clear()
        return out


def run_ours(spec: JobSpec, budget_s: float, fractions, step_marks, work: Path, eval_set) -> dict:
    from transformers import AutoTokenizer

    import trainer.loop as loop

    live, stamps = {}, []
    setup = loop.setup

    def keep(*a, **kw):  # the bench holds the live policy, to snapshot it (bench-only hook)
        run = setup(*a, **kw)
        live["model"] = run.ctx.policy
        return run

    def on_step(step, m):
        if step == 0:  # the clock starts after our step-0 eval: TRL runs none
            marks.t0, marks.paused = time.perf_counter(), 0.0
            return
        stamps.append(time.perf_counter())
        marks.maybe_take(live["model"], step)

    spec.train.eval_every = 0
    loop.setup = keep
    marks = Marks(budget_s, fractions, step_marks)
    try:
        res = train(spec, work, models_dir=work, log=lambda m: None, on_step=on_step,
                    should_stop=lambda: "pause" if marks.over() else None)
    finally:
        loop.setup = setup
    wall = marks.elapsed()
    marks.maybe_take(live["model"], final=True)
    steps = [b - a for a, b in zip(stamps, stamps[1:])]
    evals = marks.scored(live["model"], AutoTokenizer.from_pretrained(spec.model.path), spec, eval_set)
    return {"steps": res.step, "s_per_step": statistics.median(steps[1:] or steps or [0]), "wall_s": wall,
            "evals": evals}


def run_trl(spec: JobSpec, budget_s: float, fractions, work: Path, train_set, eval_set) -> dict:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    scorer = Scorer(spec.verifiers)  # the job's (strict) verifiers, weighted as in ours
    G, P, mdir = spec.rollout.group_size, spec.train.prompts_per_step, spec.model.path
    micro = spec.algo.micro_batch_size or P * G
    if (P * G) % micro:
        raise SystemExit(f"--micro-rows {micro} must divide the batch of {P * G} rows (TRL's gradient accumulation)")

    def reward(completions, reference, **_):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return scorer(texts, [json.loads(r) for r in reference]).rewards

    msgs = lambda p: [{"role": "user", "content": p}] if isinstance(p, str) else p  # noqa: E731
    rows = [{"prompt": msgs(s["prompt"]), "reference": json.dumps(s["reference"])} for s in train_set]
    cfg = GRPOConfig(
        # micro-batches as ours (algo.micro_batch_size, --micro-rows): TRL's gradient accumulation over one
        # generation batch of P x G (steps_per_generation defaults to it: one optimiser step per generation)
        output_dir=str(work / "trl"), num_generations=G, per_device_train_batch_size=micro,
        gradient_accumulation_steps=P * G // micro, max_completion_length=spec.rollout.max_new_tokens,
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
            marks.maybe_take(model, state.global_step)
            if marks.over():
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
    marks = Marks(budget_s, fractions)  # the clock starts here for TRL too: after model load, before step 1
    trainer.train()
    wall = marks.elapsed()
    marks.maybe_take(trainer.model, final=True)
    steps = [b - a for a, b in zip(stamps, stamps[1:])]
    evals = marks.scored(trainer.model, tok, spec, eval_set)
    evals[f"s{len(stamps)}"] = evals[f"t{fractions[-1]:g}"]  # its final weights are those of its last step
    return {"steps": len(stamps), "s_per_step": statistics.median(steps or [0]), "wall_s": wall, "evals": evals}


def run_task(name: str, spec_dict: dict, model: str, minutes: float, threads: int, models: Path, work: Path,
             who: set[str], seeds: list[int], fractions: tuple[float, ...], eval_size: int | None) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    mdir = model_dir(model, models)
    data = {**spec_dict["data"], **({"eval_size": eval_size} if eval_size else {})}
    base = JobSpec.model_validate({**spec_dict, "data": data, "model": {**spec_dict["model"], "path": str(mdir)},
                                   "train": {**spec_dict["train"], "steps": 100_000, "threads": threads}})
    torch.set_num_threads(threads)
    train_set, eval_set = load_splits(base.data)
    start = held_out(AutoModelForCausalLM.from_pretrained(mdir), AutoTokenizer.from_pretrained(mdir), base, eval_set)
    print(f"{name}: held-out start strict {start['strict']:.3f} lenient {start['lenient']:.3f}", file=sys.stderr)
    teacher = None
    if base.distill is not None:  # what the student is pulled toward, judged as the student is
        tdir = base.distill.teacher
        teacher = held_out(AutoModelForCausalLM.from_pretrained(tdir), AutoTokenizer.from_pretrained(tdir), base,
                           eval_set)
        print(f"{name}: teacher held-out strict {teacher['strict']:.3f}", file=sys.stderr)
    runs: dict[str, list] = {t: [] for t in TRAINERS}
    for seed in seeds:
        spec = base.model_copy(deep=True)
        spec.train.seed = seed
        trl = run_trl(spec, minutes * 60, fractions, work / f"{name}-{seed}", train_set, eval_set) \
            if "trl" in who else None
        gc.collect()  # TRL's model and snapshots go before ours loads its own
        if trl:
            runs["trl"].append({"seed": seed, **trl})
        if "ours" in who:
            marks = (trl["steps"],) if trl else ()
            ours = run_ours(spec.model_copy(deep=True), minutes * 60, fractions, marks, work / f"{name}-{seed}-ours",
                            eval_set)
            runs["ours"].append({"seed": seed, **ours})
            gc.collect()
        for t in TRAINERS:
            if runs[t] and runs[t][-1]["seed"] == seed:
                r = runs[t][-1]
                print(f"{name} seed {seed} {t}: {r['steps']} steps ({r['s_per_step']:.2f} s) "
                      + " ".join(f"{k}:{e['strict']:.3f}" for k, e in r["evals"].items()), file=sys.stderr, flush=True)
    return {"start": start, "runs": runs, "budget_s": minutes * 60, "fractions": list(fractions), "spec": spec_dict,
            "eval_size": len(eval_set), **({"teacher": teacher} if teacher is not None else {})}


# ---------------------------------------------------------------------------------------------- summary
def _outcomes(runs: list[dict], key: str) -> list[list[bool]]:
    return [[c == "1" for c in r["evals"][key]["outcomes"]] for r in runs if key in r["evals"]]


def summary(task: dict) -> dict:
    """Per mark: each trainer's mean strict gain with its s.e., and ours − TRL with the s.e. of the difference."""
    start = [[c == "1" for c in task["start"]["outcomes"]]]
    runs, out = task["runs"], {"time": {}, "step": {}}
    for f in task["fractions"]:
        key, row = f"t{f:g}", {}
        for t in TRAINERS:
            xs = _outcomes(runs[t], key)
            if xs:
                row[t] = seeds_diff(xs, start)
        if len(row) == 2:
            row["diff"] = seeds_diff(_outcomes(runs["ours"], key), _outcomes(runs["trl"], key))
        out["time"][f] = row
    pairs = [(o, t) for o in runs["ours"] for t in runs["trl"] if o["seed"] == t["seed"]]
    pairs = [(o, t) for o, t in pairs if f"s{t['steps']}" in o["evals"]]
    if pairs:  # equal steps: ours at TRL's final step count, seed by seed
        xs = [[c == "1" for c in o["evals"][f"s{t['steps']}"]["outcomes"]] for o, t in pairs]
        ys = [[c == "1" for c in t["evals"][f"s{t['steps']}"]["outcomes"]] for o, t in pairs]
        out["step"] = {"steps": [t["steps"] for _, t in pairs], "ours": seeds_diff(xs, start),
                       "trl": seeds_diff(ys, start), "diff": seeds_diff(xs, ys)}
    for t in TRAINERS:
        if runs[t]:
            out[f"{t}_steps_per_min"] = statistics.mean(r["steps"] / (r["wall_s"] / 60) for r in runs[t])
            last = f"t{task['fractions'][-1]:g}"
            shares = [r["evals"][last]["echo_share"] for r in runs[t]]
            out[f"{t}_echo_share"] = statistics.mean(shares)
    return out


def verdict(s: dict) -> str:
    """Where our advantage lies, said plainly: a difference is called one only beyond 2 s.e."""
    last = s["time"][max(s["time"])]
    if "diff" not in last:
        return "one trainer only: no comparison"
    sig = lambda d: "ours ahead" if d["diff"] > 2 * d["se"] else "TRL ahead" if d["diff"] < -2 * d["se"] else \
        "no difference beyond 2 s.e."  # noqa: E731
    ratio = s["ours_steps_per_min"] / s["trl_steps_per_min"]
    text = (f"equal wall-clock: {sig(last['diff'])} ({last['diff']['diff']:+.3f} ± {last['diff']['se']:.3f}), "
            f"with {ratio:.1f}x TRL's steps per minute; ")
    if s["step"]:
        d = s["step"]["diff"]
        text += f"equal steps ({'/'.join(map(str, s['step']['steps']))}): {sig(d)} ({d['diff']:+.3f} ± {d['se']:.3f})"
        if last["diff"]["diff"] <= 2 * last["diff"]["se"]:
            text += " — no advantage at equal wall-clock to attribute"
        else:
            text += " — so our equal-time advantage is " + ("steps per minute" if abs(d["diff"]) <= 2 * d["se"]
                                                           else "partly learning per step")
    return text


def table(name: str, task: dict, s: dict) -> str:
    lines = [f"{name}: start strict {task['start']['strict']:.3f} (lenient {task['start']['lenient']:.3f}, "
             f"echo share {task['start']['echo_share']:.3f}), {task['eval_size']} held-out problems"]
    for f, row in s["time"].items():
        cells = [f"{t} {row[t]['diff']:+.3f} ± {row[t]['se']:.3f}" for t in TRAINERS if t in row]
        if "diff" in row:
            cells.append(f"ours − TRL {row['diff']['diff']:+.3f} ± {row['diff']['se']:.3f}")
        lines.append(f"  @{f:g} of the budget: gain " + "; ".join(cells))
    if s["step"]:
        st = s["step"]
        lines.append(f"  @equal steps {st['steps']}: gain ours {st['ours']['diff']:+.3f} ± {st['ours']['se']:.3f}; "
                     f"trl {st['trl']['diff']:+.3f} ± {st['trl']['se']:.3f}; ours − TRL {st['diff']['diff']:+.3f} ± "
                     f"{st['diff']['se']:.3f}")
    lines.append("  " + ", ".join(f"{t}: {s[f'{t}_steps_per_min']:.2f} steps/min, echo share {s[f'{t}_echo_share']:.3f}"
                                  for t in TRAINERS if f"{t}_steps_per_min" in s))
    lines.append("  " + verdict(s))
    return "\n".join(lines)


def plot(results: dict, path: Path) -> None:
    """Strict held-out accuracy against minutes of training, one panel per task: each trainer's mean over seeds
    at the start and at every mark, with the s.e. of its gain as bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = [t for t in results if not t.startswith("_") and "summary" in results[t]]
    fig, axes = plt.subplots(1, len(tasks), figsize=(6 * len(tasks), 4.2), squeeze=False)
    for ax, t in zip(axes[0], tasks):
        r, s = results[t], results[t]["summary"]
        start = r["start"]["strict"]
        for trainer, style, label in (("ours", "o-", "rlvr GRPO"), ("trl", "^--", "TRL GRPOTrainer")):
            if trainer not in s["time"][r["fractions"][-1]]:
                continue
            xs = [0.0] + [f * r["budget_s"] / 60 for f in r["fractions"]]
            ys = [start] + [start + s["time"][f][trainer]["diff"] for f in r["fractions"]]
            es = [0.0] + [s["time"][f][trainer]["se"] for f in r["fractions"]]
            ax.errorbar(xs, ys, yerr=es, fmt=style, capsize=3,
                        label=f"{label} ({s[f'{trainer}_steps_per_min']:.1f} steps/min)")
        seeds = len(r["runs"]["ours"] or r["runs"]["trl"])
        ax.set_title(f"{t}: {r['eval_size']} held-out problems, {seeds} seeds, strict judge")
        ax.set_xlabel("minutes of training")
        ax.set_ylabel("held-out accuracy (greedy, strict)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# ---------------------------------------------------------------------------------------------- provenance
def provenance(threads: int) -> dict:
    """What a reader needs to reproduce the figures: commit, packages, CPU, kernel path, threads."""
    def git(*a):
        r = subprocess.run(["git", *a], cwd=REPO, capture_output=True, text=True)
        return r.stdout.strip() if r.returncode == 0 else None

    def version(p):
        try:
            return metadata.version(p)
        except metadata.PackageNotFoundError:
            return None

    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else \
        platform.processor()
    return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
            "packages": {p: version(p) for p in ("torch", "transformers", "trl", "accelerate", "datasets",
                                                  "reasoning-gym", "sympy", "math-verify")},
            "python": platform.python_version(), "cpu": cpu, "cores": os.cpu_count(),
            "kernel_path": torch.backends.cpu.get_cpu_capability(),
            "ATEN_CPU_CAPABILITY": os.environ.get("ATEN_CPU_CAPABILITY"), "threads": threads,
            "os_kernel": platform.release(), "load_avg": os.getloadavg()}


def merged(paths: list[str]) -> dict:
    """Each task's runs from several files, seeds appended (the start eval is deterministic: greedy, same model
    and held-out set, so the files must agree on it)."""
    out: dict = {}
    for p in paths:
        for task, r in json.loads(Path(p).read_text()).items():
            if task.startswith("_") or not isinstance(r, dict):
                continue
            have = out.setdefault(task, r)
            if have is r:
                continue
            if have["start"]["outcomes"] != r["start"]["outcomes"]:
                raise SystemExit(f"{p}: {task} starts from other held-out outcomes: not the same setup")
            for t in TRAINERS:
                have["runs"][t] += r["runs"][t]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--tasks", default="math,code")
    ap.add_argument("--minutes", type=float, default=30.0,
                    help="wall-clock training budget per trainer per task per seed")
    ap.add_argument("--seeds", type=int, default=3, help="seeds per trainer (--first-seed .. + N-1)")
    ap.add_argument("--first-seed", type=int, default=0,
                    help="the first seed: one process per seed, then --merge (a killed run loses one seed)")
    ap.add_argument("--marks", default="0.125,0.25,0.5,1", help="fractions of the budget where weights are scored")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--trainers", default="ours,trl", help="ours, trl or both")
    ap.add_argument("--eval-size", type=int, default=0, help="held-out problems (default: the recipe's)")
    ap.add_argument("--quick", action="store_true",
                    help="the tiny arithmetic model, 3 seeds of 25 s per trainer (< 5 min)")
    ap.add_argument("--smoke", action="store_true", help="seconds: 2 seeds of 2 s, 16 problems; measures nothing")
    ap.add_argument("--merge", nargs="*", default=[], metavar="JSON", help="no training: merge earlier runs' JSON")
    ap.add_argument("--out", default=str(REPO / "bench" / "results"), help="where the JSON goes")
    ap.add_argument("--models", default=os.environ.get("RLVR_MODELS", str(REPO / ".cache" / "models")))
    ap.add_argument("--micro-rows", type=int, default=None,
                    help="rows per forward/backward for both trainers (ours: algo.micro_batch_size; TRL: gradient "
                    "accumulation over the same generation batch): the same update in less memory. TRL's code "
                    "update at 32 rows held over 23 GB and was killed on a 24 GB host")
    ap.add_argument("--lenient-reward", action="store_true",
                    help="train on the old recipes' reward (math's allow_unevaluated: true, which pays an echoed "
                    "question) to measure what share of the held-out answers it calls right are echoes; the "
                    "figures stay judged strictly")
    ap.add_argument("--algo", type=json.loads, default=None, metavar="JSON",
                    help="algo fields over the recipe's, ours only (TRL has no such knobs): e.g. "
                    "'{\"policy_loss\": \"cispo\", \"ppo_epochs\": 2, \"minibatch_size\": 16}' for bench/losses.py's "
                    "arms on SmolLM2")
    ap.add_argument("--distill", default=None, metavar="TEACHER",
                    help="ours only: on-policy distillation from TEACHER (reverse KL per token; the verifier's "
                    "advantage weighted by --distill-verifier-weight). A model a job can name: an HF folder, or a "
                    "finished job's ft:<base>:<job id>, resolved as the worker does from $RLVR_HOME's store")
    ap.add_argument("--distill-verifier-weight", type=float, default=0.0)
    ap.add_argument("--tenant", default="default", help="whose ft: ids --distill may name (auth off: default)")
    a = ap.parse_args()
    if a.algo is not None and (not isinstance(a.algo, dict) or a.trainers != "ours"):
        ap.error("--algo: a JSON object, with --trainers ours")
    if a.distill is not None and a.trainers != "ours":
        ap.error("--distill: with --trainers ours (TRL's GRPOTrainer has no on-policy distillation)")
    teacher = teacher_path(a.distill, a.tenant, Path(a.models)) if a.distill else None
    specs, stem = {t: recipe(REAL[t]) for t in a.tasks.split(",")}, "learning"
    if a.quick or a.smoke:
        a.model, a.threads, specs, stem = "builtin:tiny-arith", 1, {"math": recipe("demo-math")}, "learning-quick"
        a.minutes, a.seeds, a.marks = (25 / 60, 3, "0.5,1") if a.quick else (2 / 60, 2, "1")
        a.eval_size = a.eval_size or (16 if a.smoke else 0)
        if a.smoke:
            stem = "learning-smoke"
    # the overrides go on whichever recipes run, --quick's and --smoke's included
    for s in specs.values():
        if a.micro_rows:
            s["algo"] = {**s.get("algo", {}), "micro_batch_size": a.micro_rows}
        if a.algo:
            s["algo"] = {**s.get("algo", {}), **a.algo}
        if teacher is not None:
            s["distill"] = {"teacher": str(teacher), "coef": 1.0, "verifier_weight": a.distill_verifier_weight}
        if a.lenient_reward:  # the reward only: held_out() judges strictly (and leniently, for the echo share)
            s["verifiers"] = [{**v, "config": {**v.get("config", {}), "allow_unevaluated": True}}
                              if v["name"] == "math" else v for v in s["verifiers"]]
    who = set(a.trainers.split(","))
    if not who or who - set(TRAINERS):
        ap.error(f"--trainers: ours, trl or both (got {a.trainers!r})")
    fractions = tuple(sorted(float(x) for x in a.marks.split(",")))
    out = Path(a.out if not a.smoke else tempfile.mkdtemp(prefix="learning-smoke-"))
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    results = merged(a.merge) if a.merge else {}
    if a.merge:  # the runs' own provenance, not the merging process's
        results["_meta"] = {"merged": [json.loads(Path(p).read_text()).get("_meta") for p in a.merge]}
    else:
        results["_meta"] = {**provenance(a.threads), "argv": sys.argv[1:], "model": a.model,
                            **({"teacher": a.distill} if a.distill else {})}
    with tempfile.TemporaryDirectory(prefix="learning-") as tmp:
        for t, s in ({} if a.merge else specs).items():
            results[t] = run_task(t, s, a.model, a.minutes, a.threads, Path(a.models), Path(tmp), who,
                                  list(range(a.first_seed, a.first_seed + a.seeds)), fractions, a.eval_size or None)
            # each task's figures are kept as soon as they exist: a run killed later loses only its task
            (out / f"{stem}.json").write_text(json.dumps(results, indent=1, default=str))
    sums = {t: summary(r) for t, r in results.items() if not t.startswith("_")}
    for t, s in sums.items():
        results[t]["summary"] = s
        print(table(t, results[t], s))
    (out / f"{stem}.json").write_text(json.dumps(results, indent=1, default=str))
    if sums:
        plot(results, out / f"{stem}.png")
    print(f"(total {time.time() - t0:.0f} s; {out / (stem + '.json')})", flush=True)

    def at_budget(task: str, key: str) -> str:
        s = sums.get(task)
        row = s and s["time"][max(s["time"])]
        return f"{row[key]['diff']:+.3f}" if row and key in row else "na"

    def diff_se(task: str) -> str:
        s = sums.get(task)
        row = s and s["time"][max(s["time"])]
        return f"{row['diff']['se']:.3f}" if row and "diff" in row else "na"

    seeds = max((len(r["runs"][t]) for k, r in results.items() if not k.startswith("_") for t in TRAINERS), default=0)
    print(f"math_gain={at_budget('math', 'ours')} code_gain={at_budget('code', 'ours')} "
          f"trl_math_gain={at_budget('math', 'trl')} trl_code_gain={at_budget('code', 'trl')} "
          f"math_diff_se={diff_se('math')} code_diff_se={diff_se('code')} seeds={seeds} strict=1")
    return 0


if __name__ == "__main__":
    sys.exit(main())
