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
# Advantages: rewards (B,) grouped as (num_prompts, G), and which rows are valid (B,) bool or None
# (None: all) -> per-sequence advantages (B,). An invalid row (an infrastructure failure: its reward
# judges nothing) is left out of every group statistic and gets advantage 0; so does every row of a
# group with no signal (flat_groups). With every row valid, each is its paper's plain formula.

FLAT_EPS = 1e-8  # rewards closer than this are equal: the group carries no learning signal


def _view(rewards: torch.Tensor, group_size: int, valid: torch.Tensor | None):
    """(r, v): rewards as (num_prompts, G), validity as 0/1 of the same shape; v is None when all are valid
    (the plain formulas then run, bit for bit)."""
    r = rewards.view(-1, group_size)
    if valid is None or bool(valid.all()):
        return r, None
    return r, valid.view(-1, group_size).to(rewards.dtype)


def flat_groups(rewards: torch.Tensor, group_size: int, valid: torch.Tensor | None = None) -> torch.Tensor:
    """(num_prompts,) bool: groups with no learning signal — their valid rewards all equal (within FLAT_EPS),
    or fewer than two valid rows. The one definition every caller uses."""
    r, v = _view(rewards, group_size, valid)
    if v is None:
        return (r.max(dim=1).values - r.min(dim=1).values) < FLAT_EPS
    ok = v.bool()
    hi = torch.where(ok, r, torch.full_like(r, -float("inf"))).max(1).values
    lo = torch.where(ok, r, torch.full_like(r, float("inf"))).min(1).values
    return (ok.sum(1) < 2) | ((hi - lo) < FLAT_EPS)


def _group_mean(r: torch.Tensor, v: torch.Tensor | None) -> torch.Tensor:
    return r.mean(dim=1, keepdim=True) if v is None else (r * v).sum(1, keepdim=True) / v.sum(1, keepdim=True).clamp(min=1)


def _only_signal(adv: torch.Tensor, v: torch.Tensor | None, flat: torch.Tensor | None = None) -> torch.Tensor:
    """(num_prompts, G) -> (B,): invalid rows, and groups with fewer than two valid rows (or ``flat``), set to 0."""
    if v is not None:
        adv = adv * v * (v.sum(1, keepdim=True) >= 2)
    return (adv if flat is None else adv.masked_fill(flat.unsqueeze(1), 0.0)).reshape(-1)


def adv_grpo(rewards: torch.Tensor, group_size: int, valid: torch.Tensor | None = None) -> torch.Tensor:
    """GRPO: (r - group mean) / (group std + eps), Bessel std; 0 for a flat group (its float round-off,
    e.g. 0.1 - mean ~ 1e-9, divided by eps would otherwise be a spurious advantage ~ 1e-2)."""
    r, v = _view(rewards, group_size, valid)
    centred = r - _group_mean(r, v)
    if v is None:
        std = r.std(dim=1, keepdim=True)
    else:
        std = (((centred * v) ** 2).sum(1, keepdim=True) / (v.sum(1, keepdim=True) - 1).clamp(min=1)).sqrt()
    return _only_signal(centred / (std + EPS), v, flat_groups(rewards, group_size, valid))


def adv_grpo_no_std(rewards: torch.Tensor, group_size: int, valid: torch.Tensor | None = None) -> torch.Tensor:
    """Dr. GRPO: group-mean baseline only (no std normalisation, which over-weights easy/hard groups)."""
    r, v = _view(rewards, group_size, valid)
    return _only_signal(r - _group_mean(r, v), v)


def adv_grpo_batch_std(rewards: torch.Tensor, group_size: int, valid: torch.Tensor | None = None) -> torch.Tensor:
    """Group-mean baseline scaled by the std of the whole batch's valid rewards (no per-group difficulty bias)."""
    centred = adv_grpo_no_std(rewards, group_size, valid)
    ok = rewards if valid is None else rewards[valid.bool()]
    return centred / (ok.std() + EPS) if ok.numel() > 1 else centred


def adv_rloo(rewards: torch.Tensor, group_size: int, valid: torch.Tensor | None = None) -> torch.Tensor:
    """RLOO: each sample's baseline is the mean of the OTHER valid rewards of its group."""
    r, v = _view(rewards, group_size, valid)
    if v is None:
        loo = (r.sum(dim=1, keepdim=True) - r) / (group_size - 1)
    else:
        loo = ((r * v).sum(1, keepdim=True) - r) / (v.sum(1, keepdim=True) - 1).clamp(min=1)
    return _only_signal(r - loo, v)


Advantage = Callable[[torch.Tensor, int, "torch.Tensor | None"], torch.Tensor]
ADVANTAGES: dict[str, Advantage] = {
    "grpo": adv_grpo,
    "grpo_batch_std": adv_grpo_batch_std,
    "grpo_no_std": adv_grpo_no_std,
    "rloo": adv_rloo,
}

# --------------------------------------------------------------------------------------------
# PPO pieces: per-token rewards, GAE and the clipped value loss. Shapes (B, T) with completion mask.


def final_token_rewards(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Place each sequence's scalar reward (B,) on its last completion token: (B, T)."""
    last = (mask.sum(-1).long() - 1).clamp(min=0)
    out = torch.zeros_like(mask, dtype=rewards.dtype)
    out[torch.arange(mask.shape[0]), last] = rewards
    return out * mask


def gae(token_rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
        ) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over completion tokens -> (advantages, returns), both (B, T).

    delta_t = r_t + gamma * V_{t+1} - V_t (V after the last token is 0), A_t = delta_t + gamma*lam*A_{t+1}.
    """
    T = token_rewards.shape[1]
    values = values * mask
    adv = torch.zeros_like(token_rewards)
    next_adv = torch.zeros_like(token_rewards[:, 0])
    for t in reversed(range(T)):  # T = completion length: a short Python loop, not per sample
        next_v = values[:, t + 1] if t + 1 < T else torch.zeros_like(next_adv)
        delta = token_rewards[:, t] + gamma * next_v - values[:, t]
        next_adv = (delta + gamma * lam * next_adv) * mask[:, t]
        adv[:, t] = next_adv
    return adv, (adv + values) * mask


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, total: torch.Tensor, total_sq: torch.Tensor,
                  count: torch.Tensor) -> torch.Tensor:
    """(x - mean) / std over masked entries, from sums the caller gathered (across ranks if any)."""
    mean = total / count.clamp(min=1)
    var = (total_sq / count.clamp(min=1) - mean**2).clamp(min=0)
    return (x - mean) * torch.rsqrt(var + 1e-8) * mask


def value_loss_clipped(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor,
                       clip: float | None) -> torch.Tensor:
    """Per-token 0.5 * max((V - R)^2, (V_clipped - R)^2), V_clipped within `clip` of the old value."""
    unclipped = (values - returns) ** 2
    if clip is None:
        return 0.5 * unclipped
    v_clip = old_values + torch.clamp(values - old_values, -clip, clip)
    return 0.5 * torch.maximum(unclipped, (v_clip - returns) ** 2)

# --------------------------------------------------------------------------------------------
# Policy losses: per-token loss (B, T) and the per-token "clipped" indicator (B, T)


def loss_clipped(
    logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, clip_low: float, clip_high: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO-style clipped surrogate, asymmetric bounds allowed (DAPO clip-higher).
    ``adv`` is per sequence (B,) (GRPO family) or per token (B, T) (GAE)."""
    ratio = torch.exp(logp - old_logp)  # (B, T)
    a = adv.unsqueeze(-1) if adv.dim() == 1 else adv  # (B, 1) or (B, T)
    unclipped = ratio * a
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * a
    loss = -torch.minimum(unclipped, clipped)
    return loss, (clipped < unclipped).float()


POLICY_LOSSES = {"clipped": loss_clipped}

# --------------------------------------------------------------------------------------------
# Per-datum losses of the training primitives (Tinker's `forward_backward(data, loss_fn)`): one
# sequence's per-token log-probs of its targets (N,) and its loss inputs (each (N,)) -> the per-token
# loss (N,). The caller SUMS it over tokens and datums: these losses carry their own normalisation in
# `weights` / `advantages` (e.g. A_i / n_tokens reproduces GRPO's token-mean), as Tinker defines them.


def datum_cross_entropy(logp: torch.Tensor, inputs: dict[str, torch.Tensor], cfg: dict[str, float]) -> torch.Tensor:
    """Weighted negative log-likelihood: -w_t log p(target_t)."""
    return -inputs["weights"] * logp


def datum_importance_sampling(logp: torch.Tensor, inputs: dict[str, torch.Tensor], cfg: dict[str, float]
                              ) -> torch.Tensor:
    """REINFORCE with an importance weight for off-policy samples: -(p / q) A per token, q the sampling
    policy's probability (``logprobs``). At p = q its gradient is -A grad log p: the policy gradient."""
    return -torch.exp(logp - inputs["logprobs"]) * inputs["advantages"]


def datum_ppo(logp: torch.Tensor, inputs: dict[str, torch.Tensor], cfg: dict[str, float]) -> torch.Tensor:
    """PPO's clipped surrogate per token, the ratio clipped to [clip_low_threshold, clip_high_threshold]
    (``loss_clipped`` with eps_low = 1 - low, eps_high = high - 1)."""
    loss, _ = loss_clipped(logp[None], inputs["logprobs"][None], inputs["advantages"][None],
                           1.0 - cfg["clip_low_threshold"], cfg["clip_high_threshold"] - 1.0)
    return loss[0]


DATUM_LOSSES: dict[str, Callable[[torch.Tensor, dict[str, torch.Tensor], dict[str, float]], torch.Tensor]] = {
    "cross_entropy": datum_cross_entropy,
    "importance_sampling": datum_importance_sampling,
    "ppo": datum_ppo,
}
# what each loss reads from a datum besides target_tokens (a missing `weights` is all ones), and its
# config keys with their defaults (Tinker's names; anything else in the request's config is refused)
DATUM_LOSS_INPUTS: dict[str, tuple[str, ...]] = {"cross_entropy": ("weights",),
                                                 "importance_sampling": ("logprobs", "advantages"),
                                                 "ppo": ("logprobs", "advantages")}
DATUM_LOSS_CONFIG: dict[str, dict[str, float]] = {"cross_entropy": {}, "importance_sampling": {},
                                                  "ppo": {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}}

# --------------------------------------------------------------------------------------------
# KL(policy || reference) estimators per token, from log-probs of the sampled tokens (Schulman 2020)


# What each gives as a LOSS term (differentiated through the sampled tokens' log-probs, x ~ pi; checked
# exactly on a small categorical in tests/test_algos.py): k1's gradient is zero in expectation (pure noise,
# so the spec refuses it in the loss: use it in the reward); k2's is the reverse KL's, grad KL(pi || ref);
# k3's is the forward KL's, grad KL(ref || pi) (Tang & Munos 2025), though as a VALUE k3 is an unbiased,
# non-negative estimate of KL(pi || ref). In the reward, k1 summed over a sequence gives REINFORCE the
# reverse KL's gradient.


def kl_k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """log(pi / ref)."""
    return logp - ref_logp


def kl_k2(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """0.5 log(pi / ref)^2."""
    return 0.5 * (logp - ref_logp) ** 2


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """ref / pi - 1 - log(ref / pi)."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1.0


KL_ESTIMATORS = {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3}

# --------------------------------------------------------------------------------------------
# Preference losses: summed sequence log-probs (B,) of chosen/rejected under policy and reference
# -> per-pair loss (B,) and the implicit reward margin (B,) (for metrics).


def pref_dpo_sigmoid(pi_c, pi_r, ref_c, ref_r, beta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """DPO (Rafailov 2023): -log sigmoid(beta * ((pi_c - ref_c) - (pi_r - ref_r)))."""
    margin = (pi_c - ref_c) - (pi_r - ref_r)
    return -torch.nn.functional.logsigmoid(beta * margin), beta * margin.detach()


def pref_ipo(pi_c, pi_r, ref_c, ref_r, beta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """IPO (Azar 2023): (margin - 1/(2 beta))^2, bounded pressure once pairs are separated."""
    margin = (pi_c - ref_c) - (pi_r - ref_r)
    return (margin - 1.0 / (2.0 * beta)) ** 2, beta * margin.detach()


PREFERENCE_LOSSES = {"sigmoid": pref_dpo_sigmoid, "ipo": pref_ipo}


def best_worst_pairs(rewards: torch.Tensor, group_size: int, valid: torch.Tensor | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Online DPO pairs: per group, indices (into the flat batch) of the best and worst completion,
    only for groups whose rewards differ. Ties go to the earliest sample (deterministic). Rows flagged
    invalid (infrastructure failures) are never picked."""
    r = rewards.view(-1, group_size)
    v = torch.ones_like(r, dtype=torch.bool) if valid is None else valid.view(-1, group_size)
    hi = torch.where(v, r, torch.full_like(r, -float("inf")))
    lo = torch.where(v, r, torch.full_like(r, float("inf")))
    keep = ~flat_groups(rewards, group_size, valid)
    base = torch.arange(r.shape[0]) * group_size
    best, worst = base + hi.argmax(dim=1), base + lo.argmin(dim=1)
    return best[keep], worst[keep]

# --------------------------------------------------------------------------------------------
# Per-token masks and bonuses


def overlong_filter(mask: torch.Tensor, truncated: torch.Tensor) -> torch.Tensor:
    """DAPO overlong filtering: truncated completions (no EOS) get no loss at all."""
    return mask * (~truncated).unsqueeze(-1).to(mask.dtype)


def upcast(x: torch.Tensor) -> torch.Tensor:
    """At least float32 for softmax arithmetic (bf16/fp16 logits), float64 kept as is (exactness checks)."""
    return x if x.dtype == torch.float64 else x.float()


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Per-token entropy (B, T) of the softmax over logits (B, T, V)."""
    lp = torch.log_softmax(upcast(logits), -1)
    return -(lp.exp() * lp).sum(-1)

# --------------------------------------------------------------------------------------------
# Aggregation of a per-token matrix (B, T) under a completion mask (B, T) into a scalar.
# n_tokens / n_seqs / max_len describe the WHOLE batch (see module docstring).


def agg_token_mean(x, mask, n_tokens: int, n_seqs: int, max_len: int) -> torch.Tensor:
    return (x * mask).sum() / max(n_tokens, 1)


def agg_seq_mean_token_mean(x, mask, n_tokens: int, n_seqs: int, max_len: int) -> torch.Tensor:
    per_seq = (x * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    return per_seq.sum() / max(n_seqs, 1)


def agg_seq_mean_token_sum_norm(x, mask, n_tokens: int, n_seqs: int, max_len: int) -> torch.Tensor:
    """Dr. GRPO: token sums divided by a constant — sequences × the generation budget (``max_len``, the
    same on every step and rank) — so long answers are not favoured and the step size never follows the
    longest sample."""
    return (x * mask).sum() / max(n_seqs * max_len, 1)


LOSS_AGG = {
    "token-mean": agg_token_mean,
    "seq-mean-token-mean": agg_seq_mean_token_mean,
    "seq-mean-token-sum-norm": agg_seq_mean_token_sum_norm,
}

# --------------------------------------------------------------------------------------------


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log p(target) per position: logits (B, T, V), targets (B, T) -> (B, T), memory-light."""
    logits = upcast(logits)
    return torch.gather(logits, -1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, -1)
