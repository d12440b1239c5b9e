"""GRPO step time and held-out accuracy: ours vs TRL's GRPOTrainer, same model/data/config, one run.

Both trainers get the same model, the same arithmetic train prompts, G completions per prompt,
prompts per step, max new tokens, learning rate, β (KL coefficient), temperature 1, no top-k,
token-level loss normalisation (ours `token-mean` = TRL `dapo`), group-std advantage scaling, one
optimisation pass per batch, fp32, no gradient checkpointing, the same torch thread count, the same
math verifier (evaluated answers only). Each trains for the same wall-clock budget (or a fixed number
of steps); each one's weights are copied when its clock passes 1/8, 1/4, 1/2 and all of the budget, and
after training every copy is scored by the same greedy held-out evaluation (math verifier, prompts
never trained on, the answer stated as a number: see `held_out`) — accuracy at equal wall-clock, at
four budgets, for the cost of one run each. Clocks start at the first training step. The two trainers run in
processes of their own on the same cores and take turns, 5 s of training each (`--slice-s`; 0: ours to its end,
then TRL's), so a slow spell of a shared host meets both rather than whichever ran through it (`Turns`).

    .venv/bin/python bench/grpo_vs_trl.py --quick          # tiny model, ~3 min
    .venv/bin/python bench/grpo_vs_trl.py --model smollm2-135m --steps 3 --group-size 4 \
        --prompts 2 --max-new-tokens 32 --eval-size 20     # real 135M model (rlvr models pull first)
    .venv/bin/python bench/grpo_vs_trl.py --smoke          # CI: both trainers, 2 s each, 2 prompts x 4, 8 held out
                                                           # (checks the script runs end to end; not a measurement)

Needs `pip install trl`. Last line: ratio=<ours s/step ÷ TRL s/step> and the other figures.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from trainer.config import JobSpec  # noqa: E402
from trainer.engines import ENGINES  # noqa: E402
from trainer.loop import train  # noqa: E402
from trainer.models.resolve import resolve_model  # noqa: E402
from trainer.rollout import SamplingParams  # noqa: E402
from trainer.scoring import Scorer  # noqa: E402
from trainer.splits import load_splits  # noqa: E402


def model_dir(name: str, models: Path) -> Path:
    if name == "smollm2-135m":
        from trainer.models.pull import pull

        return pull(name, models)
    return resolve_model(name, models, log=lambda m: None)


def held_out(model, tok, spec: JobSpec, eval_set) -> float:
    """Greedy pass@1 that the verifier calls correct AND whose text states the answer as a number.
    Why the second check: the math verifier accepts an unevaluated expression equal to the reference,
    so a policy that echoes the prompt ("10+15") scores 100% — SmolLM2 learns that in 4 GRPO steps."""
    engine = ENGINES["hf"](model, tok)
    ro = engine.generate([s["prompt"] for s in eval_set], 1, SamplingParams(spec.rollout.max_new_tokens, greedy=True))
    verdicts = Scorer(spec.verifiers)(ro.texts, [s["reference"] for s in eval_set]).correct
    stated = [re.search(rf"(?<![\d.]){re.escape(str(s['reference']))}(?!\d|\.\d)", t) is not None
              for s, t in zip(eval_set, ro.texts)]
    return sum(c and n for c, n in zip(verdicts, stated)) / len(eval_set)


FRACTIONS = (0.125, 0.25, 0.5, 1.0)  # of the budget: where both trainers' weights are snapshot for eval


class Snapshots:
    """Weights copied when the training clock passes each fraction of the budget; the copy's own time
    is taken off the clock, and evaluation happens after training, so neither trainer pays for it."""

    def __init__(self, budget_s: float):
        self.budget_s, self.t0, self.paused = budget_s, time.perf_counter(), 0.0
        self.taken: dict[float, dict] = {}

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0 - self.paused

    def maybe_take(self, model, final: bool = False) -> None:
        t = time.perf_counter()
        for f in FRACTIONS:
            if f not in self.taken and (final or (self.budget_s and self.elapsed() >= f * self.budget_s)):
                self.taken[f] = {k: v.detach().clone() for k, v in model.state_dict().items()}
        self.paused += time.perf_counter() - t

    def over(self) -> bool:
        return bool(self.budget_s) and self.elapsed() > self.budget_s

    def accuracies(self, model, tok, spec, eval_set) -> dict[float, float]:
        out = {}
        for f, state in sorted(self.taken.items()):
            model.load_state_dict(state)
            out[f] = held_out(model, tok, spec, eval_set)
        return out


class Turns:
    """The two trainers, each in a process of its own on the same cores, take turns: each runs ``slice_s`` of its
    own clock, then hands over and waits. Run one after the other, a slow spell of a shared host (the same code's
    step moved ~18% between two runs) met one trainer only and moved the ratio; taking turns, each spell meets both.
    A side's clock (and its step times) leaves out its waits. ``slice_s`` 0: no turns, ours to its end, then TRL's.
    Every wait has a timeout: a side that died leaves the other an error, not a hang."""

    SIDES = ("ours", "trl")

    def __init__(self, mp, slice_s: float, timeout_s: float):
        self.slice_s, self.timeout_s = slice_s, timeout_s
        self.cond, self.ready = mp.Condition(), mp.Barrier(2)
        self.turn, self.done = mp.Value("i", 0, lock=False), mp.Array("b", 2, lock=False)  # guarded by cond
        self.me, self.since, self.handoffs = 0, 0.0, 0

    def start(self, side: str) -> None:
        """Both sides set up, then ``side`` waits for its first turn (ours goes first)."""
        self.me = self.SIDES.index(side)
        self.ready.wait(self.timeout_s)
        self._wait()

    def _wait(self) -> None:
        with self.cond:
            if not self.cond.wait_for(lambda: self.turn.value == self.me or self.done[1 - self.me], self.timeout_s):
                raise TimeoutError(f"{self.SIDES[self.me]}: no turn in {self.timeout_s:g} s (the other side stuck?)")
        self.since = time.perf_counter()

    def between_steps(self) -> float:
        """Called between two steps: hands over when this side's slice is used up; the seconds it waited."""
        if not self.slice_s or time.perf_counter() - self.since < self.slice_s:
            return 0.0
        with self.cond:
            if self.done[1 - self.me]:
                return 0.0
            self.turn.value = 1 - self.me
            self.cond.notify_all()
        self.handoffs += 1
        t = time.perf_counter()
        self._wait()
        return self.since - t

    def finish(self) -> None:
        """This side has trained its budget: the other runs on alone. Returns once both have (evaluation, which is
        not timed, then runs in both processes at once)."""
        with self.cond:
            self.done[self.me] = 1
            self.turn.value = 1 - self.me
            self.cond.notify_all()
            if not self.cond.wait_for(lambda: self.done[1 - self.me], self.timeout_s):
                raise TimeoutError(f"{self.SIDES[self.me]}: the other side did not finish in {self.timeout_s:g} s")


class Steps:
    """One side's step times: from the end of the previous step (or of a wait for its turn) to the end of this
    one; the snapshot copies and turn waits between steps are on neither the steps nor the budget's clock."""

    def __init__(self, snaps: Snapshots, turns: Turns):
        self.snaps, self.turns, self.times, self.last = snaps, turns, [], time.perf_counter()

    def begin(self) -> None:
        self.snaps.t0, self.snaps.paused, self.last = time.perf_counter(), 0.0, time.perf_counter()

    def end_of_step(self, model) -> None:
        self.times.append(time.perf_counter() - self.last)
        self.snaps.maybe_take(model)
        self.snaps.paused += self.turns.between_steps()
        self.last = time.perf_counter()

    def median(self) -> float:
        return statistics.median(self.times[1:] or self.times)  # the first step warms up


def run_ours(spec: JobSpec, mdir: Path, budget_s: float, work: Path, eval_set, turns: Turns) -> dict:
    import trainer.loop as loop

    live: dict = {}
    setup = loop.setup

    def keep_policy(*a, **kw):  # the bench holds the live policy, to snapshot it (bench-only hook)
        run = setup(*a, **kw)
        live["model"] = run.ctx.policy
        return run

    def on_step(step, m):
        if step == 0:  # after our step-0 held-out eval (TRL's runs none): both set up, then our first turn
            turns.start("ours")
            clock.begin()
        else:
            clock.end_of_step(live["model"])

    spec.model.path = str(mdir)
    loop.setup = keep_policy
    snaps = Snapshots(budget_s)
    clock = Steps(snaps, turns)
    try:
        res = train(spec, work / "ours", models_dir=work, log=lambda m: None, on_step=on_step,
                    should_stop=lambda: "pause" if snaps.over() else None)
    finally:
        loop.setup = setup
    wall = snaps.elapsed()
    if len(clock.times) > 2:  # the job's last step also checkpoints (and at the step cap evaluates): not a step time
        clock.times.pop()
    snaps.maybe_take(live["model"], final=True)
    turns.finish()
    from transformers import AutoTokenizer

    acc = snaps.accuracies(live["model"].eval(), AutoTokenizer.from_pretrained(mdir), spec, eval_set)
    return {"steps": res.step, "s_per_step": clock.median(), "wall_s": wall, "accuracy": acc[1.0],
            "accuracy_at": acc, "handoffs": turns.handoffs}


def run_trl(spec: JobSpec, mdir: Path, budget_s: float, work: Path, train_set, eval_set, turns: Turns) -> dict:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from verifiers import get_verifier

    verifier = get_verifier(spec.verifiers[0].name, spec.verifiers[0].config)
    G, P = spec.rollout.group_size, spec.train.prompts_per_step

    def reward(completions, reference, **_):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [v.score for v in verifier.verify_batch(texts, list(reference))]

    rows = [{"prompt": [{"role": "user", "content": s["prompt"]}], "reference": s["reference"]} for s in train_set]
    cfg = GRPOConfig(
        output_dir=str(work / "trl"), num_generations=G, per_device_train_batch_size=P * G,
        gradient_accumulation_steps=1, max_completion_length=spec.rollout.max_new_tokens,
        learning_rate=spec.optim.lr, beta=spec.algo.kl_coef, temperature=spec.rollout.temperature, top_k=0,
        loss_type="dapo", scale_rewards="group", num_iterations=1, epsilon=spec.algo.clip_eps_low,
        max_steps=spec.train.steps, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        max_grad_norm=spec.optim.max_grad_norm, gradient_checkpointing=False, bf16=False, use_cpu=True,
        logging_steps=1, save_strategy="no", report_to="none", seed=spec.train.seed,
        disable_tqdm=True, dataloader_num_workers=0,
    )

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            if not started:  # the first step: both sides set up, then TRL waits for its turn
                started.append(True)
                turns.start("trl")
                clock.begin()

        def on_step_end(self, args, state, control, model=None, **kw):
            clock.end_of_step(model)
            if snaps.over():
                control.should_training_stop = True

    # TRL at its own defaults, in a process of its own: none of our settings (deterministic algorithms) reach it
    tok = AutoTokenizer.from_pretrained(mdir)
    model = AutoModelForCausalLM.from_pretrained(mdir, dtype=torch.float32)
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=cfg, train_dataset=Dataset.from_list(rows),
                          processing_class=tok, callbacks=[Clock()])
    snaps, started = Snapshots(budget_s), []
    clock = Steps(snaps, turns)
    trainer.train()
    wall = snaps.elapsed()
    snaps.maybe_take(trainer.model, final=True)
    turns.finish()
    acc = snaps.accuracies(trainer.model.eval(), tok, spec, eval_set)
    return {"steps": len(clock.times), "s_per_step": clock.median(), "wall_s": wall, "accuracy": acc[1.0],
            "accuracy_at": acc, "handoffs": turns.handoffs}


def _side(side: str, threads: int, args: tuple, turns: Turns, out) -> None:
    """A child process: one trainer's run; its result (or its error) onto ``out``."""
    try:
        torch.set_num_threads(threads)
        out.put((side, run_ours(*args, turns) if side == "ours" else run_trl(*args, turns)))
    except BaseException:  # noqa: BLE001 - the parent reports it
        import traceback

        turns.ready.abort()  # the other side stops waiting for this one: at the start barrier, or for its turn
        with turns.cond:
            turns.done[Turns.SIDES.index(side)] = 1
            turns.cond.notify_all()
        out.put((side, {"error": traceback.format_exc()}))


def run_both(spec: JobSpec, mdir: Path, budget_s: float, work: Path, train_set, eval_set, threads: int,
             slice_s: float) -> tuple[dict, dict]:
    """Both trainers, each in a process of its own, taking turns (``Turns``); their results."""
    import multiprocessing
    import queue

    mp = multiprocessing.get_context("spawn")
    timeout_s = 4 * budget_s + 900  # start-up, the other side's whole budget and the held-out evals
    turns, out = Turns(mp, slice_s, timeout_s), mp.Queue()
    args = {"ours": (spec.model_copy(deep=True), mdir, budget_s, work, eval_set),
            "trl": (spec, mdir, budget_s, work, train_set, eval_set)}
    # not daemons: a trainer may start processes of its own (the verifiers' pool)
    procs = [mp.Process(target=_side, args=(s, threads, args[s], turns, out)) for s in Turns.SIDES]
    for p in procs:
        p.start()
    res: dict[str, dict] = {}
    try:
        while len(res) < 2:
            try:
                side, r = out.get(timeout=timeout_s)
            except queue.Empty:
                raise TimeoutError(f"no result from {set(Turns.SIDES) - set(res)} in {timeout_s:g} s") from None
            if "error" in r:
                raise RuntimeError(f"the {side} side failed:\n{r['error']}")
            res[side] = r
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return res["ours"], res["trl"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="builtin:tiny-arith", help="builtin:tiny-arith | smollm2-135m | HF dir")
    ap.add_argument("--quick", action="store_true", help="75 s per trainer, 400 eval problems (~3 min in all)")
    ap.add_argument("--smoke", action="store_true", help="2 s per trainer, 2 prompts x 4, 8 eval problems: checks "
                    "the script runs (seconds; not a measurement)")
    ap.add_argument("--budget-s", type=float, default=240.0, help="wall-clock training budget per trainer")
    ap.add_argument("--steps", type=int, default=10_000, help="step cap (the budget usually ends first)")
    ap.add_argument("--group-size", type=int, default=16)
    ap.add_argument("--prompts", type=int, default=16, help="prompts per step")
    ap.add_argument("--max-new-tokens", type=int, default=12)
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--beta", type=float, default=0.0)
    ap.add_argument("--eval-size", type=int, default=400)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--slice-s", type=float, default=5.0,
                    help="seconds each trainer runs before handing the cores to the other (0: ours, then TRL's)")
    ap.add_argument("--models", default=os.environ.get("RLVR_MODELS", str(REPO / ".cache" / "models")))
    a = ap.parse_args()
    if a.quick:
        a.budget_s, a.eval_size = 75.0, 400
    if a.smoke:
        a.budget_s, a.eval_size, a.group_size, a.prompts = 2.0, 8, 4, 2
    torch.set_num_threads(a.threads)
    models = Path(a.models)
    mdir = model_dir(a.model, models)
    spec = JobSpec.model_validate({
        # answers must be evaluated numbers: an echoed question ("10+15") is not rewarded (see held_out)
        "verifiers": [{"name": "math", "config": {"allow_unevaluated": False}}],
        "data": {"eval_size": a.eval_size},
        "rollout": {"group_size": a.group_size, "max_new_tokens": a.max_new_tokens, "temperature": 1.0},
        "algo": {"advantage": "grpo", "loss_agg": "token-mean", "kl_coef": a.beta},
        "optim": {"lr": a.lr, "max_grad_norm": 1.0},
        "train": {"steps": a.steps, "prompts_per_step": a.prompts, "eval_every": 0, "threads": a.threads},
    })
    train_set, eval_set = load_splits(spec.data)
    with tempfile.TemporaryDirectory(prefix="grpo-vs-trl-") as tmp:
        work = Path(tmp)
        from transformers import AutoModelForCausalLM, AutoTokenizer

        base = held_out(AutoModelForCausalLM.from_pretrained(mdir), AutoTokenizer.from_pretrained(mdir), spec, eval_set)
        ours, trl = run_both(spec, mdir, a.budget_s, work, train_set, eval_set, a.threads, a.slice_s)
    print(json.dumps({"config": {k: v for k, v in vars(a).items()}, "accuracy_start": base,
                      "ours": ours, "trl": trl}, indent=1))
    ratio = ours["s_per_step"] / trl["s_per_step"]
    print(f"ratio={ratio:.3f} ours_s_per_step={ours['s_per_step']:.3f} trl_s_per_step={trl['s_per_step']:.3f} "
          f"ours_steps={ours['steps']} trl_steps={trl['steps']} budget_s={a.budget_s:g} "
          f"acc_start={base:.3f} ours_acc={ours['accuracy']:.3f} trl_acc={trl['accuracy']:.3f} "
          + "".join(f"ours_acc@{f:g}={ours['accuracy_at'][f]:.3f} trl_acc@{f:g}={trl['accuracy_at'][f]:.3f} "
                    for f in FRACTIONS[:-1] if a.budget_s) +
          f"model={a.model} G={a.group_size} prompts={a.prompts} max_new_tokens={a.max_new_tokens} "
          f"lr={a.lr:g} beta={a.beta:g} threads={a.threads} slice_s={a.slice_s:g} "
          f"handoffs={ours['handoffs'] + trl['handoffs']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
