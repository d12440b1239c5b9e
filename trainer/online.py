"""The online-RL step (GRPO family and PPO): sample groups, score them, estimate advantages, update.

Sampling is shared with online DPO (:func:`sample_groups`). Zero-variance groups (all G rewards
equal, so no signal for a group baseline) are kept, dropped from the update, or replaced by fresh
prompts for up to ``resample_rounds`` extra rollouts; the compute they cost is reported either way.
Under data parallelism each rank samples its slice of the prompts; rewards are gathered so every
rank sees the global batch for advantages and metrics (see trainer.distributed).
"""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from . import algos
from .batch import Forward, chunks, concat, forward, select
from .rollout import Rollout, SamplingParams, logprob_mismatch, tis_weights

if TYPE_CHECKING:
    from .loop import Ctx


@dataclass
class Groups:
    """This rank's sampled groups after zero-variance handling, flattened (N = groups × G rows)."""
    ro: Rollout
    rewards: torch.Tensor           # (N,) local
    rewards_global: torch.Tensor    # (N × world,) in global row order
    rows: slice                     # this rank's rows inside rewards_global
    dead: torch.Tensor              # (N / G,) bool: still zero-variance after resampling
    metrics: dict[str, Any] = field(default_factory=dict)


SAMPLE_GROUPS = 2  # whole groups kept per step for people to read (stored rollouts)


def _score(ctx: "Ctx", ro: Rollout, samples: list[dict]) -> list[dict]:
    """Per-group records: rollout rows, rewards and per-verifier scores/statuses."""
    G = ctx.spec.rollout.group_size
    sc = ctx.scorer(ro.texts, [s["reference"] for s in samples for _ in range(G)])
    ctx.health = sc.metrics()  # calls, rates, latency p50/p95 per verifier (job metrics, Prometheus)
    out = []
    for g in range(len(samples)):
        r = range(g * G, (g + 1) * G)
        out.append({"ro": select(ro, list(r)), "rewards": [sc.rewards[i] for i in r],
                    "correct": [sc.correct[i] for i in r],
                    "scores": {k: [v[i] for i in r] for k, v in sc.per_verifier.items()},
                    "status": {k: [sc.verdicts[k][i].status.value for i in r] for k in sc.verdicts},
                    "verdicts": {k: [sc.verdicts[k][i].to_dict() for i in r] for k in sc.verdicts}})
    return out


def sample_groups(ctx: "Ctx") -> Groups:
    spec, dist, G = ctx.spec, ctx.dist, ctx.spec.rollout.group_size
    ac = spec.algo
    sampling = SamplingParams(spec.rollout.max_new_tokens, spec.rollout.temperature, spec.rollout.top_p)
    prompts = ctx.stream.next_batch(spec.train.prompts_per_step)  # same on every rank
    mine = dist.shard(len(prompts))
    t_roll = t_score = 0.0

    def run(samples: list[dict]) -> list[dict]:
        nonlocal t_roll, t_score
        t0 = time.perf_counter()
        ro = ctx.engine.generate([s["prompt"] for s in samples], G, sampling)
        t1 = time.perf_counter()
        recs = _score(ctx, ro, samples)
        t_roll, t_score = t_roll + t1 - t0, t_score + time.perf_counter() - t1
        return recs

    groups = run(prompts[mine])
    ctx.samples = [{"prompt": s["prompt"], "reference": s["reference"], "completions": [
        {"text": g["ro"].texts[j], "reward": g["rewards"][j], "verdicts": {n: v[j] for n, v in g["verdicts"].items()}}
        for j in range(G)]} for s, g in zip(prompts[mine][:SAMPLE_GROUPS], groups)]
    tokens_total = sum(g["ro"].num_tokens for g in groups)
    is_dead = lambda g: max(g["rewards"]) - min(g["rewards"]) < 1e-8  # noqa: E731
    dead_tokens = sum(g["ro"].num_tokens for g in groups if is_dead(g))
    first_dead = sum(dist.gather(sum(map(is_dead, groups))))
    resampled = 0
    for _ in range(ac.resample_rounds if ac.zero_variance == "resample" else 0):
        dead_by_rank = dist.gather([i for i, g in enumerate(groups) if is_dead(g)])
        n_dead = sum(map(len, dead_by_rank))
        if n_dead == 0:
            break
        fresh = ctx.stream.next_batch(n_dead)  # every rank draws the same prompts, takes its own
        start = sum(map(len, dead_by_rank[: dist.rank]))
        slots = dead_by_rank[dist.rank]
        if slots:
            for i, g in zip(slots, run(fresh[start : start + len(slots)])):
                groups[i] = g
                tokens_total += g["ro"].num_tokens
                dead_tokens += g["ro"].num_tokens if is_dead(g) else 0
        resampled += n_dead

    ro = concat([g["ro"] for g in groups], ctx.tok.pad_token_id)
    rewards = torch.tensor([r for g in groups for r in g["rewards"]], dtype=torch.float32)
    local = {"rewards": rewards.tolist(), "correct": [c for g in groups for c in g["correct"]],
             "scores": {k: [x for g in groups for x in g["scores"][k]] for k in groups[0]["scores"]},
             "status": {k: Counter(x for g in groups for x in g["status"][k]) for k in groups[0]["status"]},
             "len": ro.completion_mask.sum(1).tolist(), "trunc": ro.truncated.tolist(),
             "tokens": tokens_total, "dead_tokens": dead_tokens}
    every = dist.gather(local)
    rewards_global = torch.tensor([r for e in every for r in e["rewards"]])
    n = len(rewards_global)
    lengths = torch.tensor([x for e in every for x in e["len"]], dtype=torch.float32)
    dead_final = algos.zero_variance_groups(rewards_global, G)
    tokens = sum(e["tokens"] for e in every)
    m: dict[str, Any] = {
        "reward/mean": rewards_global.mean().item(),
        "reward/std": rewards_global.std().item() if n > 1 else 0.0,
        "accuracy": sum(c for e in every for c in e["correct"]) / n,
        "zero_std_group_frac": first_dead / spec.train.prompts_per_step,
        "zero_std_group_frac_final": dead_final.float().mean().item(),
        "dead_group_token_frac": sum(e["dead_tokens"] for e in every) / max(tokens, 1),
        "resampled_groups": resampled,
        "completion/len_mean": lengths.mean().item(), "completion/len_max": lengths.max().item(),
        "completion/truncated_frac": sum(t for e in every for t in e["trunc"]) / n,
        "rollout_tokens": tokens, "time/rollout_s": t_roll, "time/score_s": t_score,
        **ctx.health,
    }
    for name in local["scores"]:
        scores = torch.tensor([x for e in every for x in e["scores"][name]], dtype=torch.float32)
        m[f"verifier/{name}/mean"] = scores.mean().item()
        m[f"verifier/{name}/std"] = scores.std().item() if n > 1 else 0.0
        for status, count in sum((e["status"][name] for e in every), Counter()).items():
            m[f"verifier/{name}/{status}_frac"] = count / n
    rows = slice(dist.rank * len(rewards), (dist.rank + 1) * len(rewards))
    return Groups(ro, rewards, rewards_global, rows, dead_final.view(dist.world, -1)[dist.rank], m)


@torch.no_grad()
def _no_grad_forward(ctx: "Ctx", model, ro: Rollout, hidden: bool) -> Forward:
    """Forward in micro-batches without graph (old policy / reference), concatenated."""
    parts = [forward(model, select(ro, i), ctx.spec.rollout.temperature, hidden=hidden)
             for i in chunks(torch.arange(len(ro.texts)), ctx.spec.algo.micro_batch_size)]
    cat = lambda xs: torch.cat(xs) if xs[0] is not None else None  # noqa: E731
    return Forward(cat([p.logp for p in parts]), cat([p.entropy for p in parts]), cat([p.hidden for p in parts]))


def step(ctx: "Ctx") -> dict[str, Any]:
    spec, ac, dist, est = ctx.spec, ctx.spec.algo, ctx.dist, ctx.estimator
    t0 = time.perf_counter()
    # ------------------------------------------------------------------ rollout + score
    grp = sample_groups(ctx)
    ro = grp.ro
    t1 = time.perf_counter()
    # ------------------------------------------------------------------ advantages
    mask = ro.completion_mask.float().to(dist.device)
    if ac.overlong_mask:
        mask = algos.overlong_filter(mask, ro.truncated.to(dist.device))
    if ac.zero_variance == "drop":
        mask = mask * (~grp.dead).repeat_interleave(spec.rollout.group_size).unsqueeze(-1).to(mask)
    N = len(ro.texts)
    multi_pass = ac.ppo_epochs > 1 or (ac.minibatch_size or N * dist.world) < N * dist.world
    with torch.no_grad(), ctx.autocast():
        old = _no_grad_forward(ctx, ctx.policy, ro, est.needs_hidden) if multi_pass or est.needs_old else None
        ref_logp = _no_grad_forward(ctx, ctx.ref, ro, False).logp if ctx.ref is not None else None
        kl_tok = algos.kl_k1(old.logp, ref_logp) if old is not None and ref_logp is not None else None
        adv = est.prepare(ro, grp.rewards_global, grp.rows, mask, old, kl_tok, dist).to(dist.device)
    # ------------------------------------------------------------------ update
    ctx.policy.train()
    policy_loss, agg = algos.POLICY_LOSSES[ac.policy_loss], algos.LOSS_AGG[ac.loss_agg]
    kl_fn = algos.KL_ESTIMATORS[ac.kl_estimator]
    T = mask.shape[1]

    def micro(idx: torch.Tensor, counts: tuple) -> tuple[torch.Tensor, dict[str, float]]:
        m = mask[idx]
        part = select(ro, idx)
        fwd = forward(ctx.policy, part, spec.rollout.temperature, hidden=est.needs_hidden,
                      entropy_grad=ac.entropy_coef > 0)
        old_lp = old.logp[idx] if old is not None else fwd.logp.detach()
        pg, clipped = policy_loss(fwd.logp, old_lp, adv[idx], ac.clip_eps_low, ac.clip_eps_high)
        n_tok = max(float(m.sum()), 1.0)
        st: dict[str, float] = {}
        engine_lp = ro.logprobs[idx].to(old_lp.device) if ro.logprobs is not None else None
        if engine_lp is not None:  # engine vs trainer log-probs of the same policy (pre-update)
            st.update(logprob_mismatch(engine_lp, old_lp, m))
            if ac.tis_cap is not None:  # sampled from a slightly different distribution: reweight
                w = tis_weights(old_lp, engine_lp, ac.tis_cap)
                pg = pg * w
                st.update({"tis/weight_mean": float((w * m).sum()) / n_tok,
                           "tis/capped_frac": float(((w >= ac.tis_cap) * m).sum()) / n_tok})
        loss = agg(pg, m, *counts) - ac.entropy_coef * agg(fwd.entropy, m, *counts)
        value_loss, est_st = est.loss(fwd, part, idx, m, counts)
        st.update(est_st)
        loss = loss + value_loss
        st.update({"clip_frac": float((clipped * m).sum()) / n_tok,
                   "entropy": float((fwd.entropy.detach() * m).sum()) / n_tok})
        if ref_logp is not None:
            kl = kl_fn(fwd.logp, ref_logp[idx])
            loss = loss + ac.kl_coef * agg(kl, m, *counts)
            st["kl"] = float((kl.detach() * m).sum()) / n_tok
        return loss, st

    def counts(idx: torch.Tensor) -> tuple:
        c = dist.all_sum(torch.tensor([float(mask[idx].sum()), float(len(idx))]))
        return int(c[0]), int(c[1]), T

    # Rows whose every loss term is identically zero — no tokens left in the mask, or a zero-variance
    # group (advantage 0) when nothing else (entropy, KL, value loss) is in the loss — count in the
    # normalisers but skip the forward/backward: same gradient, less compute.
    no_other_terms = not est.has_loss and ac.entropy_coef == 0 and ref_logp is None
    dead_rows = grp.dead.repeat_interleave(spec.rollout.group_size).to(mask.device)
    inert = ((mask.sum(1) == 0) | (dead_rows & no_other_terms)).cpu()
    n_global = N * dist.world
    n_mb = -(-n_global // (ac.minibatch_size or n_global))  # same count on every rank
    stats: list[dict[str, float]] = []
    for _epoch in range(ac.ppo_epochs):
        perm = torch.randperm(N) if multi_pass else torch.arange(N)
        for mb in perm.tensor_split(n_mb):
            stats += ctx.optimize(mb, counts, micro, inert)
    ctx.sched.step()
    t2 = time.perf_counter()
    # ------------------------------------------------------------------ metrics
    m = dict(grp.metrics)
    adv_seq = adv if adv.dim() == 1 else (adv * mask).sum(1) / mask.sum(1).clamp(min=1)
    m.update({"adv/mean": adv_seq.mean().item(), "adv/std": adv_seq.std().item() if N > 1 else 0.0,
              "adv/max_abs": adv.abs().max().item(), "update/skipped_row_frac": inert.float().mean().item(),
              "tokens_per_s": m["rollout_tokens"] / max(t2 - t0, 1e-9),
              "time/update_s": t2 - t1, "time/step_s": t2 - t0})
    m.update(mean_stats(stats))
    return m


def mean_stats(stats: list[dict[str, float]]) -> dict[str, float]:
    keys = {k for s in stats for k in s}
    return {k: sum(s[k] for s in stats if k in s) / sum(1 for s in stats if k in s) for k in sorted(keys)}
