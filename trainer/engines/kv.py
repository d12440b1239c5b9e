"""The sampler's KV cache: transformers' ``DynamicCache`` whose full-attention layers write in place.

``DynamicLayer.update`` concatenates, so every decode step copies each layer's whole cache to append one
position: on SmolLM2-135M's decode shape (32 rows, ~150 positions) that copy took about as long as the
attention reading it (0.55 vs 0.52 ms per layer per step, one thread). Here each layer keeps its keys and
values in a buffer with room for the whole call (``capacity`` positions: prompt + completion, doubled if a
call ever needs more), a step writes its positions into it, and attention reads a view of the filled part.
The view is strided over rows and heads only; torch's CPU attention gives bitwise the result it gives on a
contiguous copy (measured under AVX-512, AVX2 and the portable kernels; tests/test_kv_cache.py checks the
tokens and log-probs). An earlier try (git 1b4bbb9) measured that view ~3x slower on a loaded AVX2 host;
bench/rollout.py's ``concat_kv`` column measures it in every run.

Only for no-grad sampling: writing in place into a tensor a graph has saved would break its backward (the
trainer's shared-prompt forward keeps the plain cache). Sliding-window and other layer kinds stay as
transformers builds them.
"""
from __future__ import annotations

import torch
from transformers.cache_utils import DynamicLayer

from ..rollout import new_cache


class InPlaceLayer(DynamicLayer):
    """A full-attention layer's cache in (B, H, capacity, D) buffers; ``keys``/``values`` are views of the
    filled positions, so everything transformers reads from a DynamicLayer (lengths, masks) is unchanged."""

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = capacity
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start = self.get_seq_length()
        end = start + key_states.shape[-2]
        if self._k is None or end > self._k.shape[-2]:
            self._grow(key_states, value_states, start, end)
        self._k[:, :, start:end] = key_states
        self._v[:, :, start:end] = value_states
        self._views(end)
        return self.keys, self.values

    def _grow(self, key_states, value_states, start: int, end: int) -> None:
        old = self._k.shape[-2] if self._k is not None else 0
        cap = max(self.capacity, end, 2 * old)
        B, H, _, D = key_states.shape
        k = key_states.new_empty((B, H, cap, D))
        v = value_states.new_empty((B, H, cap, value_states.shape[-1]))
        if start:
            k[:, :, :start] = self.keys
            v[:, :, :start] = self.values
        self._k, self._v = k, v

    def _views(self, length: int) -> None:
        self.keys, self.values = self._k[:, :, :length], self._v[:, :, :length]

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.get_seq_length() > 0:
            n = self.get_seq_length()
            self._k, self._v = self._k.repeat_interleave(repeats, 0), self._v.repeat_interleave(repeats, 0)
            self._views(n)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.get_seq_length() > 0:
            n = self.get_seq_length()
            self._k, self._v = self._k[indices], self._v[indices]
            self._views(n)

    def reset(self) -> None:
        self._k = self._v = None
        super().reset()


def decode_cache(model, capacity: int):
    """An empty cache for sampling up to ``capacity`` positions (prompt + completion) without a copy per step."""
    cache = new_cache(model)
    cache.layers = [InPlaceLayer(capacity) if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache
