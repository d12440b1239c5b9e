"""Rollouts: the batch type every engine returns, and the sampling pieces engines share.

An engine (trainer.engines) returns token ids in one padded layout the trainer can score without
re-tokenising:
prompts LEFT-padded (so every completion starts at the same column), completions RIGHT-padded,
and a mask that covers each completion up to and including its end-of-sequence token.
Engines may also return the log-probability of each sampled token under softmax(logits / T)
(``Rollout.logprobs``); the trainer still recomputes the log-probs it trains on with its own model
(one forward) and can log how far the engine's are from its own (``logprob_mismatch``).

The engines themselves, by name, are in trainer.engines.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Sequence

import torch


@dataclass
class Rollout:
    prompt_ids: torch.Tensor       # (N, P) left-padded
    prompt_mask: torch.Tensor      # (N, P)
    completion_ids: torch.Tensor   # (N, T) right-padded with pad id
    completion_mask: torch.Tensor  # (N, T) 1 up to and including EOS
    texts: list[str]               # decoded completions (special tokens stripped)
    truncated: torch.Tensor        # (N,) bool: no EOS within max_new_tokens
    # (N, T) float32: log p of each sampled token under softmax(logits / temperature), the quantity
    # the trainer recomputes (no top-p renormalisation); 0 outside the mask; None if not returned.
    logprobs: torch.Tensor | None = None
    # (N, T) which completion tokens carry loss, where that is not every one of them: a multi-turn episode's
    # tool observations are attended to but never trained on (trainer/episodes.py); None = completion_mask
    loss_mask: torch.Tensor | None = None
    # (N, T) float32: the entropy of softmax(logits / temperature) at each sampled position, as the sampler saw
    # it (asked with ``SamplingParams.entropy``; 0 outside the mask; None if not returned). The trainer reports
    # it for the rows its update skips instead of running them forward (trainer/online.py)
    entropy: torch.Tensor | None = None

    @property
    def trained(self) -> torch.Tensor:
        """(N, T) the tokens the policy sampled and the loss sees."""
        return self.completion_mask if self.loss_mask is None else self.loss_mask

    @property
    def num_tokens(self) -> int:
        return int(self.completion_mask.sum())


@dataclass
class SamplingParams:
    max_new_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    greedy: bool = False
    stop: tuple[str, ...] = ()  # strings that end a completion (kept in it, like vLLM's include_stop_str_in_output)
    entropy: bool = False  # also return each position's entropy (Rollout.entropy); engines that cannot ignore it


def render_prompt(tokenizer, prompt: Any) -> str:
    """Chat-format a prompt (string = one user turn) when the tokenizer has a chat template."""
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return "\n".join(m["content"] for m in messages)


def stop_ids(tokenizer, model=None) -> list[int]:
    """Every token that ends a completion: the tokenizer's EOS first, then the model's generation
    config's (chat models often list several: Llama 3 ends turns with <|eot_id|>, Qwen with
    <|im_end|> and <|endoftext|>). Sampling past them would train on text after the turn ended."""
    ids = [tokenizer.eos_token_id]
    gen = getattr(model, "generation_config", None)
    extra = getattr(gen, "eos_token_id", None)
    ids += extra if isinstance(extra, (list, tuple)) else [extra]
    return list(dict.fromkeys(int(i) for i in ids if i is not None))


def completion_mask(ids: torch.Tensor, eos_id: int | Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Mask (N, T) through the first EOS (any stop id) inclusive, and (N,) truncated flags."""
    stops = torch.tensor([eos_id] if isinstance(eos_id, int) else list(eos_id), dtype=ids.dtype)
    is_eos = torch.isin(ids, stops.to(ids.device))
    # count EOS strictly before each position; keep positions with none before them
    before = torch.cumsum(is_eos.int(), dim=1) - is_eos.int()
    mask = (before == 0).to(torch.long)
    truncated = ~is_eos.any(dim=1)
    return mask, truncated


class StopStrings:
    """Stop strings for a sampler that adds one token per row per step: a row ends at the token whose
    text completes one of them, and keeps that token (the trainer scores exactly the text the verifier
    read). Each check decodes only the row's last few tokens: a stop string of c characters lies within
    the last c + 2 tokens (every token decodes to at least one character, except the pieces of one
    multi-byte character: hence the slack), so a step costs one small batch_decode, not the whole row."""

    def __init__(self, tokenizer, stops: Sequence[str]):
        self.tok, self.stops = tokenizer, tuple(s for s in stops if s)
        self.window = max(map(len, self.stops)) + 2 if self.stops else 0

    def __bool__(self) -> bool:
        return bool(self.stops)

    def hits(self, tail: torch.Tensor) -> torch.Tensor:
        """(R, t) the rows' tokens so far (or their last ``window``) -> (R,) bool: a stop string is in them."""
        texts = self.tok.batch_decode(tail[:, -self.window:].tolist(), skip_special_tokens=False)
        return torch.tensor([any(s in x for s in self.stops) for x in texts], dtype=torch.bool)

    def ends(self, comp: torch.Tensor, mask: torch.Tensor) -> list[int | None]:
        """After the fact (a reference engine): per row, the length through the token that first completes
        a stop string within the mask, or None."""
        out: list[int | None] = [None] * comp.shape[0]
        for t in range(comp.shape[1]):
            open_rows = [i for i in range(comp.shape[0]) if out[i] is None and mask[i, t]]
            if not open_rows:
                continue
            hit = self.hits(comp[open_rows, : t + 1])
            for i, h in zip(open_rows, hit.tolist()):
                if h:
                    out[i] = t + 1
        return out


def cut_at(mask: torch.Tensor, truncated: torch.Tensor, ends: Sequence[int | None]) -> tuple[torch.Tensor,
                                                                                             torch.Tensor]:
    """The mask and truncation flags once rows that met a stop string end there (``ends``: length or None)."""
    mask, truncated = mask.clone(), truncated.clone()
    cols = torch.arange(mask.shape[1])
    for i, n in enumerate(ends):
        if n is not None:
            mask[i] = (cols < n).to(mask.dtype)
            truncated[i] = False
    return mask, truncated


# ---------------------------------------------------------------------------------------- sampling
def top_p_filter(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """Nucleus filter on (B, V) scores: -inf outside the smallest set holding ``top_p`` of the mass.

    The same arithmetic as transformers' ``TopPLogitsWarper`` (ascending sort, drop the prefix whose
    cumulative mass is <= 1 - top_p, always keep the top token), so seeded runs match ``generate``.
    """
    sorted_scores, order = torch.sort(scores, descending=False)
    cum = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
    drop_sorted = cum <= (1 - top_p)
    drop_sorted[..., -1:] = False
    drop = drop_sorted.scatter(1, order, drop_sorted)
    return scores.masked_fill(drop, float("-inf"))


def draw_multinomial(probs: torch.Tensor) -> torch.Tensor:
    """(B, V) probabilities -> (B,) draws with ``torch.multinomial``: the stream ``generate`` uses."""
    return torch.multinomial(probs, num_samples=1).squeeze(1)


_CDF_BLOCK = 256  # tokens per block of draw_inverse_cdf's first level


def draw_inverse_cdf(probs: torch.Tensor) -> torch.Tensor:
    """(B, V) probabilities (or any non-negative weights) -> (B,) draws from one uniform per row through
    the cumulative sum.

    The same distribution as ``torch.multinomial``, which on CPU draws one exponential per vocabulary
    entry (12% of a 135M model's decode step at a 49k vocabulary, bench/rollout.py). float64 sums so
    the tail's mass is not lost to round-off; tokens with weight 0 (cut by top-p) have a flat CDF step
    and can never be picked. Over a large vocabulary the cumulative sum is taken in two levels: the
    masses of blocks of ``_CDF_BLOCK`` tokens pick a block, then the uniform's remainder picks a token
    inside it. A whole-row float64 cumsum cost ~12 ms of a ~245 ms decode step at SmolLM2-135M's shape
    (a float64 copy and a serial scan of 32 x 49,152, one thread); the two levels read the row once. Each
    block's mass is summed in the probabilities' own dtype (a float64 sum converts the whole row first: 5.8
    of a ~240 ms step): a sum of non-negative numbers keeps its relative precision at any size, so only
    the running total over blocks needs float64, and a block sums to 0 only if all its tokens are 0.
    """
    B, V = probs.shape
    if V < 4 * _CDF_BLOCK:  # a small vocabulary: one scan is cheaper than the two levels' bookkeeping
        cdf = probs.double().cumsum(dim=-1)
        u = torch.rand((B, 1), dtype=torch.float64, device=probs.device) * cdf[:, -1:]
        return torch.searchsorted(cdf, u, right=True).squeeze(1).clamp(max=V - 1)
    n_full = V // _CDF_BLOCK
    full = probs[:, : n_full * _CDF_BLOCK].reshape(B, n_full, _CDF_BLOCK)
    mass = full.sum(-1)  # (B, blocks)
    if V > n_full * _CDF_BLOCK:  # the vocabulary's last, shorter block
        mass = torch.cat([mass, probs[:, n_full * _CDF_BLOCK :].sum(-1, keepdim=True)], 1)
    mass = mass.double()
    cdf = mass.cumsum(dim=-1)
    total = cdf[:, -1:]
    u = torch.minimum(torch.rand((B, 1), dtype=torch.float64, device=probs.device) * total,
                      torch.nextafter(total, torch.zeros_like(total)))  # below the total, even rounded
    block = torch.searchsorted(cdf, u, right=True).clamp(max=cdf.shape[1] - 1)  # a block of positive mass
    before = torch.where(block > 0, cdf.gather(1, (block - 1).clamp(min=0)), 0.0)
    idx = block * _CDF_BLOCK + torch.arange(_CDF_BLOCK, device=probs.device)  # (B, block's tokens)
    inner = torch.where(idx < V, probs.gather(1, idx.clamp(max=V - 1)), 0.0).double().cumsum(dim=-1)
    # the block's own scan may total a rounding below its mass: stay strictly under it, so the draw
    # lands on a token of positive weight
    rest = torch.minimum(u - before, torch.nextafter(inner[:, -1:], torch.zeros_like(inner[:, -1:])))
    return (idx.gather(1, torch.searchsorted(inner, rest, right=True).clamp(max=_CDF_BLOCK - 1))).squeeze(1)


DRAWS = {"inverse_cdf": draw_inverse_cdf, "multinomial": draw_multinomial}


def sample_next(logits: torch.Tensor, params: SamplingParams, draw=draw_inverse_cdf
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """One decoding step for a batch: (B, V) float logits -> (B,) token ids, their log-probs, and (asked with
    ``params.entropy``, not greedy) each row's entropy; else None.

    Sampling is temperature -> top-p -> softmax -> one draw per row, in transformers' order (with
    ``draw_multinomial`` and the same seed and batch, our loop draws what ``model.generate`` draws).
    The log-prob and the entropy are of softmax(logits / T) without the top-p cut: what the trainer recomputes.
    Without a cut they come from the probabilities the draw used: log p of the token, and
    H = log-sum-exp - sum(p * logits / T) with the log-sum-exp read off the sampled token — no second pass of
    exponentials over the vocabulary (a log-sum-exp and a log-softmax were 7 of ~10 ms per step at SmolLM2's
    49,152 entries and 32 rows, one thread).
    """
    scaled = logits / params.temperature

    def logp_by_lse(rows, tokens):  # log p of each row's token through the row's log-sum-exp
        return scaled[rows].gather(1, tokens[:, None]).squeeze(1) - torch.logsumexp(scaled[rows], dim=-1)

    every = slice(None)
    if params.greedy:
        tokens = logits.argmax(dim=-1)
        return tokens, logp_by_lse(every, tokens), None
    if params.top_p < 1.0:
        tokens = draw(top_p_filter(scaled, params.top_p).softmax(dim=-1))
        return tokens, logp_by_lse(every, tokens), token_entropy(logits, params.temperature) if params.entropy else None
    probs = scaled.softmax(dim=-1)
    tokens = draw(probs)
    p_tok = probs.gather(1, tokens[:, None]).squeeze(1)
    logp = p_tok.log()
    tiny = p_tok <= torch.finfo(p_tok.dtype).tiny  # subnormal: too few bits for its log (never, in practice)
    if bool(tiny.any()):
        logp[tiny] = logp_by_lse(tiny, tokens[tiny])
    if not params.entropy:
        return tokens, logp, None
    lse = scaled.gather(1, tokens[:, None]).squeeze(1) - logp
    return tokens, logp, (lse - torch.linalg.vecdot(probs, scaled)).clamp(min=0)


def token_entropy(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """(B, V) logits -> (B,) entropy of softmax(logits / T), no top-p cut: the quantity the trainer reports
    (trainer/logprobs.py: -sum(p log p) over log_softmax, the same kernels)."""
    lp = torch.log_softmax(logits / temperature, dim=-1)
    return -(torch.exp(lp) * lp).sum(-1)


# ---------------------------------------------------------------------------------------- model helpers
def new_cache(model):
    """An empty KV cache with the model's per-layer kinds (sliding window, ...)."""
    from transformers import DynamicCache

    try:
        return DynamicCache(config=model.config)
    except TypeError:  # transformers < 4.56 takes no config
        return DynamicCache()


def cache_arg(model) -> str:
    """transformers 5 renamed the forward's cache argument (past_key_values -> cache); ask the
    underlying model, since wrappers (PEFT) take **kwargs and pass them through."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


def left_pad(rows: list[list[int]], pad: int) -> torch.Tensor:
    width = max(map(len, rows))
    return torch.tensor([[pad] * (width - len(r)) + r for r in rows], dtype=torch.long)


def left_pad_mask(rows: list[list[int]], skip: int) -> torch.Tensor:
    """(B, W) 1 on the real tokens of ``rows[i][skip:]`` left-padded to one width W."""
    lens = torch.tensor([len(r) - skip for r in rows])
    width = int(lens.max())
    return (torch.arange(width)[None] >= (width - lens)[:, None]).long()


def select(ro: Rollout, idx: torch.Tensor | Sequence[int]) -> Rollout:
    """The rows ``idx`` of a rollout."""
    idx = torch.as_tensor(idx, dtype=torch.long)
    lp, lm, ent = ro.logprobs, ro.loss_mask, ro.entropy
    return Rollout(ro.prompt_ids[idx], ro.prompt_mask[idx], ro.completion_ids[idx], ro.completion_mask[idx],
                   [ro.texts[i] for i in idx.tolist()], ro.truncated[idx], lp[idx] if lp is not None else None,
                   lm[idx] if lm is not None else None, ent[idx] if ent is not None else None)


def trim(ro: Rollout) -> Rollout:
    """Drop the padding columns no row uses: prompt columns left of every row's first token, completion
    columns right of every row's last (the rows of a larger batch, e.g. one of several training batches
    sampled in one call, carry that batch's widths)."""
    used_p = ro.prompt_mask.any(0).nonzero()
    first = int(used_p[0]) if len(used_p) else ro.prompt_mask.shape[1]
    used_c = ro.completion_mask.any(0).nonzero()
    last = int(used_c[-1]) + 1 if len(used_c) else 0
    lp, lm, ent = ro.logprobs, ro.loss_mask, ro.entropy
    return Rollout(ro.prompt_ids[:, first:], ro.prompt_mask[:, first:], ro.completion_ids[:, :last],
                   ro.completion_mask[:, :last], ro.texts, ro.truncated, lp[:, :last] if lp is not None else None,
                   lm[:, :last] if lm is not None else None, ent[:, :last] if ent is not None else None)


def concat(parts: list[Rollout], pad_id: int) -> Rollout:
    """Stack rollouts of different widths (prompts stay left-, completions right-padded); engine
    log-probs and entropies are kept when every part has them."""
    def cat(tensors, left: bool, value):
        width = max(t.shape[1] for t in tensors)
        rows = []
        for t in tensors:
            pad = torch.full((t.shape[0], width - t.shape[1]), value, dtype=t.dtype, device=t.device)
            rows.append(torch.cat([pad, t] if left else [t, pad], dim=1))
        return torch.cat(rows)

    lps = [p.logprobs for p in parts]
    lms = [p.loss_mask for p in parts]
    ents = [p.entropy for p in parts]
    return Rollout(cat([p.prompt_ids for p in parts], True, pad_id), cat([p.prompt_mask for p in parts], True, 0),
                   cat([p.completion_ids for p in parts], False, pad_id),
                   cat([p.completion_mask for p in parts], False, 0),
                   [t for p in parts for t in p.texts], torch.cat([p.truncated for p in parts]),
                   cat(lps, False, 0.0) if all(x is not None for x in lps) else None,
                   cat([p.trained for p in parts], False, 0) if any(x is not None for x in lms) else None,
                   cat(ents, False, 0.0) if all(x is not None for x in ents) else None)


# ------------------------------------------------------------------ engine vs trainer log-probs
def logprob_mismatch(engine_logp: torch.Tensor, trainer_logp: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """How far the engine's sampled-token log-probs are from the trainer's, over masked tokens.

    ``rollout/logp_abs_diff_mean|max``: |trainer - engine| per token; ``rollout/logp_kl_k3``: the k3
    estimate of KL(engine || trainer) (engine = the sampling distribution); ``rollout/is_ratio_mean``:
    mean of p_trainer / p_engine (1 when they agree). On one HF model these are ~1e-6 (kernel
    round-off); vLLM (other kernels, bf16, fused sampling) shows real gaps worth watching.
    """
    from .diagnostics import engine_gap, merge

    return merge([engine_gap(trainer_logp, engine_logp, mask)])  # type: ignore[return-value]
