"""Rollout engines: sample a group of completions per prompt.

An engine returns token ids in one padded layout the trainer can score without re-tokenising:
prompts LEFT-padded (so every completion starts at the same column), completions RIGHT-padded,
and a mask that covers each completion up to and including its end-of-sequence token.
Engines may also return the log-probability of each sampled token under softmax(logits / T)
(``Rollout.logprobs``); the trainer still recomputes the log-probs it trains on with its own model
(one forward) and can log how far the engine's are from its own (``logprob_mismatch``).

Engines, by name (``ENGINES``; the job's ``rollout.engine`` picks one):
- ``hf``: our sampling loop on the model's KV cache (``HFEngine``), the default;
- ``hf-generate``: transformers ``model.generate`` on the same batch (``GenerateEngine``), kept as
  the reference the tests and bench/rollout.py compare against;
- ``vllm``: offline vLLM in this process (``trainer.engines.vllm``; optional extra ``rlvr[vllm]``);
- ``auto``: vLLM when a GPU and vLLM are both there, else ``hf``.
"""
from __future__ import annotations

import importlib.util
import inspect
import os
from dataclasses import dataclass
from typing import Any, Protocol, Sequence

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

    @property
    def num_tokens(self) -> int:
        return int(self.completion_mask.sum())


@dataclass
class SamplingParams:
    max_new_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    greedy: bool = False


class RolloutEngine(Protocol):
    def generate(self, prompts: Sequence[Any], n: int, params: SamplingParams) -> Rollout: ...


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


def draw_inverse_cdf(probs: torch.Tensor) -> torch.Tensor:
    """(B, V) probabilities -> (B,) draws from one uniform per row through the cumulative sum.

    The same distribution as ``torch.multinomial``, which on CPU draws one exponential per
    vocabulary entry (12% of a 135M model's decode step at a 49k vocabulary, bench/rollout.py);
    this costs one cumsum. float64 so the tail's mass is not lost to round-off; tokens with
    probability 0 (cut by top-p) have a flat CDF step and can never be picked.
    """
    cdf = probs.double().cumsum(dim=-1)
    u = torch.rand((probs.shape[0], 1), dtype=torch.float64, device=probs.device) * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).squeeze(1).clamp(max=probs.shape[1] - 1)


DRAWS = {"inverse_cdf": draw_inverse_cdf, "multinomial": draw_multinomial}


def sample_next(logits: torch.Tensor, params: SamplingParams, draw=draw_inverse_cdf) -> tuple[torch.Tensor, torch.Tensor]:
    """One decoding step for a batch: (B, V) float logits -> (B,) token ids and their log-probs.

    Sampling is temperature -> top-p -> softmax -> one draw per row, in transformers' order (with
    ``draw_multinomial`` and the same seed and batch, our loop draws what ``model.generate`` draws).
    The log-prob is under softmax(logits / T) without the top-p cut: what the trainer recomputes.
    """
    scaled = logits / params.temperature
    if params.greedy:
        tokens = logits.argmax(dim=-1)
    else:
        scores = top_p_filter(scaled, params.top_p) if params.top_p < 1.0 else scaled
        tokens = draw(scores.softmax(dim=-1))
    logp = scaled.gather(1, tokens[:, None]).squeeze(1) - torch.logsumexp(scaled, dim=-1)
    return tokens, logp


# ---------------------------------------------------------------------------------------- engines
class HFEngine:
    """Our sampling loop on a transformers model's KV cache: every prompt × group in one batch.

    Per call: prompts are tokenised once, left-padded and prefilled ONCE each (only the last
    position's logits are computed); the prompt KV cache is then repeated G times, so the G samples
    of a prompt share its prefill. A prefix all prompts share (a system prompt, few-shot turns) is
    prefilled once for the whole batch, then each prompt's own tokens on top of it. Each decode
    step is one batched forward of one token per row, one batched sampling call, and one host
    sync (are all rows done?). Rows that hit EOS stop being
    computed once ``drop_finished`` of the batch has finished (their cache rows are dropped), so a
    few long completions do not keep paying for many short ones. Log-probs of the sampled tokens
    come out of the same pass. bench/rollout.py measures this against ``model.generate``.
    """

    def __init__(self, model, tokenizer, max_batch: int = 512, drop_finished: float = 0.25,
                 min_shared_prefix: int = 16, draw: str = "inverse_cdf"):
        self.model = model
        self.tok = tokenizer
        # sequences per forward; a group is never split (one larger than this runs as one batch)
        self.max_batch = max_batch
        # a common prompt prefix at least this long is prefilled once for all prompts (shorter ones
        # are not worth the extra forward)
        self.min_shared_prefix = min_shared_prefix
        # fraction of the batch that must have finished before finished rows are dropped: dropping
        # copies the KV cache, so doing it on every single EOS costs more than it saves on big caches
        # (> 1 = never drop: with draw="multinomial", the random stream is ``model.generate``'s)
        self.drop_finished = drop_finished
        # how a token is drawn from the probabilities (DRAWS): "multinomial" reproduces generate's
        # random stream exactly, "inverse_cdf" (default) is the same distribution, cheaper on CPU
        self.draw = DRAWS[draw]
        if self.tok.pad_token_id is None:
            self.tok.pad_token = self.tok.eos_token
        self.tok.padding_side = "left"
        self._cache_arg = cache_arg(model)

    @torch.no_grad()  # not inference_mode: the trainer feeds these ids into a forward it backprops
    def generate(self, prompts: Sequence[Any], n: int, params: SamplingParams) -> Rollout:
        texts = [render_prompt(self.tok, p) for p in prompts]
        per_chunk = max(1, self.max_batch // n)
        was_training = self.model.training
        self.model.eval()
        try:
            parts = [self._generate(texts[i : i + per_chunk], n, params) for i in range(0, len(texts), per_chunk)]
        finally:
            self.model.train(was_training)
        return parts[0] if len(parts) == 1 else _concat(parts, self.tok.pad_token_id)

    def _forward(self, ids, attn, pos, cache) -> torch.Tensor:
        out = self.model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True,
                         logits_to_keep=1, **{self._cache_arg: cache})
        return out.logits[:, -1].float()  # (B, V)

    def _generate(self, texts: list[str], n: int, params: SamplingParams) -> Rollout:
        pad, stops = self.tok.pad_token_id, stop_ids(self.tok, self.model)
        ids = self.tok(texts, add_special_tokens=False)["input_ids"]
        dev = self.model.device
        stop_t = torch.tensor(stops, device=dev)
        cache = new_cache(self.model)
        # a prefix every prompt shares (system prompt, few-shot turns) is prefilled once; each prompt
        # keeps at least its last token, whose logits start its completion
        C = min(len(os.path.commonprefix(ids)), min(map(len, ids)) - 1) if len(ids) > 1 else 0
        if C >= self.min_shared_prefix:
            self._forward(torch.tensor([ids[0][:C]], device=dev), torch.ones((1, C), dtype=torch.long, device=dev),
                          torch.arange(C, device=dev)[None], cache)
            cache.batch_repeat_interleave(len(ids))
        else:
            C = 0
        # the prompts' own tokens, left-padded after the shared prefix: [prefix | pads | own tokens]
        own = left_pad([x[C:] for x in ids], pad)
        attn = torch.cat([torch.ones((len(ids), C), dtype=torch.long), left_pad_mask(ids, C)], 1)
        attn = attn.to(dev)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)  # each prompt's positions run 0.. over its real tokens
        logits = self._forward(own.to(dev), attn, pos[:, C:], cache)  # prefill, one row per prompt
        if n > 1:  # the group shares the prompt's prefill
            cache.batch_repeat_interleave(n)
            logits, attn = logits.repeat_interleave(n, 0), attn.repeat_interleave(n, 0)
        N, T = logits.shape[0], params.max_new_tokens
        next_pos = pos[:, -1].repeat_interleave(n) + 1  # (N,)
        tokens = torch.full((N, T), pad, dtype=torch.long, device=dev)
        logps = torch.zeros((N, T), dtype=torch.float32, device=dev)
        rows = torch.arange(N, device=dev)               # output row of each batch row
        live = torch.ones(N, dtype=torch.bool, device=dev)  # batch rows still generating
        width = 0
        for t in range(T):
            tok, lp = sample_next(logits, params, self.draw)
            tokens[rows, t] = torch.where(live, tok, pad)
            logps[rows, t] = torch.where(live, lp, 0.0)
            live &= ~torch.isin(tok, stop_t)
            width = t + 1
            n_live = int(live.sum())  # the one host sync per step
            if n_live == 0 or t == T - 1:
                break
            if n_live < len(rows) and len(rows) - n_live >= self.drop_finished * len(rows):
                keep = live.nonzero().squeeze(1)
                cache.batch_select_indices(keep)
                rows, attn, next_pos, tok, live = rows[keep], attn[keep], next_pos[keep], tok[keep], live[keep]
            attn = torch.cat([attn, attn.new_ones(len(rows), 1)], dim=1)
            logits = self._forward(tok[:, None], attn, next_pos[:, None], cache)
            next_pos = next_pos + 1
        comp, logps = tokens[:, :width].cpu(), logps[:, :width].cpu()
        mask, truncated = completion_mask(comp, stops)
        decoded = self.tok.batch_decode(comp, skip_special_tokens=True)
        prompt_ids = left_pad(ids, pad)  # the trainer's layout: plain left padding
        prompt_mask = left_pad_mask(ids, 0)
        return Rollout(prompt_ids.repeat_interleave(n, 0), prompt_mask.repeat_interleave(n, 0),
                       comp, mask, decoded, truncated, logps)


class GenerateEngine:
    """transformers ``model.generate`` over all prompts × group in one batch (left padding, KV cache).

    The reference implementation: tests check ``HFEngine`` against it, bench/rollout.py times both.
    Returns no log-probs.
    """

    def __init__(self, model, tokenizer, max_batch: int = 512):
        self.model = model
        self.tok = tokenizer
        self.max_batch = max_batch
        if self.tok.pad_token_id is None:
            self.tok.pad_token = self.tok.eos_token
        self.tok.padding_side = "left"

    @torch.no_grad()
    def generate(self, prompts: Sequence[Any], n: int, params: SamplingParams) -> Rollout:
        texts = [render_prompt(self.tok, p) for p in prompts for _ in range(n)]
        parts = [self._generate(texts[i : i + self.max_batch], params) for i in range(0, len(texts), self.max_batch)]
        if len(parts) == 1:
            return parts[0]
        return _concat(parts, self.tok.pad_token_id)

    def _generate(self, texts: list[str], params: SamplingParams) -> Rollout:
        from transformers import GenerationConfig

        enc = self.tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        gen = GenerationConfig(
            max_new_tokens=params.max_new_tokens,
            do_sample=not params.greedy,
            temperature=params.temperature if not params.greedy else None,
            top_p=params.top_p if not params.greedy else None,
            top_k=0 if not params.greedy else None,  # HF defaults to top-k 50: that would bias sampling
            pad_token_id=self.tok.pad_token_id,
            eos_token_id=stop_ids(self.tok, self.model),
        )
        was_training = self.model.training
        self.model.eval()
        try:
            out = self.model.generate(**enc.to(self.model.device), generation_config=gen).cpu()
        finally:
            self.model.train(was_training)
        P = enc["input_ids"].shape[1]
        comp = out[:, P:]
        mask, truncated = completion_mask(comp, stop_ids(self.tok, self.model))
        comp = torch.where(mask.bool(), comp, torch.full_like(comp, self.tok.pad_token_id))
        decoded = self.tok.batch_decode(comp, skip_special_tokens=True)
        return Rollout(enc["input_ids"].cpu(), enc["attention_mask"].cpu(), comp, mask, decoded, truncated)


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


def _concat(parts: list[Rollout], pad_id: int) -> Rollout:
    def cat(tensors, left: bool, value):
        width = max(t.shape[1] for t in tensors)
        padded = []
        for t in tensors:
            pad = torch.full((t.shape[0], width - t.shape[1]), value, dtype=t.dtype)
            padded.append(torch.cat([pad, t] if left else [t, pad], dim=1))
        return torch.cat(padded)

    has_logp = all(p.logprobs is not None for p in parts)
    return Rollout(
        cat([p.prompt_ids for p in parts], True, pad_id),
        cat([p.prompt_mask for p in parts], True, 0),
        cat([p.completion_ids for p in parts], False, pad_id),
        cat([p.completion_mask for p in parts], False, 0),
        [t for p in parts for t in p.texts],
        torch.cat([p.truncated for p in parts]),
        cat([p.logprobs for p in parts], False, 0.0) if has_logp else None,
    )


# ------------------------------------------------------------------ engine vs trainer log-probs
def logprob_mismatch(engine_logp: torch.Tensor, trainer_logp: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """How far the engine's sampled-token log-probs are from the trainer's, over masked tokens.

    ``rollout/logp_abs_diff_mean|max``: |trainer - engine| per token; ``rollout/logp_kl_k3``: the k3
    estimate of KL(engine || trainer) (engine = the sampling distribution); ``rollout/is_ratio_mean``:
    mean of p_trainer / p_engine (1 when they agree). On one HF model these are ~1e-6 (kernel
    round-off); vLLM (other kernels, bf16, fused sampling) shows real gaps worth watching.
    """
    m = mask.to(torch.bool)
    if not m.any():
        return {}
    d = (trainer_logp.detach().float() - engine_logp.float())[m]
    return {
        "rollout/logp_abs_diff_mean": d.abs().mean().item(),
        "rollout/logp_abs_diff_max": d.abs().max().item(),
        "rollout/logp_kl_k3": (d.exp() - 1 - d).mean().item(),
        "rollout/is_ratio_mean": d.exp().mean().item(),
    }


def tis_weights(trainer_logp: torch.Tensor, engine_logp: torch.Tensor, cap: float = 2.0) -> torch.Tensor:
    """Truncated importance sampling: per-token min(p_trainer / p_engine, cap), no gradient.

    Multiplying the per-token policy loss by this corrects for sampling from the engine's slightly
    different distribution (Yao et al., "Your efficient RL framework secretly brings you off-policy
    RL training", 2025); the cap bounds the variance. (N, T), same shape as the inputs.
    """
    return (trainer_logp.detach().float() - engine_logp.float()).exp().clamp(max=cap)


# ------------------------------------------------------------------------------------ registry
def vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None


def _vllm_engine(model, tokenizer, **kwargs):
    from .engines.vllm import VLLMEngine  # lazy: vllm is an optional extra

    return VLLMEngine(model, tokenizer, **kwargs)


def auto_engine_name() -> str:
    """What ``engine: auto`` picks here: vLLM when a GPU and vLLM are both present (where it pays off),
    else our HF loop."""
    return "vllm" if torch.cuda.is_available() and vllm_available() else "hf"


def auto_engine(model, tokenizer, **kwargs):
    return ENGINES[auto_engine_name()](model, tokenizer, **kwargs)


ENGINES = {"hf": HFEngine, "hf-generate": GenerateEngine, "vllm": _vllm_engine, "auto": auto_engine}
