"""The online-RL step (GRPO family and PPO): sample groups, score them, estimate advantages, update.

Sampling is shared with online DPO (:func:`sample_groups`). Zero-variance groups (all G rewards
equal, so no signal for a group baseline) are kept, dropped from the update, or replaced by fresh
prompts for up to ``resample_rounds`` extra rollouts; the compute they cost is reported either way.
A completion whose verdict is an infrastructure failure (after one retry, trainer.scoring) is left out
of its group's statistics and of the loss: its reward says nothing about it.
Under data parallelism each rank samples its slice of the prompts; rewards are gathered so every
rank sees the global batch for advantages and metrics (see trainer.distributed).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from . import algos, episodes
from .batch import Forward, chunks, forward, width
from .context import Counts, Ctx, StepOutput, optimize
from .diagnostics import INERT_WHEN_SINGLE_PASS, merge, policy_stats, ratio_stats
from .engines import join, weights
from .rollout import Rollout, SamplingParams, concat, select, trim
from .scoring import Scores, health_metrics

SAMPLE_GROUPS = 2  # whole groups kept per step for people to read (stored rollouts)
ASYNC_TIS_CAP = 2.0  # rollouts from an older policy: importance weights capped here unless algo.tis_cap says
DETAIL_TOKENS = 1024  # per stored completion: token-level detail (pieces, log-probs) up to this many tokens


@dataclass
class Groups:
    """This rank's sampled groups after zero-variance handling, flattened (N = groups × G rows)."""
    ro: Rollout
    rewards: torch.Tensor           # (N,) local
    rewards_global: torch.Tensor    # (N × world,) in global row order
    valid_global: torch.Tensor      # (N × world,) bool: False where the reward is an infrastructure failure
    rows: slice                     # this rank's rows inside rewards_global
    dead: torch.Tensor              # (N / G,) bool: still zero-variance after resampling
    # (rows,) the completion (episode) each row of ``ro`` belongs to: one row each, except an episode whose
    # chat history was re-rendered (a fork: trainer.episodes), which trains on a row per sample
    row_episode: torch.Tensor | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    samples: list[dict[str, Any]] = field(default_factory=list)
    keep_rows: int = 0              # rows of the stored groups (the first rows)

    @property
    def valid(self) -> torch.Tensor:  # (N,) this rank's completions
        return self.valid_global[self.rows]

    def per_row(self, x: torch.Tensor) -> torch.Tensor:
        """A per-completion tensor (N, …) spread over ``ro``'s rows."""
        return x if self.row_episode is None else x[self.row_episode.to(x.device)]


@dataclass
class _Round:
    """One rollout + scoring pass over some prompts: per-group records and the scoring call."""
    groups: list[dict]
    scores: Scores
    rollout_s: float
    score_s: float
    episodes: list = field(default_factory=list)          # trainer.episodes.Episode, when the job plays them
    timings: dict[str, float] = field(default_factory=dict)


def _score_round(ctx: Ctx, samples: list[dict], sampling: SamplingParams) -> _Round:
    t0 = time.perf_counter()
    if ctx.spec.episodes is not None:
        eps, timings = _play(ctx, [s["prompt"] for s in samples], sampling, [s["reference"] for s in samples])
        return _scored_episodes(ctx, samples, eps, time.perf_counter() - t0, timings)
    ro = ctx.engine.generate([s["prompt"] for s in samples], ctx.spec.rollout.group_size, sampling)
    return _scored(ctx, samples, ro, time.perf_counter() - t0)


def _play(ctx: Ctx, prompts: list, sampling: SamplingParams, refs: list) -> tuple[list, dict[str, float]]:
    """G episodes of every prompt, their tool calls in the jail pool (trainer.episodes)."""
    version = ctx.producer.version if ctx.producer is not None else weights.version(ctx.policy)
    return episodes.run(ctx.engine, ctx.tok, prompts, ctx.spec.rollout.group_size, sampling, ctx.spec.episodes,
                        ctx.tools, version=version, base=ctx.stream.position, references=refs)


def _scored_episodes(ctx: Ctx, samples: list[dict], eps: list, rollout_s: float, timings: dict) -> _Round:
    """Score one round's episodes on what the model wrote (observations left out), one group per prompt."""
    G = ctx.spec.rollout.group_size
    t1 = time.perf_counter()
    env = ctx.tools.env if ctx.tools is not None else None
    if env is not None and getattr(env, "rewards", False):  # the environment's reward (step's, or verify's)
        sc = episodes.env_scores(eps)
    else:
        sc = ctx.scorer([e.model_text() for e in eps], [s["reference"] for s in samples for _ in range(G)])
    groups = []
    for g in range(len(samples)):
        r, ge = range(g * G, (g + 1) * G), eps[g * G:(g + 1) * G]
        ro, row_ep = episodes.to_rollout(ge, ctx.tok.pad_token_id)
        groups.append({"ro": ro, "row_ep": row_ep, "episodes": ge, "rewards": [sc.rewards[i] for i in r],
                       "penalty": [0.0] * G, "correct": [sc.correct[i] for i in r], "infra": [sc.infra[i] for i in r],
                       "excluded": [e.excluded for e in ge], "len": [e.tokens() for e in ge],
                       "trunc": [e.finish in episodes.TRUNCATED for e in ge],
                       "scores": {k: [v[i] for i in r] for k, v in sc.per_verifier.items()},
                       "verdicts": {k: [sc.verdicts[k][i] for i in r] for k in sc.verdicts}})
    return _Round(groups, sc, rollout_s, time.perf_counter() - t1, eps, timings)


def _scored(ctx: Ctx, samples: list[dict], ro: Rollout, rollout_s: float) -> _Round:
    """Score one round's completions (``ro``: ``samples`` × G rows) and cut them into per-group records."""
    G, ac = ctx.spec.rollout.group_size, ctx.spec.algo
    t1 = time.perf_counter()
    sc = ctx.scorer(ro.texts, [s["reference"] for s in samples for _ in range(G)])
    penalty = [0.0] * len(ro.texts)
    if ac.overlong_buffer:  # DAPO's soft overlong punishment, in tokens, on top of the verifiers' reward
        penalty = (ac.overlong_penalty * algos.overlong_penalty(ro.completion_mask.sum(1),
                                                                ctx.spec.rollout.max_new_tokens,
                                                                ac.overlong_buffer)).tolist()
    rewards = [r + p for r, p in zip(sc.rewards, penalty)]
    groups = []
    for g in range(len(samples)):
        r = range(g * G, (g + 1) * G)
        part = select(ro, list(r))
        groups.append({"ro": part, "row_ep": list(range(G)), "rewards": [rewards[i] for i in r],
                       "penalty": [penalty[i] for i in r], "correct": [sc.correct[i] for i in r],
                       "infra": [sc.infra[i] for i in r], "excluded": [False] * G,
                       "len": part.completion_mask.sum(1).tolist(), "trunc": part.truncated.tolist(),
                       "scores": {k: [v[i] for i in r] for k, v in sc.per_verifier.items()},
                       "verdicts": {k: [sc.verdicts[k][i] for i in r] for k in sc.verdicts}})
    return _Round(groups, sc, rollout_s, time.perf_counter() - t1)


def _left_out(g: dict) -> list[bool]:
    """Completions of a group record that take no part in its statistics or the loss: an infrastructure
    failure of a verifier, or an episode excluded by its outcome (the sandbox failed, a void turn)."""
    return [a or b for a, b in zip(g["infra"], g["excluded"])]


def _is_dead(g: dict) -> bool:
    """One group record with no learning signal (algos.flat_groups; float64, as the Python floats it holds)."""
    rewards = torch.tensor(g["rewards"], dtype=torch.float64)
    return bool(algos.flat_groups(rewards, len(rewards), ~torch.tensor(_left_out(g), dtype=torch.bool))[0])


def _samples(prompts: list[dict], groups: list[dict], tok, keep_tokens: bool = False) -> list[dict]:
    """A few whole groups as people read them (the rollout browser): each completion with reward,
    verdicts, whether it was left out of the update (its reward was an infrastructure failure), its
    length, whether it was truncated, its tokens and — when the engine returned them — the engine's
    per-token log-probs. :func:`_annotate` adds what the update made of them."""
    out = []
    for s, g in zip(prompts[:SAMPLE_GROUPS], groups):
        ro, comps, left_out = g["ro"], [], _left_out(g)
        lengths = ro.completion_mask.sum(1).tolist()
        for j in range(len(g["rewards"])):
            row = g["row_ep"].index(j)  # an episode's first sample (a fork's later ones: its turns say so)
            ids = ro.completion_ids[row, : min(int(lengths[row]), DETAIL_TOKENS)].tolist()
            c = {"text": ro.texts[row], "reward": g["rewards"][j], "excluded": left_out[j],
                 "verdicts": {n: v[j].to_dict() for n, v in g["verdicts"].items()}, "length": int(g["len"][j]),
                 "truncated": bool(g["trunc"][j]), "tokens": [tok.decode([i]) for i in ids], "row": row}
            if ro.logprobs is not None:
                c.update(logprobs=_rounded(ro.logprobs[row, : len(ids)]), logprobs_source="engine")
            if "episodes" in g:  # turn by turn: which tokens the model wrote (trained) and what each call did
                e = g["episodes"][j]
                c.update(trained=[int(x) for x in ro.trained[row, : len(ids)].tolist()], finish=e.finish,
                         forks=e.forks, tool_calls=e.tool_calls, turns=episodes.turns_for_people(e))
                if keep_tokens:  # the whole ledger, for GET /v1/jobs/{id}/rollouts/export
                    c["ledger"] = episodes.ledger(e)
            comps.append(c)
        out.append({"prompt": s["prompt"], "reference": s["reference"], "completions": comps})
    return out


def _annotate(samples: list[dict], p: "_Prepared", adv_seq: torch.Tensor, G: int) -> None:
    """Record what the update made of the stored groups (they are this rank's first rows): each
    completion's advantage and, where the update ran it, the trainer's per-token log-probs and the
    engine − trainer difference per token. Only reads what the step computed anyway."""
    for i, s in enumerate(samples):
        if s.get("resampled"):  # replaced by a fresh prompt's group: these rows were never trained on
            continue
        for j, c in enumerate(s["completions"]):
            row = s["row0"] + c.pop("row")  # its row in this step's rollout
            c["advantage"] = round(float(adv_seq[row]), 6)
            trainer = p.seen_logp.get(row)
            if trainer is None:  # an inert row (no loss term): the update skipped its forward
                continue
            trainer = trainer[: len(c["tokens"])]
            if c.get("logprobs_source") == "engine":
                engine = torch.tensor(c["logprobs"])
                c["logprob_diff"] = _rounded(engine - trainer[: len(engine)])
            c.update(logprobs=_rounded(trainer), logprobs_source="trainer")


def _rounded(xs: torch.Tensor) -> list[float]:
    return [round(float(x), 4) for x in xs]


def sample_groups(ctx: Ctx) -> Groups:
    """Sample and score this step's groups (refilling zero-variance ones if asked), gather rewards."""
    return sample_batches(ctx, 1)[0][0]


def sample_batches(ctx: Ctx, m: int) -> list[tuple[Groups, int]]:
    """``m`` steps' groups from ONE engine call (the async producer's ``producer_batches``: a bigger decode
    batch costs less per row), each scored on its own, with the stream position after its prompts. The
    call's sampling time is shared evenly between its batches (``time/rollout_s``)."""
    spec, dist = ctx.spec, ctx.dist
    sampling = SamplingParams(spec.rollout.max_new_tokens, spec.rollout.temperature, spec.rollout.top_p,
                              stop=tuple(spec.rollout.stop), entropy=_sampler_is_policy(spec))
    n, G = spec.train.prompts_per_step, spec.rollout.group_size
    batches, ends = [], []
    for _ in range(m):
        batches.append(ctx.stream.next_batch(n))  # same on every rank
        ends.append(ctx.stream.position)
    mine = dist.shard(n)
    t0 = time.perf_counter()
    prompts = [s["prompt"] for b in batches for s in b[mine]]
    if spec.episodes is not None:
        eps, timings = _play(ctx, prompts, sampling, [s["reference"] for b in batches for s in b[mine]])
        per_batch_s, rows = (time.perf_counter() - t0) / m, len(batches[0][mine]) * G
        share = {k: v / m for k, v in timings.items()}
        return [(_resampled(ctx, b[mine], _scored_episodes(ctx, b[mine], eps[i * rows:(i + 1) * rows], per_batch_s,
                                                          share), sampling), ends[i]) for i, b in enumerate(batches)]
    ro = ctx.engine.generate(prompts, G, sampling)
    per_batch_s, rows = (time.perf_counter() - t0) / m, len(batches[0][mine]) * G
    out = []
    for b, prompts_b in enumerate(batches):
        part = ro if m == 1 else trim(select(ro, list(range(b * rows, (b + 1) * rows))))
        out.append((_resampled(ctx, prompts_b[mine], _scored(ctx, prompts_b[mine], part, per_batch_s), sampling),
                    ends[b]))
    return out


def _resampled(ctx: Ctx, prompts: list[dict], first: _Round, sampling: SamplingParams) -> Groups:
    """One batch's groups after zero-variance refills (``zero_variance: resample``), gathered."""
    spec, dist = ctx.spec, ctx.dist
    rounds, groups = [first], list(first.groups)
    first_dead = sum(dist.gather(sum(map(_is_dead, groups))))
    resampled = 0
    for _ in range(spec.algo.resample_rounds if spec.algo.zero_variance == "resample" else 0):
        dead_by_rank = dist.gather([i for i, g in enumerate(groups) if _is_dead(g)])
        n_dead = sum(map(len, dead_by_rank))
        if n_dead == 0:
            break
        fresh = ctx.stream.next_batch(n_dead)  # every rank draws the same prompts, takes its own
        start = sum(map(len, dead_by_rank[: dist.rank]))
        slots = dead_by_rank[dist.rank]
        if slots:
            again = _score_round(ctx, fresh[start : start + len(slots)], sampling)
            rounds.append(again)
            for i, g in zip(slots, again.groups):
                groups[i] = g
        else:  # FSDP: the ranks that do resample all-gather shards in their generate call
            join(ctx.engine)
        resampled += n_dead
    grp = _gather(ctx, groups, rounds)
    grp.metrics.update({"zero_std_group_frac": first_dead / spec.train.prompts_per_step,
                        "resampled_groups": resampled})
    grp.samples = _samples(prompts, first.groups, ctx.tok,
                           keep_tokens=spec.episodes is not None and spec.episodes.keep_tokens)
    row0 = 0
    for i, sample in enumerate(grp.samples):  # a zero-variance group resampled away was not trained on
        sample["resampled"] = groups[i] is not first.groups[i]
        sample["row0"] = row0
        row0 += len(groups[i]["row_ep"])
    grp.keep_rows = sum(len(g["row_ep"]) for g in groups[:SAMPLE_GROUPS])
    return grp


def _gather(ctx: Ctx, groups: list[dict], rounds: list[_Round]) -> Groups:
    """Flatten this rank's final groups, gather every rank's rewards, and measure the step's sampling:
    ONE verifier-health record over every scoring call of every round (what the pause rule reads)."""
    dist, G = ctx.dist, ctx.spec.rollout.group_size
    ro = concat([g["ro"] for g in groups], ctx.tok.pad_token_id)
    row_episode = torch.tensor([k * G + j for k, g in enumerate(groups) for j in g["row_ep"]], dtype=torch.long)
    sampled = [g for r in rounds for g in r.groups]
    local = {"rewards": [x for g in groups for x in g["rewards"]], "correct": [c for g in groups for c in g["correct"]],
             "infra": [x for g in groups for x in g["infra"]], "left_out": [x for g in groups for x in _left_out(g)],
             "scores": {k: [x for g in groups for x in g["scores"][k]] for k in groups[0]["scores"]},
             "len": [x for g in groups for x in g["len"]], "trunc": [x for g in groups for x in g["trunc"]],
             "tokens": sum(g["ro"].num_tokens for g in sampled),
             "dead_tokens": sum(g["ro"].num_tokens for g in sampled if _is_dead(g)),
             "retried": sum(r.scores.retried for r in rounds), "penalty": sum(x for g in groups for x in g["penalty"])}
    every = dist.gather(local)
    rewards_global = torch.tensor([r for e in every for r in e["rewards"]])
    valid_global = ~torch.tensor([x for e in every for x in e["left_out"]], dtype=torch.bool)
    n, tokens = len(rewards_global), sum(e["tokens"] for e in every)
    lengths = torch.tensor([x for e in every for x in e["len"]], dtype=torch.float32)
    ok = rewards_global[valid_global]
    m: dict[str, Any] = {
        "reward/mean": ok.mean().item() if len(ok) else 0.0, "reward/std": ok.std().item() if len(ok) > 1 else 0.0,
        "reward/infra_fail_frac": sum(x for e in every for x in e["infra"]) / n,
        "reward/infra_retried": sum(e["retried"] for e in every),
        "reward/overlong_penalty_mean": sum(e["penalty"] for e in every) / n,
        "accuracy": sum(c for e in every for c in e["correct"]) / n,
        "zero_std_group_frac_final": algos.flat_groups(rewards_global, G, valid_global).float().mean().item(),
        "dead_group_token_frac": sum(e["dead_tokens"] for e in every) / max(tokens, 1),
        "completion/len_mean": lengths.mean().item(), "completion/len_max": lengths.max().item(),
        "completion/truncated_frac": sum(t for e in every for t in e["trunc"]) / n,
        "rollout_tokens": tokens, "time/rollout_s": sum(r.rollout_s for r in rounds),
        "time/score_s": sum(r.score_s for r in rounds), **health_metrics([r.scores for r in rounds]),
    }
    for name in local["scores"]:
        scores = torch.tensor([x for e in every for x in e["scores"][name]], dtype=torch.float32)
        m[f"verifier/{name}/mean"] = scores.mean().item()  # over the groups trained on (health: over calls)
        m[f"verifier/{name}/std"] = scores.std().item() if n > 1 else 0.0
    mine = len(local["rewards"])
    rows = slice(dist.rank * mine, (dist.rank + 1) * mine)
    dead = algos.flat_groups(rewards_global, G, valid_global).view(dist.world, -1)[dist.rank]
    if ctx.spec.episodes is not None:
        played = [e for r in rounds for e in r.episodes]
        timings = {k: sum(r.timings.get(k, 0.0) for r in rounds) for k in ("generate_s", "tool_s")}
        mine_m = episodes.metrics(played, timings)
        mine_m["episodes/token_mismatches"] = episodes.ledger_mismatches(played)
        for k in mine_m:  # every rank's episodes: means of the ranks' means (equal shares), counts summed
            vals = dist.gather(mine_m[k])
            m[k] = sum(vals) if k in ("episodes/token_mismatches", "episodes/tool_s", "episodes/generate_s") \
                else sum(vals) / len(vals)
    same = ctx.spec.episodes is None and all(len(g["row_ep"]) == G for g in groups)
    return Groups(ro, torch.tensor(local["rewards"], dtype=torch.float32), rewards_global, valid_global, rows,
                  dead, None if same else row_episode, m)


@torch.no_grad()
def _no_grad_forward(ctx: Ctx, model, ro: Rollout, hidden: bool, entropy: bool = True) -> Forward:
    """Forward in micro-batches without graph (old policy / reference), concatenated. ``entropy=False``: log p
    only (a reference's or teacher's), without the entropy's passes over the vocabulary."""
    parts = [forward(model, select(ro, i), ctx.spec.rollout.temperature, hidden=hidden, entropy=entropy)
             for i in chunks(torch.arange(len(ro.texts)), ctx.spec.algo.micro_rows(width(ro)))]
    cat = lambda xs: torch.cat(xs) if xs[0] is not None else None  # noqa: E731
    return Forward(cat([p.logp for p in parts]), cat([p.entropy for p in parts]), cat([p.hidden for p in parts]))


@dataclass
class _Prepared:
    """What the update needs besides the rollout: loss mask, advantages, old and reference log-probs."""
    mask: torch.Tensor              # (N, T) completion tokens that carry loss
    adv: torch.Tensor               # (N,) or (N, T)
    old: Forward | None             # the sampling policy's forward (multi-pass updates, PPO)
    ref_logp: torch.Tensor | None   # (N, T) frozen reference (KL)
    multi_pass: bool
    inert: torch.Tensor             # (N,) bool: rows whose every loss term is zero (the update skips them)
    diag: list[dict] = field(default_factory=list)  # policy stats of rows no micro-batch reports (diagnostics)
    keep_rows: int = 0              # rows < this: keep the trainer's log-probs for the stored rollouts
    seen_logp: dict[int, torch.Tensor] = field(default_factory=dict)  # row -> (T,) pre-update, on the CPU


def _prepare(ctx: Ctx, grp: Groups) -> _Prepared:
    spec, ac, dist, est, ro = ctx.spec, ctx.spec.algo, ctx.dist, ctx.estimator, grp.ro
    G = spec.rollout.group_size
    mask = ro.trained.float().to(dist.device)  # an episode's tool observations: attended to, never trained on
    mask = mask * grp.per_row(grp.valid).unsqueeze(-1).to(mask)  # infrastructure failures carry no loss
    if ac.overlong_mask:
        mask = algos.overlong_filter(mask, ro.truncated.to(dist.device))
    if ac.zero_variance == "drop":
        mask = mask * grp.per_row((~grp.dead).repeat_interleave(G)).unsqueeze(-1).to(mask)
    N = len(ro.texts)
    multi_pass = ac.ppo_epochs > 1 or (ac.minibatch_size or N * dist.world) < N * dist.world
    # Rows whose every loss term is identically zero — no tokens left in the mask, or a zero-variance
    # group (advantage 0) when nothing else (entropy, KL, value loss) is in the loss — count in the
    # normalisers but skip the forward/backward: same gradient, less compute.
    no_other_terms = not est.has_loss and ac.entropy_coef == 0 and ctx.ref is None and ctx.teacher is None
    dead_rows = grp.per_row(grp.dead.repeat_interleave(G)).to(mask.device)
    inert = ((mask.sum(1) == 0) | (dead_rows & no_other_terms)).cpu()
    p = _Prepared(mask, None, None, None, multi_pass, inert, keep_rows=grp.keep_rows)  # type: ignore[arg-type]
    with torch.no_grad(), ctx.autocast():
        needs_old = multi_pass or est.needs_old or ctx.teacher is not None
        p.old = _no_grad_forward(ctx, ctx.policy, ro, est.needs_hidden) if needs_old else None
        p.ref_logp = _no_grad_forward(ctx, ctx.ref, ro, False, entropy=False).logp if ctx.ref is not None else None
        kl_tok = algos.kl_k1(p.old.logp, p.ref_logp) if p.old is not None and p.ref_logp is not None else None
        p.adv = est.prepare(ro, grp.rewards_global, grp.rows, mask, p.old, kl_tok, dist, grp.valid_global)
        p.adv = grp.per_row(p.adv).to(dist.device)  # an episode's advantage on each of its rows
        if ctx.teacher is not None:  # on-policy distillation: the teacher's verdict on each sampled token
            teacher_lp = _no_grad_forward(ctx, ctx.teacher, ro, False, entropy=False).logp
            d = spec.distill
            p.adv = algos.adv_distill(p.adv, p.old.logp, teacher_lp, mask, d.coef, d.verifier_weight)
            tok = ro.completion_mask.to(mask.device).bool()
            p.diag.append({"distill/reverse_kl": (float((p.old.logp - teacher_lp)[tok].sum()), float(tok.sum()))})
        _diagnose_unreported_rows(ctx, ro, p)
    return p


def _sampler_is_policy(spec) -> bool:
    """Whether the sampler's distribution is the one the trainer's forward computes, up to kernel round-off:
    synchronous rollouts (the weights being trained, this step) and no bf16 autocast in the trainer. Then an
    engine that returns each position's entropy (ours: Rollout.entropy) spares the skipped rows' forward."""
    return spec.rollout.max_staleness == 0 and spec.train.precision != "bf16"


def _diagnose_unreported_rows(ctx: Ctx, ro: Rollout, p: _Prepared) -> None:
    """Entropy and the engine gap over every sampled row, before the update: from the old forward when there
    is one (multi-pass: it covers every row); else the single pass's micro-batches report the rows they
    train, and the rows the update skips get a forward here (no graph). When the sampler is the policy
    itself and returned its entropies, the skipped rows run no forward at all: their entropy is the sampler's,
    the engine gap (~1e-6 from such a sampler, by construction) is over the trained rows, and the rollout
    browser shows the skipped rows' sampler log-probs (``logprobs_source: engine``). A forward for those
    log-probs alone (which a 1e-6 gap makes the sampler's) was ~10% of a SmolLM2-135M real-math update."""
    if p.old is None and ctx.dist.sharded:  # sharded ranks run every row forward (context.optimize): reported
        return
    rows = torch.arange(len(ro.texts)) if p.old is not None else p.inert.nonzero().flatten()
    if len(rows) == 0:
        return
    if p.old is None and ro.entropy is not None and _sampler_is_policy(ctx.spec):
        # SmolLM2-135M's GRPO update, half its groups skipped: this forward over them was ~2 s of ~8
        m = ro.trained[rows].to(torch.bool)
        if m.any():
            p.diag.append({"entropy": (float(ro.entropy[rows].float()[m].sum()), float(m.sum()))})
        return
    fwd = p.old if p.old is not None else _no_grad_forward(ctx, ctx.policy, select(ro, rows), False)
    engine = ro.logprobs[rows] if ro.logprobs is not None else None
    p.diag.append(policy_stats(fwd.logp, fwd.entropy, engine, ro.trained[rows].to(fwd.logp.device)))
    if p.old is None:
        for j, row in enumerate(rows.tolist()):  # the rollout browser shows these rows' log-probs too
            if row < p.keep_rows:
                p.seen_logp[row] = fwd.logp[j].detach().float().cpu()


def _micro_loss(ctx: Ctx, ro: Rollout, p: _Prepared, idx: torch.Tensor, counts: Counts, epoch: int = 1
                ) -> tuple[torch.Tensor, dict[str, float]]:
    """The loss of one micro-batch, normalised by the whole minibatch's ``counts``."""
    spec, ac, est = ctx.spec, ctx.spec.algo, ctx.estimator
    agg = algos.LOSS_AGG[ac.loss_agg]
    m, part = p.mask[idx], select(ro, idx)
    fwd = forward(ctx.policy, part, spec.rollout.temperature, hidden=est.needs_hidden,
                  entropy_grad=ac.entropy_coef > 0)
    old_lp = p.old.logp[idx] if p.old is not None else fwd.logp.detach()
    for j, row in enumerate(idx.tolist()):  # recorded for people, never read by the update
        if row < p.keep_rows and row not in p.seen_logp:
            p.seen_logp[row] = old_lp[j].detach().float().cpu()
    pg, clipped = algos.POLICY_LOSSES[ac.policy_loss](fwd.logp, old_lp, p.adv[idx], ac.clip_eps_low,
                                                      ac.clip_eps_high, m)
    n_tok = float(m.sum())
    st: dict = {}
    w = None  # importance weight of each token when the samples came from another distribution
    engine_lp = ro.logprobs[idx].to(old_lp.device) if ro.logprobs is not None else None
    if p.old is None:  # a single pass: this forward is the sampling policy's (its rows' diagnostics)
        st.update(policy_stats(fwd.logp, fwd.entropy, engine_lp, part.trained.to(m.device)))
    else:  # a later pass has moved: how far, and where the clip binds
        st.update(ratio_stats(fwd.logp, old_lp, clipped, m, epoch))
    if engine_lp is not None:
        cap = ac.tis_cap if ac.tis_cap is not None else \
            (ASYNC_TIS_CAP if ctx.producer is not None else getattr(ctx.engine, "default_tis_cap", None))
        if cap is not None:  # sampled from another distribution (engine kernels, or an older policy): reweight
            log_r = (old_lp.detach().float() - engine_lp.float()) * part.trained.to(m.device)
            w = algos.IS_CORRECTIONS[ac.tis_mode](log_r, m, cap, ac.tis_low or 1.0 / cap)
            st.update({"tis/weight_mean": (float((w * m).sum()), n_tok),
                       "tis/capped_frac": (float(((w >= cap) * m).sum()), n_tok),
                       "tis/masked_frac": (float(((w == 0) * m).sum()), n_tok)})
    weighted = (lambda x: x) if w is None else (lambda x: x * w)  # every per-token term alike: pg, entropy, KL
    loss = agg(weighted(pg), m, *counts) - ac.entropy_coef * agg(weighted(fwd.entropy), m, *counts)
    value_loss, est_st = est.loss(fwd, part, idx, m, counts)
    st.update(est_st)
    loss = loss + value_loss
    if p.ref_logp is not None:
        kl = algos.KL_ESTIMATORS[ac.kl_estimator](fwd.logp, p.ref_logp[idx])
        if ac.kl_in == "loss":  # else it is in the reward already (the estimator's prepare)
            loss = loss + ac.kl_coef * agg(weighted(kl), m, *counts)
        st["kl"] = (float((kl.detach() * m).sum()), n_tok)
    return loss, st


def _update(ctx: Ctx, grp: Groups, p: _Prepared) -> list[dict]:
    """Every optimiser step of this training step; returns their stats (rows in ``p.inert`` are skipped)."""
    spec, ac, dist = ctx.spec, ctx.spec.algo, ctx.dist
    ro, N = grp.ro, len(grp.ro.texts)

    def counts(idx: torch.Tensor) -> Counts:
        c = dist.all_sum(torch.tensor([float(p.mask[idx].sum()), float(len(idx))]))
        # Dr. GRPO's constant is the generation budget, never this batch's (or this rank's) padded width
        budget = spec.episodes.max_episode_tokens if spec.episodes is not None else spec.rollout.max_new_tokens
        return Counts(tokens=int(c[0]), seqs=int(c[1]), max_len=budget)

    n_mb = -(-N * dist.world // (ac.minibatch_size or N * dist.world))  # same count on every rank
    ctx.policy.train()
    stats: list[dict[str, float]] = []
    for epoch in range(1, ac.ppo_epochs + 1):
        perm = torch.randperm(N) if p.multi_pass else torch.arange(N)
        for mb in perm.tensor_split(n_mb):
            stats += optimize(ctx, mb, counts, lambda idx, c: _micro_loss(ctx, ro, p, idx, c, epoch), p.inert,
                              micro_rows=ac.micro_rows(width(ro)))
    ctx.sched.step()
    return stats


def _next_groups(ctx: Ctx) -> tuple[Groups, dict[str, Any]]:
    """This step's groups: sampled now, or (async) the producer's next batch within max_staleness."""
    if ctx.producer is None:
        return sample_groups(ctx), {}
    grp, stale, m = ctx.producer.next()
    ctx.stream.position = ctx.producer.position_hint = int(m.pop("async/data_position"))  # consumed: checkpointed
    k = ctx.spec.rollout.max_staleness
    m.update({"async/staleness": stale, "async/dropped_batches": ctx.producer.dropped,
              **{f"async/staleness_{i}": float(stale == i) for i in range(k + 1)}})
    return grp, m


def step(ctx: Ctx) -> StepOutput:
    t0 = time.perf_counter()
    grp, async_m = _next_groups(ctx)            # rollout + score (or the producer's batch)
    t1 = time.perf_counter()
    prep = _prepare(ctx, grp)                   # advantages (and old / reference log-probs)
    stats = _update(ctx, grp, prep)             # optimiser steps
    t2 = time.perf_counter()
    m, adv, mask, N = dict(grp.metrics), prep.adv, prep.mask, len(grp.ro.texts)
    adv_seq = adv if adv.dim() == 1 else (adv * mask).sum(1) / mask.sum(1).clamp(min=1)
    m.update({"adv/mean": adv_seq.mean().item(), "adv/std": adv_seq.std().item() if N > 1 else 0.0,
              "adv/max_abs": adv.abs().max().item(), "update/skipped_row_frac": prep.inert.float().mean().item(),
              "tokens_per_s": m["rollout_tokens"] / max(t2 - t0, 1e-9),
              "time/update_s": t2 - t1, "time/step_s": t2 - t0})
    m.update(merge(stats + prep.diag))  # entropy, engine gap: every row; loss, grad norm: every optimiser step
    if not prep.multi_pass:  # one pass: the ratio is 1 (against the pre-update or proximal policy)
        m.update(dict.fromkeys(INERT_WHEN_SINGLE_PASS))
    m.update(async_m)
    if ctx.spec.episodes is not None:
        m["episodes/tool_time_frac"] = m.get("episodes/tool_s", 0.0) / max(t2 - t0, 1e-9)
        episodes.check_drift(m, ctx.spec)  # trained tokens that are not what was sampled: fail, never train on
    _annotate(grp.samples, prep, adv_seq.detach().cpu(), ctx.spec.rollout.group_size)
    if ctx.producer is not None:  # the next batches are sampled with the weights this step produced
        ctx.producer.publish(ctx.policy, ctx.producer.version + 1)
    return StepOutput(m, grp.samples)

