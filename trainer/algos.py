"""Advantage estimators, policy losses, KL estimators and loss aggregation: pure tensor functions.

One dict per signature family; callers look a function up by the name in the job spec and call it,
they never branch on the name. Shapes: B = sequences, T = completion tokens, G = group size.

Aggregations return a *sum-normalised* scalar: they divide by a count of the WHOLE batch that the
caller passes in, so summing the result over micro-batches equals the full-batch value exactly
(splitting a batch into micro-batches leaves the loss and its gradient unchanged).
"""
from __future__ import annotations

import math
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
    return r.mean(dim=1, keepdim=True) if v is None else (r * v).sum(1, keepdim=True) / v.sum(1,
                                                                                              keepdim=True).clamp(min=1)


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

def adv_distill(adv: torch.Tensor, logp: torch.Tensor, teacher_logp: torch.Tensor, mask: torch.Tensor,
                coef: float, verifier_weight: float) -> torch.Tensor:
    """On-policy distillation's per-token advantage (B, T): coef * (log pi_teacher - log pi_student) of each
    sampled token — minus the reverse KL's sample, so the policy gradient descends KL(student || teacher) —
    plus verifier_weight times the estimator's advantage (B,) or (B, T)."""
    base = adv.unsqueeze(-1) if adv.dim() == 1 else adv
    return (coef * (teacher_logp - logp) + verifier_weight * base) * mask


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
# Policy losses: (logp, old_logp, adv, clip_low, clip_high, mask) -> per-token loss (B, T) and the per-token
# "clipped" indicator (B, T). logp / old_logp (B, T): the trained and the sampling (or proximal) policy's
# log-probs of the sampled tokens; adv (B,) per sequence (GRPO family) or (B, T) per token (GAE); mask
# (B, T) the completion tokens that carry loss. At one pass per batch (ratio 1) every loss here has
# REINFORCE's gradient -A grad log pi; they differ once the ratio leaves 1 (multi-pass, async, an engine
# whose log-probs are not the trainer's). A sequence-level loss puts its one value on every token of the
# sequence: with seq-mean-token-mean (which the spec requires for it) that is the papers' mean over sequences.


def _per_token(adv: torch.Tensor) -> torch.Tensor:
    return adv.unsqueeze(-1) if adv.dim() == 1 else adv  # (B, 1) or (B, T)


def _per_sequence(adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B,): a sequence's advantage (per-token advantages averaged over its loss tokens)."""
    return adv if adv.dim() == 1 else (adv * mask).sum(-1) / mask.sum(-1).clamp(min=1)


def loss_clipped(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, clip_low: float, clip_high: float,
                 mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped surrogate (Schulman 2017), asymmetric bounds allowed (DAPO's clip-higher, Yu 2025):
    -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A) per token, r = pi / pi_old."""
    ratio = torch.exp(logp - old_logp)  # (B, T)
    a = _per_token(adv)
    unclipped = ratio * a
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * a
    loss = -torch.minimum(unclipped, clipped)
    return loss, (clipped < unclipped).float()


def loss_cispo(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, clip_low: float, clip_high: float,
               mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """CISPO (MiniMax-M1, Chen 2025): -sg(clip(r, 1 - eps_low, 1 + eps_high)) A log pi per token. The clipped
    ratio is a detached weight, so no token's gradient is dropped (PPO's clip zeroes it); "clipped" marks
    the tokens whose weight was clipped."""
    ratio = torch.exp(logp - old_logp).detach()
    weight = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    return -weight * _per_token(adv) * logp, (weight != ratio).float()


def loss_gspo(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, clip_low: float, clip_high: float,
              mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """GSPO (Qwen, Zheng 2025), sequence level: s_i = exp(mean_t over the mask of log(pi / pi_old)), the
    length-normalised sequence ratio, and -min(s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i) for the
    whole sequence (on each of its tokens). Its clip ranges are small (the paper: 3e-4 / 4e-4)."""
    n = mask.sum(-1).clamp(min=1)
    s = torch.exp(((logp - old_logp) * mask).sum(-1) / n)  # (B,)
    a = _per_sequence(adv, mask)
    unclipped, clipped = s * a, torch.clamp(s, 1.0 - clip_low, 1.0 + clip_high) * a
    loss = -torch.minimum(unclipped, clipped)
    return loss.unsqueeze(-1).expand_as(logp), (clipped < unclipped).float().unsqueeze(-1).expand_as(logp)


def loss_gspo_token(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, clip_low: float,
                    clip_high: float, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """GSPO-token (Zheng 2025; what Tinker serves): each token's ratio s_i,t = sg(s_i) pi(y_t) / sg(pi(y_t))
    carries the sequence ratio's value and its own token's gradient, then PPO's clipped surrogate per token:
    per-token advantages work, and with sequence advantages and seq-mean-token-mean the gradient is GSPO's."""
    n = mask.sum(-1, keepdim=True).clamp(min=1)
    log_s = (((logp - old_logp) * mask).sum(-1, keepdim=True) / n).detach()
    ratio = torch.exp(log_s + logp - logp.detach())
    a = _per_token(adv)
    unclipped, clipped = ratio * a, torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * a
    return -torch.minimum(unclipped, clipped), (clipped < unclipped).float()


def loss_gmpo(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, clip_low: float, clip_high: float,
              mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """GMPO (Zhao 2025): the geometric mean of token ratios, each clipped in log space to
    [log(1 - eps_low), log(1 + eps_high)] on the side the advantage's sign makes binding:
    rho_i = exp(mean_t sgn(A) min(sgn(A) log r_t, sgn(A) clip(log r_t))), loss -A_i rho_i per sequence (the
    paper's (e^-0.4, e^0.4) is eps_low 0.33, eps_high 0.49)."""
    a = _per_sequence(adv, mask)
    sign = torch.sign(a).unsqueeze(-1)
    log_r = logp - old_logp
    log_c = torch.clamp(log_r, math.log(max(1.0 - clip_low, 1e-12)), math.log1p(clip_high))
    kept = sign * torch.minimum(sign * log_r, sign * log_c)
    rho = torch.exp((kept * mask).sum(-1) / mask.sum(-1).clamp(min=1))
    return (-a * rho).unsqueeze(-1).expand_as(logp), (log_c != log_r).float()


POLICY_LOSSES = {"clipped": loss_clipped, "cispo": loss_cispo, "gspo": loss_gspo, "gspo_token": loss_gspo_token,
                 "gmpo": loss_gmpo}  # gspo and gmpo: one value per sequence (trainer.config.SEQUENCE_LOSSES)

# --------------------------------------------------------------------------------------------
# Sampler - trainer mismatch corrections: (log_ratio (B, T) = log p_trainer - log p_engine of each sampled
# token, mask (B, T), cap, low) -> per-token weights (B, T), no gradient. Truncation bounds the variance
# (Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy RL training"); masking drops
# what is too far off instead (MIS; the "icepop" bounds [low, cap]); sequence level uses the whole
# completion's ratio exp(sum_t log_ratio), the importance weight of the sequence.


def is_token_truncate(log_ratio, mask, cap: float, low: float) -> torch.Tensor:
    """min(r_t, cap) per token (TIS)."""
    return log_ratio.exp().clamp(max=cap)


def is_token_mask(log_ratio, mask, cap: float, low: float) -> torch.Tensor:
    """r_t where low <= r_t <= cap, else 0: tokens too far off carry no loss (MIS / icepop)."""
    r = log_ratio.exp()
    return r * ((r >= low) & (r <= cap))


def _sequence_ratio(log_ratio, mask) -> torch.Tensor:
    return (log_ratio * mask).sum(-1, keepdim=True).exp().expand_as(log_ratio)


def is_sequence_truncate(log_ratio, mask, cap: float, low: float) -> torch.Tensor:
    """min(prod_t r_t, cap) on every token of the sequence."""
    return _sequence_ratio(log_ratio, mask).clamp(max=cap)


def is_sequence_mask(log_ratio, mask, cap: float, low: float) -> torch.Tensor:
    """prod_t r_t where it lies in [low, cap], else 0 for the whole sequence."""
    r = _sequence_ratio(log_ratio, mask)
    return r * ((r >= low) & (r <= cap))


IS_CORRECTIONS = {"token_truncate": is_token_truncate, "token_mask": is_token_mask,
                  "sequence_truncate": is_sequence_truncate, "sequence_mask": is_sequence_mask}

# --------------------------------------------------------------------------------------------
# DAPO's soft overlong punishment (Yu 2025): a length penalty in tokens, added to the reward.


def overlong_penalty(lengths: torch.Tensor, max_len: int, buffer: int) -> torch.Tensor:
    """(B,) 0 up to max_len - buffer tokens, then a linear ramp to -1 at max_len (a truncated completion)."""
    return ((max_len - buffer - lengths.float()) / buffer).clamp(min=-1.0, max=0.0)


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
                           1.0 - cfg["clip_low_threshold"], cfg["clip_high_threshold"] - 1.0,
                           torch.ones_like(logp[None]))
    return loss[0]


def datum_cispo(logp: torch.Tensor, inputs: dict[str, torch.Tensor], cfg: dict[str, float]) -> torch.Tensor:
    """CISPO as Tinker defines it: -sg(clip(p / q, clip_low_threshold, clip_high_threshold)) log p A."""
    ratio = torch.exp(logp - inputs["logprobs"]).detach()
    return -torch.clamp(ratio, cfg["clip_low_threshold"], cfg["clip_high_threshold"]) * logp * inputs["advantages"]


def datum_dro(logp: torch.Tensor, inputs: dict[str, torch.Tensor], cfg: dict[str, float]) -> torch.Tensor:
    """DRO (Richemond 2024; Kimi 2025) as Tinker defines it: -(log p A - beta/2 (log p - log q)^2): a quadratic
    pull toward the sampler q keeps an off-policy update close (the soft advantages are the client's)."""
    return -(logp * inputs["advantages"] - 0.5 * cfg["beta"] * (logp - inputs["logprobs"]) ** 2)


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
