"""Our rollout engines on a transformers model: the KV-cache sampler (``hf``) and ``model.generate``
(``hf-generate``, the reference the tests and bench/rollout.py compare against)."""
from __future__ import annotations

import os
from contextlib import nullcontext
from typing import Any, Sequence

import torch

from ..algos import upcast
from ..models.attention import SHARED_KV, shared_prompt_attention
from ..rollout import (
    DRAWS,
    Rollout,
    SamplingParams,
    StopStrings,
    cache_arg,
    completion_mask,
    concat,
    cut_at,
    left_pad,
    left_pad_mask,
    new_cache,
    render_prompt,
    sample_next,
    stop_ids,
)
from .kv import decode_cache, share_prompts
from .packed import packed_linears


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
    (and, asked, each position's entropy) come out of the same pass. Decode writes into a preallocated
    KV cache (trainer/engines/kv.py); on the CPU the linear layers use weights packed once per call where
    that measured faster (trainer/engines/packed.py).
    bench/rollout.py measures this against ``model.generate``.
    """

    def __init__(self, model, tokenizer, max_batch: int = 512, drop_finished: float = 0.25,
                 min_shared_prefix: int = 16, draw: str = "inverse_cdf", packed: bool = True,
                 inplace_kv: bool = True, shared_prompts: bool = True, native_attention: bool = True):
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
        # float32 CPU linears on weights packed (MKL or oneDNN) for the call (False: the stock layers, the bench's peer)
        self.packed = packed
        # decode writes each position into a preallocated cache (engines/kv.py; False: transformers' concatenation)
        self.inplace_kv = inplace_kv
        # a group's samples read their prompt's keys and values once per decode step (engines/kv.py
        # SharedPromptLayer; needs inplace_kv and transformers' SDPA attention on the CPU; False: each row its copy)
        self.shared_prompts = shared_prompts
        # with shared prompts, each row's own keys and the merge in our kernel where it builds here (engines/native.py;
        # False: torch's flash kernel for that part too, the bench's peer)
        self.native_attention = native_attention
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
            with packed_linears(self.model, min(len(texts), per_chunk) * n, params.max_new_tokens, self.packed), \
                    self._attention() as shared:
                parts = [self._generate(texts[i : i + per_chunk], n, params, shared)
                         for i in range(0, len(texts), per_chunk)]
        finally:
            self.model.train(was_training)
        return parts[0] if len(parts) == 1 else concat(parts, self.tok.pad_token_id)

    @torch.no_grad()
    def generate_ids(self, ids: list[list[int]], n: int, params: SamplingParams,
                     stops: Sequence[int] | None = None) -> Rollout:
        """``generate`` on prompts that are token ids already (the training primitives' ``sample``);
        ``stops``: the token ids that end a completion (default: the tokenizer's and model's EOS)."""
        was_training = self.model.training
        self.model.eval()
        try:
            with packed_linears(self.model, len(ids) * n, params.max_new_tokens, self.packed), \
                    self._attention() as shared:
                return self._generate_ids(ids, n, params, stops, shared)
        finally:
            self.model.train(was_training)

    def _attention(self):
        if self.shared_prompts and self.inplace_kv:
            return shared_prompt_attention(self.model)
        return nullcontext(False)

    def _forward(self, ids, attn, pos, cache, shared: bool = False) -> torch.Tensor:
        extra = {SHARED_KV: cache} if shared else {}
        out = self.model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True,
                         logits_to_keep=1, **{self._cache_arg: cache}, **extra)
        return upcast(out.logits[:, -1])  # (B, V), float32 at least (a float64 model keeps float64)

    def _generate(self, texts: list[str], n: int, params: SamplingParams, shared: bool = False) -> Rollout:
        return self._generate_ids(self.tok(texts, add_special_tokens=False)["input_ids"], n, params, shared=shared)

    def _generate_ids(self, ids: list[list[int]], n: int, params: SamplingParams,
                      stops: Sequence[int] | None = None, shared: bool = False) -> Rollout:
        pad = self.tok.pad_token_id
        stops = list(stops) if stops is not None else stop_ids(self.tok, self.model)
        dev = self.model.device
        stop_t = torch.tensor(stops, dtype=torch.long, device=dev)
        capacity = max(map(len, ids)) + params.max_new_tokens  # every position this call can write
        shared = shared and n > 1  # the attention allows it; a group of one has nothing to share
        cache = decode_cache(self.model, capacity, shared, self.native_attention) if self.inplace_kv \
            else new_cache(self.model)
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
        if n > 1:  # the group shares the prompt's prefill: its keys and values once, or a copy per row
            shared = shared and share_prompts(cache, n, attn)
            if not shared:
                cache.batch_repeat_interleave(n)
            logits, attn = logits.repeat_interleave(n, 0), attn.repeat_interleave(n, 0)
        if shared:
            # its decode steps' attention masks the prompts' padding itself (SharedPromptLayer.attend, and its
            # ``mask`` for the stock path): no mask carried here, none built by transformers at every step (the tiny
            # model's 16 x 16 x 12-token generate 1.03x faster, the same tokens and log-probs)
            attn = None
        N, T = logits.shape[0], params.max_new_tokens
        next_pos = pos[:, -1].repeat_interleave(n) + 1  # (N,)
        tokens = torch.full((N, T), pad, dtype=torch.long, device=dev)
        logps = torch.zeros((N, T), dtype=torch.float32, device=dev)
        ents = torch.zeros((N, T), dtype=torch.float32, device=dev) if params.entropy and not params.greedy else None
        rows = torch.arange(N, device=dev)               # output row of each batch row
        live = torch.ones(N, dtype=torch.bool, device=dev)  # batch rows still generating
        width = 0
        strings = StopStrings(self.tok, params.stop)
        ends: list[int | None] = [None] * N  # output rows ended by a stop string: their length
        for t in range(T):
            tok, lp, ent = sample_next(logits, params, self.draw)
            tokens[rows, t] = torch.where(live, tok, pad)
            logps[rows, t] = torch.where(live, lp, 0.0).to(logps.dtype)
            if ents is not None:
                ents[rows, t] = torch.where(live, ent, 0.0).float()
            live &= ~torch.isin(tok, stop_t)
            if strings:
                hit = strings.hits(tokens[rows, max(0, t + 1 - strings.window) : t + 1].cpu()).to(dev) & live
                for r in rows[hit].tolist():
                    ends[r] = t + 1
                live &= ~hit
            width = t + 1
            n_live = int(live.sum())  # the one host sync per step
            if n_live == 0 or t == T - 1:
                break
            if n_live < len(rows) and len(rows) - n_live >= self.drop_finished * len(rows):
                keep = live.nonzero().squeeze(1)
                cache.batch_select_indices(keep)
                rows, next_pos, tok, live = rows[keep], next_pos[keep], tok[keep], live[keep]
                attn = attn[keep] if attn is not None else None
            if attn is not None:
                attn = torch.cat([attn, attn.new_ones(len(rows), 1)], dim=1)
            logits = self._forward(tok[:, None], attn, next_pos[:, None], cache, shared)
            next_pos = next_pos + 1
        comp, logps = tokens[:, :width].cpu(), logps[:, :width].cpu()
        mask, truncated = cut_at(*completion_mask(comp, stops), ends)
        ents = ents[:, :width].cpu() * mask if ents is not None else None
        decoded = self.tok.batch_decode(comp, skip_special_tokens=True)
        prompt_ids = left_pad(ids, pad)  # the trainer's layout: plain left padding
        prompt_mask = left_pad_mask(ids, 0)
        return Rollout(prompt_ids.repeat_interleave(n, 0), prompt_mask.repeat_interleave(n, 0),
                       comp, mask, decoded, truncated, logps, entropy=ents)


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
        return concat(parts, self.tok.pad_token_id)

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
            stop_strings=list(params.stop) or None,
        )
        was_training = self.model.training
        self.model.eval()
        try:
            out = self.model.generate(**enc.to(self.model.device), generation_config=gen,
                                      tokenizer=self.tok if params.stop else None).cpu()
        finally:
            self.model.train(was_training)
        P = enc["input_ids"].shape[1]
        comp = out[:, P:]
        mask, truncated = completion_mask(comp, stop_ids(self.tok, self.model))
        strings = StopStrings(self.tok, params.stop)
        if strings:  # generate pads a row that met a stop string: its mask ends at that token
            mask, truncated = cut_at(mask, truncated, strings.ends(comp, mask))
        comp = torch.where(mask.bool(), comp, torch.full_like(comp, self.tok.pad_token_id))
        decoded = self.tok.batch_decode(comp, skip_special_tokens=True)
        return Rollout(enc["input_ids"].cpu(), enc["attention_mask"].cpu(), comp, mask, decoded, truncated)
