"""The sampler's KV cache: transformers' ``DynamicCache`` whose full-attention layers write in place.

``DynamicLayer.update`` concatenates: every decode step copies each layer's whole cache to append one
position, so a step costs a copy of the entire KV cache on top of reading it. Here each layer keeps its
keys and values in a buffer with room for the whole completion (``capacity`` positions, doubled if a call
ever needs more) and a decode step writes its position into it; attention reads the whole buffer, its
unfilled positions masked (``InPlaceLayer``). Masked positions weigh exactly zero, so decoding is unchanged
token for token (tests/test_kv_cache.py). Only for no-grad sampling: writing in place into a tensor a
graph has saved would break its backward (the trainer's shared-prompt forward keeps the plain cache).
Sliding-window and other layer kinds stay as transformers builds them.
"""
from __future__ import annotations

import torch
from transformers.cache_utils import DynamicLayer

from ..rollout import new_cache


class InPlaceLayer(DynamicLayer):
    """A full-attention layer's cache in a (B, H, capacity, D) buffer, zeros past its first ``length``
    positions. Once the buffer exists, attention reads all of it (contiguous: the CPU attention kernel is
    ~3x slower on a strided view of the filled part) and the padding mask, which transformers pads with
    zeros to ``get_mask_sizes``, hides the unfilled positions; the call that allocates it reads the filled
    part only, as the mask sizes said before that call."""

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = capacity
        self._k = self._v = None
        self.length = 0

    def _fits(self, n: int) -> bool:
        return self._k is not None and self.length + n <= self._k.shape[-2]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return (self._k.shape[-2] if self._fits(query_length) else self.length + query_length), 0

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = key_states.shape[-2]
        fits, start, end = self._fits(n), self.length, self.length + n
        if not fits:
            self._grow(key_states, value_states, end)
        self._k[:, :, start:end] = key_states
        self._v[:, :, start:end] = value_states
        self.length = end
        self._views()
        return (self._k, self._v) if fits else (self._k[:, :, :end], self._v[:, :, :end])

    def _grow(self, key_states, value_states, end: int) -> None:
        cap = max(self.capacity, end, 2 * (self._k.shape[-2] if self._k is not None else 0))
        B, H, _, D = key_states.shape
        # zeros, not garbage: a masked position's weight is exactly 0, and 0 * NaN would not be
        k = key_states.new_zeros((B, H, cap, D))
        v = value_states.new_zeros((B, H, cap, value_states.shape[-1]))
        if self.length:
            k[:, :, : self.length] = self._k[:, :, : self.length]
            v[:, :, : self.length] = self._v[:, :, : self.length]
        self._k, self._v = k, v

    def _views(self) -> None:  # what DynamicLayer's readers (and people) see: the filled positions
        self.keys, self.values = self._k[:, :, : self.length], self._v[:, :, : self.length]

    def get_seq_length(self) -> int:
        return self.length if self.is_initialized else 0

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.length:
            self._k, self._v = self._k.repeat_interleave(repeats, 0), self._v.repeat_interleave(repeats, 0)
            self._views()

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.length:
            self._k, self._v = self._k[indices], self._v[indices]
            self._views()

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative count of positions to remove")
        if tokens_to_remove and self.length:
            self.length = max(0, self.length + tokens_to_remove)
            self._k[:, :, self.length :] = 0
            self._v[:, :, self.length :] = 0
            self._views()

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self.batch_select_indices(beam_idx.to(self._k.device) if self._k is not None else beam_idx)

    def reset(self) -> None:
        self._k = self._v = None
        self.length = 0
        super().reset()


def decode_cache(model, capacity: int):
    """An empty cache for sampling up to ``capacity`` positions (prompt + completion) without a copy per step."""
    cache = new_cache(model)
    cache.layers = [InPlaceLayer(capacity) if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache
