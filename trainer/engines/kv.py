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
from . import native as kernels


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
        start = DynamicLayer.get_seq_length(self)  # this buffer's filled positions (a subclass may count more)
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


_flash_cpu = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu  # (output, logsumexp)


class SharedPromptLayer(InPlaceLayer):
    """An ``InPlaceLayer`` whose decode keeps each prompt's keys and values ONCE for its group of ``n`` samples.

    A GRPO group's ``n`` rows share their prompt, yet ``batch_repeat_interleave(n)`` copies its keys and values
    to every row, and each decode step then reads every copy: on SmolLM2-135M's bench shape (~60-token prompts,
    groups of 8, 32 new tokens) the copies are ~2/3 of the attention's reads. After ``share`` the prefill's
    buffers stay one row per prompt (``prompt_k``/``prompt_v``: (G, H, P, D)), the completions' positions go to
    per-row buffers (``keys``/``values``: (rows, H, t, D)), and attention (``attend``, reached through our
    attention function in trainer/models/attention.py) reads a prompt once for all its rows' queries, then merges
    that part with each row's own part by their log-sum-exps.
    ``native``: the own part and the merge in our kernel (trainer/engines/csrc/decode_merge.cpp) where it runs here;
    False: torch's flash kernel for both parts (the bench's peer).
    """

    def __init__(self, capacity: int, native: bool = True):
        super().__init__(capacity)
        self.native = native
        self.prompt_k: torch.Tensor | None = None
        self.prompt_v: torch.Tensor | None = None
        self.prompt_bias: torch.Tensor | None = None  # (G, 1, 1, P): 0 on a prompt's tokens, -inf on its padding
        self.slots: torch.Tensor | None = None  # (rows,): each live row's place g * n + i among the G x n samples
        self.groups: torch.Tensor | None = None  # (rows,): each live row's prompt, slots // n
        self.n = 1

    @property
    def shared(self) -> bool:
        return self.prompt_k is not None

    def share(self, n: int, prompt_bias: torch.Tensor) -> None:
        """The prefill is done: from now on each of its rows (prompts) is decoded by ``n`` sample rows."""
        P = super().get_seq_length()
        self.prompt_k, self.prompt_v = self.keys, self.values  # views of the prefill's buffers
        G, H, _, D = self.prompt_k.shape
        room = max(self.capacity - P, 1)
        self._k = self.prompt_k.new_empty((G * n, H, room, D))
        self._v = self.prompt_v.new_empty((G * n, H, room, self.prompt_v.shape[-1]))
        self.prompt_bias, self.n = prompt_bias, n
        self.slots = torch.arange(G * n, device=self.prompt_k.device)
        self.groups = self.slots // n
        self._views(0)

    def get_seq_length(self) -> int:
        if not self.shared:
            return super().get_seq_length()
        return self.prompt_k.shape[-2] + self.keys.shape[-2]

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if not self.shared:
            return super().batch_select_indices(indices)
        t = self.keys.shape[-2]
        self.slots, self._k, self._v = self.slots[indices], self._k[indices], self._v[indices]
        self.groups = self.groups[indices]
        self._views(t)

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.shared:
            raise RuntimeError("a shared-prompt cache's rows are already its prompts' samples")
        super().batch_repeat_interleave(repeats)

    def full(self, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The per-row layout (each row: its prompt's copy, then its own positions), for attention that cannot
        take ``attend``'s path."""
        if not self.shared:
            return key, value
        rows = self.groups
        return (torch.cat([self.prompt_k.index_select(0, rows), key], 2),
                torch.cat([self.prompt_v.index_select(0, rows), value], 2))

    def mask(self, dtype: torch.dtype, keys: int) -> torch.Tensor:
        """The additive mask of ``full``'s layout for ``keys`` keys (the prompt's, then the row's own), (rows, 1, 1,
        keys): -inf on a prompt's padding, 0 elsewhere (a row's own keys are all real: a finished row stops being
        decoded)."""
        bias = self.prompt_bias.index_select(0, self.groups).to(dtype)
        own = bias.new_zeros(bias.shape[:-1] + (keys - bias.shape[-1],))
        return torch.cat([bias, own], -1)

    def attend(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               scaling: float | None) -> torch.Tensor | None:
        """One decode step's attention for ``query`` (rows, Hq, 1, D) over the shared prompts and each row's own
        completion; returns (rows, 1, Hq, D), transformers' attention-output layout.

        float32 with ``native``: the whole step in our kernel (csrc/decode_attend.cpp), each query's one softmax over
        its group's prompt keys and its own; a decode step of the bundled tiny model 1.13x faster than the two parts
        below (bench/RESULTS.md, session 72). Otherwise the prompt part is one call of torch's CPU flash-attention
        kernel, which also returns each query's log-sum-exp, with a group's ``n`` rows x (Hq / Hkv) query heads as
        the query rows of its prompt's key/value heads; the completion part per row and the merge: our other kernel
        (``native``, float64 here), else a second flash call. The two partial softmaxes merge exactly by their
        log-sum-exps, o = (o1 e^(l1 - m) + o2 e^(l2 - m)) / (e^(l1 - m) + e^(l2 - m)); only the rounding differs from
        one softmax over all keys (tests/test_kv_cache.py: both paths no further from a float64 reference than the
        stock one). That kernel's part: tiny model (256 rows x 4 heads, 1-12 own keys) 1.5-2x faster, SmolLM2's
        shapes 1.1-1.7x (RESULTS, session 68).
        None (use ``full``) before ``share`` and for anything but one new position per row."""
        if not self.shared or query.shape[2] != 1:
            return None
        pk, pv, ck, cv = self.prompt_k, self.prompt_v, key, value
        G, Hkv, P, D = pk.shape
        rows, Hq = query.shape[0], query.shape[1]
        grp, n = Hq // Hkv, self.n
        q = query.reshape(rows, Hkv, grp, D)
        whole = kernels.decode_attend() if self.native and query.dtype == torch.float32 else None
        if whole is not None:  # float32: both parts and one softmax in our kernel (csrc/decode_attend.cpp)
            scale = scaling if scaling is not None else D ** -0.5  # SDPA's default
            bias = self.prompt_bias.reshape(G, P).contiguous()
            return whole(q, pk, pv, bias, self.groups, ck, cv, scale).reshape(rows, 1, Hq, D)
        full = rows == G * n  # no row dropped yet: the rows are the G x n samples in order
        qg = q if full else q.new_zeros((G * n, Hkv, grp, D)).index_copy_(0, self.slots, q)
        qg = qg.view(G, n, Hkv, grp, D).transpose(1, 2).reshape(G, Hkv, n * grp, D)
        o1, l1 = _flash_cpu(qg, pk, pv, attn_mask=self.prompt_bias, scale=scaling)
        o1 = o1.view(G, Hkv, n, grp, D).transpose(1, 2).reshape(G * n, Hkv, grp, D)
        l1 = l1.view(G, Hkv, n, grp).transpose(1, 2).reshape(G * n, Hkv, grp)
        if not full:
            o1, l1 = o1.index_select(0, self.slots), l1.index_select(0, self.slots)
        merge = kernels.own_keys_merge() if self.native and query.dtype in (torch.float32, torch.float64) else None
        if merge is not None:
            scale = scaling if scaling is not None else D ** -0.5  # SDPA's default
            return merge(q, ck, cv, o1, l1.to(query.dtype), scale).reshape(rows, 1, Hq, D)
        o2, l2 = _flash_cpu(q, ck, cv, scale=scaling)
        acc = torch.float64 if query.dtype == torch.float64 else torch.float32
        m = torch.maximum(l1, l2)
        w1, w2 = (l1 - m).exp_().to(acc)[..., None], (l2 - m).exp_().to(acc)[..., None]
        out = (o1.to(acc) * w1 + o2.to(acc) * w2).div_(w1 + w2)
        return out.to(query.dtype).reshape(rows, 1, Hq, D)

    def reset(self) -> None:
        self.prompt_k = self.prompt_v = self.prompt_bias = self.slots = self.groups = None
        super().reset()


def share_prompts(cache, n: int, prompt_mask: torch.Tensor) -> bool:
    """After a prefill of one row per prompt: decode ``n`` samples per prompt with the prompts' keys and values
    held once (``SharedPromptLayer``) — when every layer of ``cache`` is one. Returns whether it did; the caller
    repeats the cache ``n`` times (``batch_repeat_interleave``) when not."""
    if not cache.layers or not all(isinstance(layer, SharedPromptLayer) for layer in cache.layers):
        return False
    keys = cache.layers[0].keys
    bias = torch.zeros(prompt_mask.shape, dtype=keys.dtype, device=keys.device)
    bias = bias.masked_fill(~prompt_mask.bool().to(keys.device), float("-inf"))[:, None, None, :]
    for layer in cache.layers:
        layer.share(n, bias)
    return True


def decode_cache(model, capacity: int, shared: bool = False, native: bool = True):
    """An empty cache for sampling up to ``capacity`` positions (prompt + completion) without a copy per step;
    ``shared``: its layers can hold a prompt once for its group of samples (``share_prompts``); ``native``: their
    decode attention may use our kernel (``SharedPromptLayer``)."""
    cache = new_cache(model)
    cache.layers = [(SharedPromptLayer(capacity, native) if shared else InPlaceLayer(capacity))
                    if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache
