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

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from . import checkpoint, devices, distributed, online, preference, trackers
from .config import JobSpec
from .context import Ctx, StepOutput
from .data import PromptStream
from .engines import job_engine
from .engines.packed import pack_frozen
from .episodes import tools_for
from .estimators import make_estimator
from .evaluation import Drift, Episodes, evaluate, loosened, strict_verifiers
from .models import linear, mlp, norm
from .models.load import AdapterOff, disable_dropout, grads_in_place, load_models
from .models.resolve import ModelPathError, resolve_model
from .scoring import Scorer
from .splits import load_splits

StepCallback = Callable[[int, dict[str, Any]], None]
StopCheck = Callable[[], str | None]  # returns "pause" / "cancel" to stop early, else None
REGIMES: dict[str, Callable[[Ctx], StepOutput]] = {"grpo": online.step, "ppo": online.step, "dpo": preference.step}

__all__ = ["RunResult", "ModelPathError", "train", "setup", "evaluate"]
EvalCallback = Callable[[int, list[dict[str, Any]]], None]


@dataclass
class RunResult:
    status: str  # succeeded | paused | cancelled
    step: int
    accuracy_before: float | None
    accuracy_after: float | None
    run_dir: str
    checkpoint: str | None


@dataclass
class Run:
    """A set-up run: the step context plus what the loop around the steps needs."""
    ctx: Ctx
    eval_set: list[dict[str, Any]]
    run_dir: Path
    strict: Scorer | None = None                  # the task's own judge of the held-out set (evaluation.py)
    drift: Drift | None = None                    # KL from the starting policy on a fixed probe
    start: int = 0                                # the last step already done (resume)
    accuracy_before: float | None = None
    resumed_metrics: dict[str, Any] | None = None  # the resumed checkpoint's own step record


def train(spec: JobSpec, run_dir: str | Path, *, models_dir: str | Path, on_step: StepCallback | None = None,
          should_stop: StopCheck | None = None, on_rollouts: Callable[[int, list[dict[str, Any]]], None] | None = None,
          score_remote: Callable | None = None, log: Callable[[str], None] = print,
          on_start: Callable[[dict[str, Any]], None] | None = None, on_eval: EvalCallback | None = None) -> RunResult:
    """Run a job to its end (or until ``should_stop`` says pause/cancel).

    ``on_step(step, metrics)`` receives every step's record; ``on_rollouts(step, groups)`` a few whole
    scored groups per step, for people to read what the model wrote and how each verifier judged it.
    ``score_remote`` scores somewhere else (see trainer.scoring.Scorer), e.g. on CPU workers so a GPU
    worker never runs a verifier. ``on_start(info)`` hears where the run trains (device, engine, …);
    ``on_eval(step, records)`` every held-out problem's outcome and completion at each eval (also written
    to ``evals/step-NNNNNNN.jsonl`` in the run dir)."""
    run_dir, models_dir = Path(run_dir), Path(models_dir)
    with distributed.group(spec.train.world_size, spec.model_dump_json(), run_dir, models_dir,
                           spec.train.device) as dist:
        run = setup(spec, run_dir, models_dir, dist, score_remote, log)
        if on_start and dist.is_main:
            on_start(describe(run))
        return _loop(run, on_step, should_stop, on_rollouts, log, on_eval)


def describe(run: Run) -> dict[str, Any]:
    """Where and how this run trains: what a person wants to read in the job's first event."""
    ctx = run.ctx
    dev = ctx.dist.device
    out = {"device": str(dev), "world_size": ctx.dist.world, "engine": type(ctx.engine).__name__,
           "fsdp": ctx.dist.sharded, "dtype": str(ctx.spec.model.dtype),
           "gradient_checkpointing": ctx.spec.train.gradient_checkpointing}
    if dev.type == "cuda":
        out["gpu"] = torch.cuda.get_device_name(dev)
    if getattr(ctx.producer, "where", None):  # a producer on a Ray node: which
        out["producer"] = {k: ctx.producer.where[k] for k in ("node", "ip")}
    return out


# ---------------------------------------------------------------------------------------------- setup
def setup(spec: JobSpec, run_dir: Path, models_dir: Path, dist: distributed.Dist, score_remote=None,
          log: Callable[[str], None] = print) -> Run:
    """Load the policy (and reference, critic), data, optimiser; restore a checkpoint if there is one."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # progress bars flood worker logs
    devices.keep_freed_memory()  # large tensors reuse the heap instead of page-faulting in every step
    run_dir.mkdir(parents=True, exist_ok=True)
    tc = spec.train
    trackers.require(tc.report_to)  # a missing tracker package fails the job now, naming it
    dist.shard(tc.prompts_per_step)  # fails early (typed) when the batch does not split over the ranks
    if tc.threads:
        torch.set_num_threads(tc.threads)
    devices.deterministic(tc.deterministic)
    random.seed(tc.seed)
    torch.manual_seed(tc.seed + dist.rank)  # ranks sample different completions
    model_dir = resolve_model(spec.model.path, models_dir, log=log)
    resume_from = checkpoint.latest(run_dir / "checkpoints")
    policy, ref, tok = load_models(spec, model_dir, resume_from, dist)
    train_set, eval_set = load_splits(spec.data)
    if spec.dpo is not None and spec.dpo.pairs != "online":
        train_set = preference.load_pairs(spec.dpo.pairs)
    estimator = make_estimator(spec, policy.config.get_text_config().hidden_size,
                               lambda path: _load_critic(path, policy, models_dir, spec, dist, log))
    estimator.to(dist.device, torch.float64 if policy.dtype == torch.float64 else torch.float32)  # heads >= fp32
    teacher = _load_frozen(spec.distill.teacher, "distill.teacher", policy, models_dir, spec, dist, log) \
        if spec.distill is not None else None
    frozen = [m for m in (ref, teacher) if m is not None and not isinstance(m, AdapterOff)]
    _shard_or_pack(policy, frozen, dist, sharded=tc.fsdp and dist.world > 1)
    opt, sched, params = _optimizer(spec, policy, estimator, dist.sharded)
    engine = job_engine(spec, policy, tok, dist)
    ctx = Ctx(spec, dist, policy, ref, tok, engine, Scorer(spec.verifiers, remote=score_remote),
              PromptStream(train_set, seed=tc.seed), estimator, opt, sched, params)
    ctx.teacher = teacher
    ctx.tools = tools_for(spec, dist.rank)
    run = Run(ctx, eval_set, run_dir, Scorer(strict_verifiers(spec), remote=score_remote))
    if dist.is_main and not dist.sharded:  # one forward of a small probe: rank 0 alone, never mid-collective
        run.drift = Drift(run_dir / "drift_probe.pt")
    for warning in loosened(spec):
        log(f"warning: {warning}")
    if resume_from is not None:
        state = checkpoint.load_state(resume_from, rank=dist.rank)  # restores this rank's RNG streams
        checkpoint.load_optimizer(opt, policy, state["optimizer"], dist.sharded)
        sched.load_state_dict(state["scheduler"])
        estimator.load_state_dict(state.get("estimator", {}))
        ctx.stream.position, run.start = state["data_position"], state["step"]
        run.accuracy_before, run.resumed_metrics = state.get("accuracy_before"), state.get("metrics")
        log(f"resumed from {resume_from.name} (step {run.start}, data position {ctx.stream.position})")
    if spec.rollout.max_staleness > 0:  # rollouts overlap training: a producer process (trainer/producer.py)
        if spec.train.producer == "ray":  # or a Ray actor, on another node (trainer/cluster/producer.py)
            from .cluster.producer import RayRollouts as AsyncRollouts
        else:
            from .producer import AsyncRollouts

        ctx.producer = AsyncRollouts(spec, run_dir, models_dir, policy, ctx.stream.position, run.start, log)
    return run


def _shard_or_pack(policy, frozen: list, dist: distributed.Dist, sharded: bool) -> None:
    """Sharded training (FSDP): every model sharded over the ranks, once all are loaded and placed. Otherwise the
    frozen ones (the reference, a teacher; never a LoRA reference, which is the policy) never change over the job:
    on the CPU their layers are packed once for good (trainer/engines/packed.py)."""
    if sharded:
        for m in (policy, *frozen):
            distributed.fsdp_wrap(m, dist)
    else:
        for m in frozen:
            # the products of trainer/models/gemm.py, the MLP activation of models/mlp.py and RMSNorm's forward of
            # models/norm.py, as the policy's: a model at the policy's weights (a job's reference at step 0, a
            # teacher that is the student) scores its tokens bitwise as the policy does
            linear.grad_in_place(m)
            mlp.fused_swiglu(m)
            norm.fused_rms_norm(m)
            pack_frozen(m)


def _load_same_vocabulary(path: str, field: str, policy, models_dir: Path, spec: JobSpec, log):
    """A second model that reads the policy's token ids (a critic, a teacher): the same vocabulary, or a clear
    error naming the field (the API checks it at submission where both models are on the server)."""
    from transformers import AutoModelForCausalLM

    from .models.attention import gqa_in_kernel

    net = gqa_in_kernel(AutoModelForCausalLM.from_pretrained(resolve_model(path, models_dir, log=log),
                                                             dtype=getattr(torch, spec.model.dtype)))
    vocab, want = net.config.get_text_config().vocab_size, policy.config.get_text_config().vocab_size
    if vocab != want:
        raise ModelPathError(f"{field} {path!r} has a vocabulary of {vocab} tokens, the policy {want}: "
                             f"the {field.split('.')[-1]} reads the policy's token ids, so they must share a tokenizer")
    return net


def _load_frozen(path: str, field: str, policy, models_dir: Path, spec: JobSpec, dist: distributed.Dist, log):
    """A frozen model scoring the policy's samples (distill.teacher), in eval mode on the run's device."""
    net = _load_same_vocabulary(path, field, policy, models_dir, spec, log).to(dist.device).eval()
    return net.requires_grad_(False)


def _load_critic(path: str, policy, models_dir: Path, spec: JobSpec, dist: distributed.Dist, log):
    """A separate PPO critic: same vocabulary as the policy (it reads the policy's token ids), trainable."""
    net = _load_same_vocabulary(path, "ppo.critic", policy, models_dir, spec, log)
    if spec.model.disable_dropout:
        disable_dropout(net)
    net = net.to(dist.device).train()
    grads_in_place(net)  # as the policy's (the critic is never sharded)
    return net


def _optimizer(spec: JobSpec, policy, estimator, sharded: bool):
    """AdamW over the trainable policy weights (and the estimator's, at the value lr), with warm-up."""
    groups = [{"params": [p for p in policy.parameters() if p.requires_grad]}]
    est_params = estimator.parameters()
    if est_params:
        value_lr = spec.ppo.value_lr if spec.ppo and spec.ppo.value_lr else spec.optim.lr * 10
        groups.append({"params": est_params, "lr": value_lr})
    # fused: one vectorised pass over each tensor instead of ~10 elementwise ops — on CPU, 128M fp32
    # parameters: 0.60 -> 0.18 s per step at one thread, 0.44 -> 0.09 s at two. FSDP's sharded
    # parameters keep the default.
    opt = torch.optim.AdamW(groups, lr=spec.optim.lr, weight_decay=spec.optim.weight_decay,
                            fused=not sharded)
    warm = spec.optim.warmup_steps
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warm) if warm else 1.0)
    return opt, sched, [p for g in groups for p in g["params"]]


# ---------------------------------------------------------------------------------------------- steps
def _loop(run: Run, on_step: StepCallback | None, should_stop: StopCheck | None, on_rollouts, log,
          on_eval: EvalCallback | None = None) -> RunResult:
    ctx, dist, tc = run.ctx, run.ctx.dist, run.ctx.spec.train
    record = _Recorder(run, on_step)
    try:
        if run.resumed_metrics is not None:
            record.redeliver(run.start, run.resumed_metrics)
        if run.start == 0:
            ev = _evaluate(run, 0, on_eval)
            run.accuracy_before = ev["eval/accuracy"]
            record.emit(0, ev)
            log(f"step 0: held-out accuracy {run.accuracy_before:.3f}")
        step, last_ckpt = run.start, None
        for step in range(run.start + 1, tc.steps + 1):
            out = REGIMES[ctx.spec.algorithm](ctx)
            m = out.metrics
            if on_rollouts and dist.is_main and out.samples:
                on_rollouts(step, out.samples)
            m.update({"lr": ctx.sched.get_last_lr()[0], "data_position": ctx.stream.position,
                      **devices.memory_metrics(dist.device)})
            if not math.isfinite(m["loss"]):
                raise FloatingPointError(f"loss became {m['loss']} at step {step}")
            # -------------------------------------------------------------- eval / checkpoint / stop
            if (tc.eval_every and step % tc.eval_every == 0) or step == tc.steps:
                m.update(_evaluate(run, step, on_eval))
            stop = dist.broadcast(should_stop() if should_stop and dist.is_main else None)
            if (tc.checkpoint_every and step % tc.checkpoint_every == 0) or step == tc.steps or stop:
                last_ckpt = _save(run, step, m)
            record.emit(step, m)
            if stop:
                return RunResult("paused" if stop == "pause" else "cancelled", step, run.accuracy_before,
                                 None, str(run.run_dir), str(last_ckpt))
    finally:
        record.close()
        if ctx.producer is not None:  # pause, cancel, failure or the end: the producer stops with us
            ctx.producer.close()
    acc_after = _last_eval(run.run_dir) if dist.is_main else None
    return RunResult("succeeded", step, run.accuracy_before, acc_after, str(run.run_dir),
                     str(last_ckpt) if last_ckpt else None)


def _evaluate(run: Run, step: int, on_eval: EvalCallback | None = None) -> dict[str, float]:
    """The held-out metrics, each problem's record (run dir, ``on_eval``) and the drift from the start."""
    ctx, ro = run.ctx, run.ctx.spec.rollout
    records: list[dict[str, Any]] = []
    ep = ctx.spec.episodes
    kw = dict(n_samples=ctx.spec.train.eval_samples, temperature=ro.temperature, top_p=ro.top_p, stop=ro.stop,
              strict=run.strict)
    m = evaluate(ctx.engine, ctx.scorer, run.eval_set, ro.max_new_tokens, ctx.dist, records=records,
                 play=Episodes(ctx.tok, ep, ctx.tools) if ep is not None else None, **kw)
    if ep is not None and ep.eval_tools_off:  # the same problems, one turn, no tool: did it learn to do without?
        off: list[dict[str, Any]] = []
        m.update(evaluate(ctx.engine, ctx.scorer, run.eval_set, ro.max_new_tokens, ctx.dist, records=off,
                          prefix="eval/tools_off/", **kw))
        for r, o in zip(records, off):
            r["tools_off"] = {k: o[k] for k in ("completion", "correct", "strict_correct", "reward", "length")}
    if run.drift is not None:
        cuda = [ctx.dist.device] if ctx.dist.device.type == "cuda" else []
        with torch.random.fork_rng(devices=cuda):  # the probe's sampling leaves the run's random stream alone
            run.drift.start(ctx.engine, ctx.policy, run.eval_set, ctx.spec)
        m.update(run.drift.measure(ctx.policy, ro.temperature))
    if ctx.dist.is_main:
        out = run.run_dir / "evals" / f"step-{step:07d}.jsonl"
        out.parent.mkdir(exist_ok=True)
        out.write_text("".join(json.dumps(r) + "\n" for r in records))
        if on_eval:
            on_eval(step, records)
    return m


def _save(run: Run, step: int, m: dict[str, Any]) -> Path:
    """A checkpoint of every rank's state; the step's record travels with it (see _Recorder.redeliver)."""
    ctx, dist = run.ctx, run.ctx.dist
    ckpt_root = run.run_dir / "checkpoints"
    rngs = dist.gather(checkpoint.rng_state())  # every rank's RNG, so a resumed DP run is exact too
    weights, optimizer = checkpoint.full_states(ctx.policy, ctx.opt, dist.sharded)  # collective when sharded
    path = ckpt_root / f"step-{step:07d}"
    m["checkpoint"] = path.name
    if dist.is_main:
        path = checkpoint.save(ckpt_root, step, ctx.policy, ctx.tok, {
            "optimizer": optimizer, "scheduler": ctx.sched.state_dict(),
            "estimator": ctx.estimator.state_dict(), "data_position": ctx.stream.position,
            "accuracy_before": run.accuracy_before, "rng_by_rank": rngs, "metrics": m}, model_state=weights)
        checkpoint.record(ckpt_root, path.name, m.get("eval/accuracy"))
        if step == ctx.spec.train.steps and ctx.spec.model.lora is not None:  # the final LoRA checkpoint
            checkpoint.save_merged(path, ctx.policy, ctx.tok)  # also as merged, plain HF weights
        if ctx.spec.train.keep_last:
            gone = checkpoint.prune(ckpt_root, ctx.spec.train.keep_last)
            if gone:
                m["checkpoints_pruned"] = gone
    dist.barrier()
    return path


class _Recorder:
    """Step records to ``metrics.jsonl`` (rank 0), the job's trackers (``train.report_to``) and ``on_step``."""

    def __init__(self, run: Run, on_step: StepCallback | None):
        self.path, self.on_step = run.run_dir / "metrics.jsonl", on_step
        self.file = _open_metrics(self.path) if run.ctx.dist.is_main else None
        names = run.ctx.spec.train.report_to
        try:
            self.trackers = trackers.Trackers(names, run.run_dir, run.ctx.spec) if names and self.file else None
        except BaseException:
            self.close()
            raise

    def emit(self, step: int, m: dict[str, Any]) -> None:
        if self.file is None:
            return
        self.file.write(json.dumps({"step": step, **m}) + "\n")
        self.file.flush()
        if self.trackers:
            self.trackers.log(step, m)
        if self.on_step:
            self.on_step(step, m)

    def redeliver(self, step: int, m: dict[str, Any]) -> None:
        """A worker killed (or frozen and fenced off) between writing a checkpoint and recording its
        step would lose that step for good: the resumed run starts after it. So the checkpoint's record
        is delivered again: on_step upserts by step; the local file gets it only if missing."""
        if self.file is None:
            return
        if step not in {r["step"] for r in _records(self.path)}:
            self.emit(step, m)
        elif self.on_step:
            self.on_step(step, m)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
        if getattr(self, "trackers", None) is not None:
            self.trackers.close()


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


def _last_eval(run_dir: Path) -> float | None:
    acc = None
    for rec in _records(run_dir / "metrics.jsonl"):
        acc = rec.get("eval/accuracy", acc)
    return acc
