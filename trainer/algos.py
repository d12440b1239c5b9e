"""Advantage estimators, policy losses, KL estimators and loss aggregation: pure tensor functions.

One dict per signature family; callers look a function up by the name in the job spec and call it,
they never branch on the name. Shapes: B = sequences, T = completion tokens, G = group size.

Aggregations return a *sum-normalised* scalar: they divide by a count of the WHOLE batch that the
caller passes in, so summing the result over micro-batches equals the full-batch value exactly
(splitting a batch into micro-batches leaves the loss and its gradient unchanged).
"""
from __future__ import annotations

from typing import Callable

import torch

EPS = 1e-6

# --------------------------------------------------------------------------------------------
# Advantages: rewards (B,) grouped as (num_prompts, G) -> per-sequence advantages (B,)


def adv_grpo(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """GRPO: (r - group mean) / (group std + eps)."""
    r = rewards.view(-1, group_size)
    adv = (r - r.mean(dim=1, keepdim=True)) / (r.std(dim=1, keepdim=True) + EPS)
    return adv.view(-1)


def adv_grpo_no_std(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """Dr. GRPO: group-mean baseline only (no std normalisation, which over-weights easy/hard groups)."""
    r = rewards.view(-1, group_size)
    return (r - r.mean(dim=1, keepdim=True)).view(-1)


ADVANTAGES: dict[str, Callable[[torch.Tensor, int], torch.Tensor]] = {
    "grpo": adv_grpo,
    "grpo_no_std": adv_grpo_no_std,
}

# --------------------------------------------------------------------------------------------
# Policy losses: per-token loss (B, T) and the per-token "clipped" indicator (B, T)


def loss_clipped(
    logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, clip_low: float, clip_high: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO-style clipped surrogate, asymmetric bounds allowed (DAPO clip-higher)."""
    ratio = torch.exp(logp - old_logp)  # (B, T)
    a = adv.unsqueeze(-1)  # (B, 1)
    unclipped = ratio * a
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * a
    loss = -torch.minimum(unclipped, clipped)
    return loss, (clipped < unclipped).float()


POLICY_LOSSES = {"clipped": loss_clipped}

# --------------------------------------------------------------------------------------------
# KL(policy || reference) estimators per token, from log-probs of the sampled tokens (Schulman 2020)


def kl_k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    return logp - ref_logp


def kl_k2(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    return 0.5 * (logp - ref_logp) ** 2


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    d = ref_logp - logp
    return torch.exp(d) - d - 1.0


KL_ESTIMATORS = {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3}

# --------------------------------------------------------------------------------------------
# Aggregation of a per-token matrix (B, T) under a completion mask (B, T) into a scalar.
# n_tokens / n_seqs / max_len describe the WHOLE batch (see module docstring).


def agg_token_mean(x, mask, n_tokens: int, n_seqs: int, max_len: int) -> torch.Tensor:
    return (x * mask).sum() / max(n_tokens, 1)


def agg_seq_mean_token_mean(x, mask, n_tokens: int, n_seqs: int, max_len: int) -> torch.Tensor:
    per_seq = (x * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    return per_seq.sum() / max(n_seqs, 1)


def agg_seq_mean_token_sum_norm(x, mask, n_tokens: int, n_seqs: int, max_len: int) -> torch.Tensor:
    """Dr. GRPO: token sums divided by a constant (max length), so long answers are not favoured."""
    return (x * mask).sum() / max(n_seqs * max_len, 1)


LOSS_AGG = {
    "token-mean": agg_token_mean,
    "seq-mean-token-mean": agg_seq_mean_token_mean,
    "seq-mean-token-sum-norm": agg_seq_mean_token_sum_norm,
}

# --------------------------------------------------------------------------------------------


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log p(target) per position: logits (B, T, V), targets (B, T) -> (B, T), memory-light."""
    logits = logits.float()
    return torch.gather(logits, -1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, -1)
