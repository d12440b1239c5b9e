"""The preference-pairs step (DPO, IPO): a batch of (chosen, rejected) completions, one update.

Pairs come from one of two sources with the same output:
- online (``dpo.pairs: online``): sample a group per prompt with the current policy, score it with
  the job's verifiers, pair the best with the worst completion (groups with all-equal rewards give
  no pair; ``algo.zero_variance: resample`` refills them) — on-policy data, DPO's cure for drift;
- offline (``dpo.pairs: file.jsonl``): fixed rows {prompt, chosen, rejected}, streamed in a resumable
  order like prompts.
The loss compares summed completion log-probs under the policy and the frozen starting model.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from . import algos
from .batch import chunks, concat, encode, forward, select, width
from .context import Counts, Ctx, StepOutput, optimize
from .data import load_jsonl, validate_pair
from .diagnostics import merge
from .online import sample_groups


def load_pairs(path: str | Path) -> list[dict[str, Any]]:
    return load_jsonl(path, validate_pair, kind="preference pairs")


def online_pairs(ctx: Ctx):
    """(chosen, rejected) rollouts of this rank from best/worst of each scored group, metrics, samples."""
    grp = sample_groups(ctx)
    best, worst = algos.best_worst_pairs(grp.rewards, ctx.spec.rollout.group_size, grp.valid)
    gap = (grp.rewards[best] - grp.rewards[worst]).mean().item() if len(best) else 0.0
    return select(grp.ro, best), select(grp.ro, worst), {**grp.metrics, "pairs/reward_gap": gap}, grp.samples


def offline_pairs(ctx: Ctx):
    rows = ctx.stream.next_batch(ctx.spec.train.prompts_per_step)[ctx.dist.shard(ctx.spec.train.prompts_per_step)]
    prompts = [r["prompt"] for r in rows]
    chosen = encode(ctx.tok, prompts, [r["chosen"] for r in rows])
    rejected = encode(ctx.tok, prompts, [r["rejected"] for r in rows])
    return chosen, rejected, {}, []


def step(ctx: Ctx) -> StepOutput:
    spec, dist = ctx.spec, ctx.dist
    cfg = spec.dpo
    t0 = time.perf_counter()
    # ------------------------------------------------------------------ pairs
    chosen, rejected, m, samples = (online_pairs if cfg.pairs == "online" else offline_pairs)(ctx)
    n = len(chosen.texts)
    both = concat([chosen, rejected], ctx.tok.pad_token_id) if n else chosen  # one forward for the pair
    t1 = time.perf_counter()
    # ------------------------------------------------------------------ reference log-probs
    temp = spec.rollout.temperature
    with torch.no_grad(), ctx.autocast():
        ref = [forward(ctx.ref, select(both, i), temp, entropy=False).logp
               for i in chunks(torch.arange(2 * n), spec.algo.micro_rows(width(both)))] if n else []
    ref_seq = (torch.cat(ref) * both.completion_mask.to(ref[0])).sum(-1) if n else torch.zeros(0)
    # ------------------------------------------------------------------ update
    ctx.policy.train()
    loss_fn = algos.PREFERENCE_LOSSES[cfg.loss]

    def micro(idx: torch.Tensor, counts: Counts) -> tuple[torch.Tensor, dict[str, float]]:
        rows = torch.cat([idx, idx + n])  # chosen rows, then their rejected partners
        part = select(both, rows)
        logp = forward(ctx.policy, part, temp).logp
        seq = (logp * part.completion_mask.to(logp)).sum(-1)
        k = len(idx)
        losses, margin = loss_fn(seq[:k], seq[k:], ref_seq[idx], ref_seq[idx + n], cfg.beta)
        return losses.sum() / max(counts.seqs, 1), {
            "pairs/margin": margin.mean().item(), "pairs/accuracy": (margin > 0).float().mean().item()}

    def counts(idx: torch.Tensor) -> Counts:  # a DPO loss is a mean over pairs: no token counts
        return Counts(seqs=int(dist.all_sum(torch.tensor([float(len(idx))]))[0]))

    # a micro-batch of pairs runs both rows of each: micro_batch_size counts pairs, micro_batch_tokens both rows
    stats = optimize(ctx, torch.arange(n), counts, micro, micro_rows=spec.algo.micro_rows(2 * width(both)))
    ctx.sched.step()
    t2 = time.perf_counter()
    m.update(merge(stats))
    m.update({"pairs/count": int(dist.all_sum(torch.tensor([float(n)]))[0]),
              "time/pairs_s": t1 - t0, "time/update_s": t2 - t1, "time/step_s": t2 - t0})
    if "rollout_tokens" in m:
        m["tokens_per_s"] = m["rollout_tokens"] / max(t2 - t0, 1e-9)
    m.setdefault("loss", 0.0)
    return StepOutput(m, samples)
