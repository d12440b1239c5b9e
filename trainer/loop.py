"""Training with verifiable rewards, top to bottom: setup, then one step function per data regime.

- Online RL (``algorithm: grpo | ppo``, trainer.online): sample a group of G completions per prompt,
  score them with the job's verifiers, estimate advantages — GRPO uses the group as its own baseline,
  (r - mean_group) / std (or batch std / no std / leave-one-out); PPO learns a value head and runs
  GAE — then update with PPO's clipped surrogate against the sampling policy (with one pass per
  batch the ratio is 1 and GRPO is REINFORCE with a group-mean baseline), optional KL to a frozen
  reference, entropy bonus.
- Preference pairs (``algorithm: dpo``, trainer.preference): online pairs (best vs worst of a scored
  group) or fixed pairs from a file, DPO/IPO loss against the frozen starting model.
Loss pieces are pure functions in ``trainer.algos``, picked by name from the spec. With
``train.world_size > 1`` (or under torchrun) each rank takes its slice of every batch and gradients
are summed across ranks (trainer.distributed).
"""
from __future__ import annotations

import contextlib
import json
import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from . import checkpoint, distributed, online, preference
from .batch import chunks
from .config import JobSpec
from .critic import make_estimator
from .data import PromptStream, load_splits
from .rollout import ENGINES, SamplingParams
from .scoring import Scorer

StepCallback = Callable[[int, dict[str, Any]], None]
StopCheck = Callable[[], str | None]  # returns "pause" / "cancel" to stop early, else None
REGIMES = {"grpo": online.step, "ppo": online.step, "dpo": preference.step}


@dataclass
class RunResult:
    status: str  # succeeded | paused | cancelled
    step: int
    accuracy_before: float | None
    accuracy_after: float | None
    run_dir: str
    checkpoint: str | None


class ModelPathError(ValueError):
    pass


def resolve_model_path(path: str, models_dir: Path, log=print) -> Path:
    if path == "builtin:tiny-arith":
        from .tiny_model import ensure_tiny_model

        return ensure_tiny_model(models_dir, log=log)
    if path.startswith("builtin:"):
        raise ModelPathError(f"unknown built-in model {path!r}; known: builtin:tiny-arith")
    p = Path(path).expanduser()
    if not (p / "config.json").is_file():
        raise ModelPathError(f"model.path {path!r} is not an HF checkpoint directory (no config.json)")
    return p


@dataclass
class Ctx:
    """Everything a step function needs; built once by :func:`train`."""
    spec: JobSpec
    dist: distributed.Dist
    policy: Any
    ref: Any
    tok: Any
    engine: Any
    scorer: Scorer
    stream: PromptStream
    estimator: Any
    opt: torch.optim.Optimizer
    sched: Any
    params: list[torch.nn.Parameter] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)  # a few scored groups of the last step
    health: dict[str, float] = field(default_factory=dict)  # verifier health of the last scoring call

    def autocast(self):
        if self.spec.train.precision == "bf16":
            return torch.autocast(self.dist.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def optimize(self, mb: torch.Tensor, count_fn, micro_fn, inert: torch.Tensor | None = None
                 ) -> list[dict[str, float]]:
        """One optimiser step on a minibatch of local rows: gradient accumulation over micro-batches
        (losses are normalised by the minibatch's GLOBAL counts, so the sum is the full-batch loss),
        gradients summed across ranks, clipped, applied. Rows flagged ``inert`` (their every loss term
        is identically zero) still count in the normalisers but are never run forward/backward."""
        counts = count_fn(mb)
        self.opt.zero_grad(set_to_none=True)
        stats, total = [], 0.0
        live = mb[~inert[mb]] if inert is not None else mb
        for idx in chunks(live, self.spec.algo.micro_batch_size):
            if len(idx) == 0:
                continue
            with self.autocast():
                loss, st = micro_fn(idx, counts)
            loss.backward()
            total += loss.item()
            stats.append(st)
        for p in self.params:  # a zero gradient, not a missing one: Adam's moments still decay
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        self.dist.sum_grads(self.params)
        gn = torch.nn.utils.clip_grad_norm_(self.params, self.spec.optim.max_grad_norm)
        self.opt.step()
        total = float(self.dist.all_sum(torch.tensor([total]))[0])
        return stats + [{"loss": total, "grad_norm": float(gn)}]


def evaluate(engine, scorer: Scorer, samples, max_new_tokens: int, dist: distributed.Dist | None = None,
             batch: int = 256) -> dict[str, float]:
    """Greedy pass@1 on held-out samples: accuracy (primary verifier `correct`) and mean reward."""
    dist = dist or distributed.Dist()
    correct, reward = [], []
    mine = samples[dist.rank :: dist.world]
    for i in range(0, len(mine), batch):
        chunk = mine[i : i + batch]
        ro = engine.generate([s["prompt"] for s in chunk], 1, SamplingParams(max_new_tokens, greedy=True))
        sc = scorer(ro.texts, [s["reference"] for s in chunk])
        correct += sc.correct
        reward += sc.rewards
    every = dist.gather((sum(correct), sum(reward)))
    n = len(samples)
    return {"eval/accuracy": sum(c for c, _ in every) / n, "eval/reward": sum(r for _, r in every) / n}


def _load_policy(spec: JobSpec, model_dir: Path, resume_from: Path | None, dtype):
    from transformers import AutoModelForCausalLM

    lora = spec.model.lora
    if lora is None:
        return AutoModelForCausalLM.from_pretrained(resume_from or model_dir, dtype=dtype)
    import peft  # optional dependency: only LoRA jobs need it

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    if resume_from is not None:  # LoRA checkpoints hold the adapter only
        return peft.PeftModel.from_pretrained(base, resume_from, is_trainable=True)
    cfg = peft.LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                          target_modules=lora.target_modules, task_type="CAUSAL_LM")
    return peft.get_peft_model(base, cfg)


def train(
    spec: JobSpec,
    run_dir: str | Path,
    *,
    models_dir: str | Path,
    on_step: StepCallback | None = None,
    should_stop: StopCheck | None = None,
    on_rollouts: Callable[[int, list[dict[str, Any]]], None] | None = None,
    score_remote: Callable | None = None,
    log: Callable[[str], None] = print,
) -> RunResult:
    """``on_rollouts(step, groups)`` receives a few whole scored groups per step, for people to
    read what the model wrote and how each verifier judged it. ``score_remote`` scores somewhere
    else (see trainer.scoring.Scorer), e.g. on CPU workers so a GPU worker never runs a verifier."""
    run_dir, models_dir = Path(run_dir), Path(models_dir)
    with distributed.group(spec.train.world_size, spec.model_dump_json(), run_dir, models_dir) as dist:
        return _train(spec, run_dir, models_dir, dist, on_step, should_stop, on_rollouts, score_remote, log)


def _train(spec: JobSpec, run_dir: Path, models_dir: Path, dist: distributed.Dist, on_step: StepCallback | None,
           should_stop: StopCheck | None, on_rollouts, score_remote, log) -> RunResult:
    # ------------------------------------------------------------------ setup
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # progress bars flood worker logs

    ckpt_root = run_dir / "checkpoints"
    run_dir.mkdir(parents=True, exist_ok=True)
    tc, ro_cfg, ac = spec.train, spec.rollout, spec.algo
    dist.shard(tc.prompts_per_step)  # fails early (typed) when the batch does not split over the ranks
    if tc.threads:
        torch.set_num_threads(tc.threads)
    random.seed(tc.seed)
    torch.manual_seed(tc.seed + dist.rank)  # ranks sample different completions

    model_dir = resolve_model_path(spec.model.path, models_dir, log=log)
    resume_from = checkpoint.latest(ckpt_root)
    dtype = getattr(torch, spec.model.dtype)
    tok = AutoTokenizer.from_pretrained(resume_from or model_dir)
    policy = _load_policy(spec, model_dir, resume_from, dtype).to(dist.device)
    ref = None
    if ac.kl_coef > 0 or spec.dpo is not None or (spec.ppo is not None and spec.ppo.kl_reward_coef > 0):
        # the reference is the job's starting model, never a later checkpoint
        ref = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(dist.device).eval()
        ref.requires_grad_(False)
    engine = ENGINES[ro_cfg.engine](policy, tok)
    scorer = Scorer(spec.verifiers, remote=score_remote)
    train_set, eval_set = load_splits(spec.data.dataset, spec.data.eval_dataset, spec.data.eval_size)
    if spec.dpo is not None and spec.dpo.pairs != "online":
        train_set = preference.load_pairs(spec.dpo.pairs)
    stream = PromptStream(train_set, seed=tc.seed)
    hidden = policy.config.get_text_config().hidden_size

    def load_critic(path: str):  # a separate PPO critic: same vocabulary as the policy, trainable
        net = AutoModelForCausalLM.from_pretrained(resolve_model_path(path, models_dir, log=log), dtype=dtype)
        vocab, want = net.config.get_text_config().vocab_size, policy.config.get_text_config().vocab_size
        if vocab != want:
            raise ModelPathError(f"ppo.critic {path!r} has a vocabulary of {vocab} tokens, the policy {want}: "
                                 "the critic reads the policy's token ids, so they must share a tokenizer")
        return net.to(dist.device).train()

    estimator = make_estimator(spec, hidden, load_critic)
    estimator.to(dist.device, torch.float64 if dtype == torch.float64 else torch.float32)  # heads: >= fp32
    est_params = estimator.parameters()
    groups = [{"params": [p for p in policy.parameters() if p.requires_grad]}]
    if est_params:
        value_lr = spec.ppo.value_lr if spec.ppo and spec.ppo.value_lr else spec.optim.lr * 10
        groups.append({"params": est_params, "lr": value_lr})
    opt = torch.optim.AdamW(groups, lr=spec.optim.lr, weight_decay=spec.optim.weight_decay)
    warm = spec.optim.warmup_steps
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warm) if warm else 1.0)
    ctx = Ctx(spec, dist, policy, ref, tok, engine, scorer, stream, estimator, opt, sched,
              [p for g in groups for p in g["params"]])

    start, acc_before = 0, None
    if resume_from is not None:
        state = checkpoint.load_state(resume_from, rank=dist.rank)  # restores this rank's RNG streams
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        estimator.load_state_dict(state.get("estimator", {}))
        stream.position, start, acc_before = state["data_position"], state["step"], state.get("accuracy_before")
        log(f"resumed from {resume_from.name} (step {start}, data position {stream.position})")

    metrics_file = _open_metrics(run_dir / "metrics.jsonl") if dist.is_main else None

    def emit(step: int, m: dict[str, Any]) -> None:
        if metrics_file is None:
            return
        metrics_file.write(json.dumps({"step": step, **m}) + "\n")
        metrics_file.flush()
        if on_step:
            on_step(step, m)

    def save(step: int, m: dict[str, Any]) -> Path:
        rngs = dist.gather(checkpoint.rng_state())  # every rank's RNG, so a resumed DP run is exact too
        path = ckpt_root / f"step-{step:07d}"
        m["checkpoint"] = path.name
        if dist.is_main:
            path = checkpoint.save(ckpt_root, step, policy, tok, {
                "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                "estimator": estimator.state_dict(), "data_position": stream.position,
                "accuracy_before": acc_before, "rng_by_rank": rngs,
                "metrics": m,  # the step's record travels with it: see the resume below
            })
        dist.barrier()
        return path

    if resume_from is not None and state.get("metrics") is not None:
        # A worker killed (or frozen and fenced off) between writing this checkpoint and recording the
        # step's metrics would lose that step for good: the resumed run starts after it. So the
        # record is delivered again: on_step upserts by step; the local file gets it only if missing.
        if start not in _steps_in(run_dir / "metrics.jsonl"):
            emit(start, state["metrics"])
        elif on_step and dist.is_main:
            on_step(start, state["metrics"])

    def run_eval() -> dict[str, float]:
        return evaluate(engine, scorer, eval_set, ro_cfg.max_new_tokens, dist)

    if start == 0:
        ev = run_eval()
        acc_before = ev["eval/accuracy"]
        emit(0, ev)
        log(f"step 0: held-out accuracy {acc_before:.3f}")

    # ------------------------------------------------------------------ steps
    step_fn = REGIMES[spec.algorithm]
    step, last_ckpt = start, None
    try:
        for step in range(start + 1, tc.steps + 1):
            m = step_fn(ctx)
            if on_rollouts and dist.is_main and ctx.samples:
                on_rollouts(step, ctx.samples)
            m.update({"lr": sched.get_last_lr()[0], "data_position": stream.position})
            if not math.isfinite(m["loss"]):
                raise FloatingPointError(f"loss became {m['loss']} at step {step}")
            # -------------------------------------------------------------- eval / checkpoint / stop
            if (tc.eval_every and step % tc.eval_every == 0) or step == tc.steps:
                m.update(run_eval())
            stop = dist.broadcast(should_stop() if should_stop and dist.is_main else None)
            if (tc.checkpoint_every and step % tc.checkpoint_every == 0) or step == tc.steps or stop:
                last_ckpt = save(step, m)
            emit(step, m)
            if stop:
                return RunResult("paused" if stop == "pause" else "cancelled", step, acc_before,
                                 None, str(run_dir), str(last_ckpt))
    finally:
        if metrics_file is not None:
            metrics_file.close()
    acc_after = _last_eval(run_dir) if dist.is_main else None
    return RunResult("succeeded", step, acc_before, acc_after, str(run_dir), str(last_ckpt) if last_ckpt else None)


def _open_metrics(path: Path):
    if path.exists() and path.stat().st_size:
        with path.open("rb+") as f:
            f.seek(-1, 2)
            if f.read(1) != b"\n":  # a killed writer left half a line: end it, so the next record is whole
                f.write(b"\n")
    return path.open("a", encoding="utf-8")


def _records(metrics: Path) -> Iterator[dict[str, Any]]:
    if not metrics.exists():
        return
    with metrics.open(encoding="utf-8") as f:
        for line in f:
            try:
                yield json.loads(line)
            except json.JSONDecodeError:  # a line cut short by a killed writer: the step is replayed anyway
                continue


def _steps_in(metrics: Path) -> set[int]:
    return {r["step"] for r in _records(metrics)}


def _last_eval(run_dir: Path) -> float | None:
    acc = None
    for rec in _records(run_dir / "metrics.jsonl"):
        acc = rec.get("eval/accuracy", acc)
    return acc
