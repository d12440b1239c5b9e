"""What a step reports about the policy it trained: entropy over EVERY sampled row (rows the update skips
included: all-correct groups are where entropy collapses first), the sampler - trainer log-prob gap (over
every row too, unless the sampler is the policy itself: trainer/online.py), and, for multi-pass updates, how
far each pass moved from the sampling policy.

Records are merged across micro-batches, rows and optimiser steps by :func:`merge`: a ``(sum, weight)``
pair is a weighted mean (token-weighted: a micro-batch of 3 tokens does not count as much as one of 300),
a ``*_max`` / ``*_min`` key is a maximum / minimum, any other value a plain mean.
"""
from __future__ import annotations

import torch

Stat = float | tuple[float, float] | None


def policy_stats(logp: torch.Tensor, entropy: torch.Tensor, engine_logp: torch.Tensor | None,
                 completion_mask: torch.Tensor) -> dict[str, Stat]:
    """The sampling policy as the trainer computes it, over sampled tokens (B, T): its entropy, and how far
    the engine's sampled-token log-probs are from the trainer's (``rollout/logp_abs_diff_mean|max``;
    ``rollout/logp_kl_k3``: k3 of KL(engine || trainer); ``rollout/is_ratio_mean``: mean p_trainer / p_engine)."""
    m = completion_mask.to(torch.bool)
    n = float(m.sum())
    if not n:
        return {}
    out: dict[str, Stat] = {"entropy": (float(entropy.detach().float()[m].sum()), n)}
    return out if engine_logp is None else {**out, **engine_gap(logp, engine_logp, completion_mask)}


def engine_gap(trainer_logp: torch.Tensor, engine_logp: torch.Tensor, mask: torch.Tensor) -> dict[str, Stat]:
    """The engine's sampled-token log-probs against the trainer's, over masked tokens (B, T)."""
    m = mask.to(torch.bool)
    n = float(m.sum())
    if not n:
        return {}
    d = (trainer_logp.detach().float() - engine_logp.float().to(trainer_logp.device))[m]
    return {"rollout/logp_abs_diff_mean": (float(d.abs().sum()), n), "rollout/logp_abs_diff_max": float(d.abs().max()),
            "rollout/logp_kl_k3": (float((d.exp() - 1 - d).sum()), n),
            "rollout/is_ratio_mean": (float(d.exp().sum()), n)}


def ratio_stats(logp: torch.Tensor, old_logp: torch.Tensor, clipped: torch.Tensor, mask: torch.Tensor,
                epoch: int) -> dict[str, Stat]:
    """A multi-pass update against the sampling (old) policy, over loss tokens: approx-KL(old || new) for this
    epoch (k3 of the ratio r = new/old: unbiased under samples from old, >= 0), the ratio's range, and the
    share of tokens whose clip binds (the loss's own indicator), split by the side: ``clip_frac_low`` (r < 1,
    negative advantages pushed down too far) and ``clip_frac_high`` (r > 1)."""
    m = mask.to(torch.bool)
    n = float(m.sum())
    if not n:
        return {}
    log_r = (logp.detach().float() - old_logp.float())[m]
    r, c = log_r.exp(), clipped.detach().to(torch.bool)[m]
    return {f"update/approx_kl_epoch_{epoch}": (float((r - 1 - log_r).sum()), n),
            "update/ratio_min": float(r.min()), "update/ratio_max": float(r.max()),
            "clip_frac": (float(c.sum()), n), "clip_frac_low": (float((c & (r < 1)).sum()), n),
            "clip_frac_high": (float((c & (r > 1)).sum()), n)}


INERT_WHEN_SINGLE_PASS = ("clip_frac", "clip_frac_low", "clip_frac_high")  # ratio == 1: no clip can bind


def merge(records: list[dict[str, Stat]]) -> dict[str, float | None]:
    """One value per key over every record that has it (see the module docstring)."""
    out: dict[str, float | None] = {}
    for k in sorted({k for r in records for k in r}):
        vals = [r[k] for r in records if k in r]
        if any(v is None for v in vals):
            out[k] = None
        elif isinstance(vals[0], tuple):
            total, weight = sum(v[0] for v in vals), sum(v[1] for v in vals)
            out[k] = total / weight if weight else 0.0
        elif k.endswith("_max"):
            out[k] = max(vals)
        elif k.endswith("_min"):
            out[k] = min(vals)
        else:
            out[k] = sum(vals) / len(vals)
    return out
