"""Rollout engines: sample a group of completions per prompt.

An engine returns token ids in one padded layout the trainer can score without re-tokenising:
prompts LEFT-padded (so every completion starts at the same column), completions RIGHT-padded,
and a mask that covers each completion up to and including its end-of-sequence token.
The trainer recomputes log-probs with its own model (one forward), so engines need not return them.
"""
from __future__ import annotations

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


def completion_mask(ids: torch.Tensor, eos_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Mask (N, T) through the first EOS inclusive, and (N,) truncated flags."""
    is_eos = ids == eos_id
    # count EOS strictly before each position; keep positions with none before them
    before = torch.cumsum(is_eos.int(), dim=1) - is_eos.int()
    mask = (before == 0).to(torch.long)
    truncated = ~is_eos.any(dim=1)
    return mask, truncated


class HFEngine:
    """transformers ``generate`` over all prompts × group in one batch (left padding, KV cache)."""

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
            eos_token_id=self.tok.eos_token_id,
        )
        was_training = self.model.training
        self.model.eval()
        try:
            out = self.model.generate(**enc, generation_config=gen)
        finally:
            self.model.train(was_training)
        P = enc["input_ids"].shape[1]
        comp = out[:, P:]
        mask, truncated = completion_mask(comp, self.tok.eos_token_id)
        comp = torch.where(mask.bool(), comp, torch.full_like(comp, self.tok.pad_token_id))
        decoded = self.tok.batch_decode(comp, skip_special_tokens=True)
        return Rollout(enc["input_ids"], enc["attention_mask"], comp, mask, decoded, truncated)


def _concat(parts: list[Rollout], pad_id: int) -> Rollout:
    def cat(tensors, left: bool, value: int):
        width = max(t.shape[1] for t in tensors)
        padded = []
        for t in tensors:
            pad = torch.full((t.shape[0], width - t.shape[1]), value, dtype=t.dtype)
            padded.append(torch.cat([pad, t] if left else [t, pad], dim=1))
        return torch.cat(padded)

    return Rollout(
        cat([p.prompt_ids for p in parts], True, pad_id),
        cat([p.prompt_mask for p in parts], True, 0),
        cat([p.completion_ids for p in parts], False, pad_id),
        cat([p.completion_mask for p in parts], False, 0),
        [t for p in parts for t in p.texts],
        torch.cat([p.truncated for p in parts]),
    )


ENGINES = {"hf": HFEngine, "auto": HFEngine}
