"""What every training step shares: the run's context, loss normalisers, and the one optimiser step.

:class:`Ctx` is built once by :func:`trainer.loop.setup` and read by the step functions
(trainer.online, trainer.preference); a step never writes into it for someone else to read back — it
returns a :class:`StepOutput` with what it produced.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

import torch

from .batch import chunks
from .distributed import Dist
from .engines import weights
from .models import grads


class Counts(NamedTuple):
    """Normalisers of a loss over one optimiser step's WHOLE minibatch (every rank, every micro-batch),
    so that summing micro-batch losses gives the full-batch loss (trainer.algos aggregations)."""
    tokens: int = 0   # completion tokens under the mask (token-level aggregations)
    seqs: int = 0     # sequences (or preference pairs)
    max_len: int = 0  # the generation budget, rollout.max_new_tokens (Dr. GRPO's constant normaliser)


@dataclass
class StepOutput:
    metrics: dict[str, Any]                                    # one record for the step
    samples: list[dict[str, Any]] = field(default_factory=list)  # a few whole scored groups, for people


@dataclass
class Ctx:
    """Everything a step function needs; built once per run."""
    spec: Any  # trainer.config.JobSpec
    dist: Dist
    policy: Any
    ref: Any
    tok: Any
    engine: Any
    scorer: Any  # trainer.scoring.Scorer
    stream: Any  # trainer.data.PromptStream
    estimator: Any
    opt: torch.optim.Optimizer
    sched: Any
    params: list[torch.nn.Parameter] = field(default_factory=list)
    producer: Any = None  # trainer.producer.AsyncRollouts when rollouts run ahead (max_staleness > 0)
    teacher: Any = None   # on-policy distillation's frozen teacher (spec.distill)
    tools: Any = None     # trainer.episodes.Tools when the job plays episodes (spec.episodes)

    def autocast(self):
        if self.spec.train.precision == "bf16":
            return torch.autocast(self.dist.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()


MicroFn = Callable[[torch.Tensor, Counts], "tuple[torch.Tensor, dict[str, float]]"]


def optimize(ctx: Ctx, mb: torch.Tensor, count_fn: Callable[[torch.Tensor], Counts], micro_fn: MicroFn,
             inert: torch.Tensor | None = None, micro_rows: int | None = None) -> list[dict[str, float]]:
    """One optimiser step on a minibatch of local rows: gradient accumulation over micro-batches
    (losses are normalised by the minibatch's GLOBAL counts, so the sum is the full-batch loss),
    gradients summed across ranks, clipped, applied. Rows flagged ``inert`` (their every loss term
    is identically zero) still count in the normalisers but are never run forward/backward. ``micro_rows``:
    rows per forward/backward (the caller's, from its sequences' width: AlgoConfig.micro_rows)."""
    counts = count_fn(mb)
    # zeroed in place, not freed: a fresh gradient buffer every step is page faults over the whole model
    # (a 135M model: ~135k page faults per step on CPU); those our in-place writers fill are overwritten by their
    # first write instead (trainer/models/grads.py)
    opt_params = [p for g in ctx.opt.param_groups for p in g["params"]]
    grads.zero(opt_params)
    stats, total = [], 0.0
    # sharded (FSDP): every rank must run the same forwards and backwards, so nothing is skipped
    live = mb[~inert[mb]] if inert is not None and not ctx.dist.sharded else mb
    for idx in chunks(live, micro_rows if micro_rows is not None else ctx.spec.algo.micro_batch_size):
        if len(idx) == 0:
            continue
        with ctx.autocast():
            loss, st = micro_fn(idx, counts)
        loss.backward()
        total += loss.item()
        stats.append(st)
    grads.finish(opt_params)
    for p in ctx.params:  # a zero gradient, not a missing one: Adam's moments still decay
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    ctx.dist.sum_grads(ctx.params)
    gn = clipped_step(ctx.opt, ctx.params, ctx.spec.optim.max_grad_norm, ctx.dist.sharded)
    weights.changed(ctx.policy)  # counted: the fused step does not bump the tensors' _version (engines.weights)
    total = float(ctx.dist.all_sum(torch.tensor([total], dtype=torch.float64))[0])  # float32 would round it
    return stats + [{"loss": total, "grad_norm": float(gn)}]


def grad_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """The global 2-norm of one process's gradients: on the CPU the square root of the sum of each gradient's dot
    product with itself, elsewhere (and for mixed dtypes or strided gradients) torch's ``get_total_norm``.

    Why not torch's on the CPU: its float 2-norm of a whole tensor takes a serial path, one thread whatever the
    job's count (SmolLM2-135M's gradients: 46.9 ms at one thread, 46.6 at two; ``torch.dot``, which BLAS runs
    on every thread, 39.6 and 21.2 ms), and it is the less accurate (against the float64 value 11597.105 it read
    11593.1, the dots 11597.04: bench/RESULTS.md, "Session 67"). A non-finite sum is taken again by torch's norm,
    so inf and NaN come out as torch's clip has them."""
    if not grads or not all(g.device.type == "cpu" and g.dtype in (torch.float32, torch.float64)
                            and g.dtype == grads[0].dtype and g.is_contiguous() for g in grads):
        return torch.nn.utils.get_total_norm(grads, 2.0)
    total = torch.stack([torch.dot(g.view(-1), g.view(-1)) for g in grads]).sum().sqrt()
    return total if bool(total.isfinite()) else torch.nn.utils.get_total_norm(grads, 2.0)


def _fused_cpu_adam(opt: torch.optim.Optimizer, params: list[torch.nn.Parameter]) -> bool:
    """Whether ``opt`` is torch's fused Adam/AdamW over exactly ``params``, all float32 on the CPU: a step that can
    take the clip's factor as its ``grad_scale`` (a float32 scalar in the kernel: float64 weights would see it
    rounded, so they keep the multiply)."""
    if type(opt) not in (torch.optim.Adam, torch.optim.AdamW) or not all(g.get("fused") for g in opt.param_groups):
        return False
    ids = {id(p) for g in opt.param_groups for p in g["params"]}
    return ids == {id(p) for p in params} and all(p.device.type == "cpu" and p.dtype == torch.float32 for p in params)


def clipped_step(opt: torch.optim.Optimizer, params: list[torch.nn.Parameter], max_norm: float,
                 sharded: bool) -> torch.Tensor:
    """``clip_grads`` then ``opt.step()``; returns the norm. Where the step is torch's fused CPU Adam over exactly
    these parameters, the clip's factor goes in as the step's ``grad_scale`` (the kernel divides each gradient by it
    as it reads it, and leaves the clipped gradient in ``.grad`` as the multiply would): one pass over the gradients
    fewer (SmolLM2-135M on the Intel host of session 67: 49 ms at one thread, 23 at two, on a step that clips). The
    factor is 1 / min(1, max_norm / (norm + 1e-6)): g / (1/c) rounds as g·c does to within one unit in the last
    place."""
    scale = not sharded and _fused_cpu_adam(opt, params)
    total = clip_grads(params, max_norm, sharded, defer=scale)
    if scale and not bool(max_norm / (total + 1e-6) >= 1.0):  # clipping (or a NaN norm, which scales as torch's)
        opt.grad_scale = ((total + 1e-6) / max_norm).to(torch.float32)
    try:
        opt.step()
    finally:
        opt.__dict__.pop("grad_scale", None)
    return total


def clip_grads(params: list[torch.nn.Parameter], max_norm: float, sharded: bool, defer: bool = False) -> torch.Tensor:
    """Clip to a global gradient norm (``grad_norm``), as torch's clip scales: by min(1, max_norm / (norm + 1e-6));
    ``defer``: only the norm (the caller scales, clipped_step). Sharded parameters (FSDP's DTensors) report their
    shard's norm: the full norm is their all-reduced square sum (the same value torch's clip gives one process)."""
    if not sharded:
        grads = [p.grad for p in params if p.grad is not None]
        total = grad_norm(grads)
        # torch's clip multiplies every gradient by min(1, max_norm / (total + 1e-6)), by 1 too (on a GPU the test
        # would wait for the device): on the CPU a pass over every gradient that changes no bit (SmolLM2: ~60 ms of
        # a 3.6 s update). Skipped there when the factor is 1; a NaN norm still multiplies, as torch's does.
        if not defer and not (all(g.device.type == "cpu" for g in grads) and bool(max_norm / (total + 1e-6) >= 1.0)):
            torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
        return total
    from torch.distributed.tensor import DTensor

    sq = []
    for p in params:
        n = torch.linalg.vector_norm(p.grad, 2.0)
        sq.append((n.full_tensor() if isinstance(n, DTensor) else n) ** 2)
    total = torch.stack(sq).sum().sqrt()
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for p in params:
        p.grad.mul_(coef.to(p.grad.dtype))
    return total
