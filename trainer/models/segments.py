"""A batch's real tokens as one row: each distinct prompt once, then each completion (CPU forwards).

trainer/batch.py's shared-prompt forward ran two model calls per micro-batch: the distinct prompts, then every
row's completion over its prompt's keys and values gathered from a cache. Each call kept a (rows, columns) layout,
so every layer's products took the real positions out of it and put them back (``_real_rows``: five scatters and
three gathers of hidden-sized rows per layer, forward and backward), its norms and residual adds ran over the
padding, and each weight multiplied the prompts' few rows and the completions' rows in two products.

Here the model runs once, on one row of the real tokens only: the prompts' (all but each one's last token), then
the completions' (each led by its prompt's last token: the positions that predict a completion token). Position
ids restart per sequence, so the rotary embedding is each token's own. Everything but attention is per token and
runs on those rows as they are; :class:`Segments` gives attention its structure: each prompt attends causally
within itself, each completion to its prompt and causally to itself. Same sums as the two-call forward (the
products' rows are concatenated, not changed): tests/test_batch.py compares them.

A float32 row attends in csrc/segment_attend.cpp instead (head sizes 32, 64, 128): the row as it is, each prompt
and completion a unit whose keys are read where they sit, with no layout copies, no mask and no concatenation;
with a graph, one autograd node whose backward recomputes the weights from each query's log-sum-exp. SmolLM2's
critic forward: ~5.6 → ~2.4 ms a layer (1.06-1.09x the forward); the update 1.06x, the bundled tiny model's
1.17x (RESULTS "Session 73"). Other dtypes and head sizes keep torch's kernels below.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from ..engines import native
from .attention import NAME

# Where the kernel does not apply (above): a completion call whose queries x keys per head are at most this many, on
# a graph a backward will follow, runs torch's math attention (products, softmax, products; its backward the same)
# instead of the flash kernel, for float32 models whose query heads each have their own key/value head. The flash
# kernel's backward took ~8 us per (row, head) block of the bundled tiny model's completion call (256 rows x 4 heads,
# 12 queries x 22 keys, head size 32): 11.4 ms forward and backward against math's 7.0 at one thread, 9.9 against 4.1
# at two; the tiny model's update 1.06x faster. At 24 x 48 the two are about even (5.8 against 5.5 ms), at 24 x 84
# the flash kernel is ahead (4.1 against 4.5), and always where query heads share a key/value head (math copies it
# to each) or without a backward (RESULTS "Session 70").
MATH_MAX_SCORES = 1024

ENABLED = True  # csrc/segment_attend.cpp (module docstring); bench/update.py's peer and tests switch it off

# the model types whose layers pass position ids to their rotary embedding and the forward's keywords down to the
# attention function, and whose attention is plain softmax attention over its keys (no sliding window by default)
MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral")


@dataclass
class Segments:
    """Where each prompt's and completion's tokens sit in the packed row, and the layouts attention runs in."""
    n_prompt: int               # packed rows 0..n_prompt-1: the prompts' tokens (each prompt but its last one)
    n: int                      # all packed rows: then the completions' tokens
    prompt_src: torch.Tensor    # (U * Pm,) packed row of each (prompt, column), right-padded (padding reads row 0)
    comp_src: torch.Tensor      # (B * Tm,) packed row of each (completion, column), right-padded
    key_src: torch.Tensor       # (B * (Pm + Tm),) a completion's keys: its prompt's columns, then its own
    comp_mask: torch.Tensor     # (B, 1, Tm, Pm + Tm) bool: which keys each completion query reads
    out_src: torch.Tensor       # (n,) each packed row's place in [prompt layout rows, completion layout rows]
    shape: tuple[int, int, int, int]  # U, Pm, B, Tm
    # (U + B, 4): each prompt's and completion's queries (first row, count) and the keys before its own (first
    # row, count): the packed row as it is, for csrc/segment_attend.cpp
    units: torch.Tensor

    @classmethod
    def build(cls, prompt_len: torch.Tensor, inv: torch.Tensor, comp_len: torch.Tensor) -> Segments:
        """``prompt_len`` (U,): each distinct prompt's tokens in the prompt part (its real tokens but the last);
        ``inv`` (B,): each row's prompt; ``comp_len`` (B,): each row's tokens in the completion part."""
        U, B = len(prompt_len), len(comp_len)
        Pm, Tm = int(prompt_len.max()) if U else 0, int(comp_len.max()) if B else 0
        n_prompt = int(prompt_len.sum())
        p_col = torch.arange(Pm)
        p_valid = p_col < prompt_len[:, None]                               # (U, Pm)
        p_start = torch.cumsum(prompt_len, 0) - prompt_len
        prompt_src = torch.where(p_valid, p_start[:, None] + p_col, 0)
        c_col = torch.arange(Tm)
        c_valid = c_col < comp_len[:, None]                                 # (B, Tm)
        c_start = n_prompt + torch.cumsum(comp_len, 0) - comp_len
        comp_src = torch.where(c_valid, c_start[:, None] + c_col, 0)
        key_src = torch.cat([prompt_src[inv], comp_src], dim=1)             # (B, Pm + Tm)
        causal = c_col[None, :] <= c_col[:, None]                           # (Tm, Tm)
        mask = torch.cat([p_valid[inv][:, None, :].expand(B, Tm, Pm), causal[None] & c_valid[:, None, :]], dim=2)
        # a padding query reads every key: its output is dropped, and a row with no key at all would be NaN
        mask = mask | ~c_valid[:, :, None]
        out_src = torch.cat([(torch.arange(U * Pm).view(U, Pm))[p_valid],
                             U * Pm + torch.arange(B * Tm).view(B, Tm)[c_valid]])
        units = torch.cat([torch.stack([p_start, prompt_len, torch.zeros_like(p_start), torch.zeros_like(p_start)], 1),
                           torch.stack([c_start, comp_len, p_start[inv], prompt_len[inv]], 1)]).long()
        return cls(n_prompt, n_prompt + int(comp_len.sum()), prompt_src.reshape(-1), comp_src.reshape(-1),
                   key_src.reshape(-1), mask[:, None], out_src, (U, Pm, B, Tm), units)

    def attend(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling: float | None,
               dropout: float = 0.0) -> torch.Tensor:
        """Attention over the packed row: query (1, H, n, d), key/value (1, Hkv, n, d) -> (1, n, H, d)."""
        U, Pm, B, Tm = self.shape
        heads, kv_heads = query.shape[1], key.shape[1]
        gqa = heads != kv_heads and query.dtype == torch.float32  # torch's CPU kernel reads a kv head per group
        q, k, v = (x[0].transpose(0, 1) for x in (query, key, value))  # (n, heads, d)
        kernel = _kernel(query, key, value, dropout)
        if kernel is not None:
            scale = q.shape[-1] ** -0.5 if scaling is None else scaling
            if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
                return _Attend.apply(q, k, v, self.units, scale, kernel).unsqueeze(0)
            return kernel.segment_attend(q, k, v, self.units, scale).unsqueeze(0)
        if not gqa and heads != kv_heads:  # other dtypes: the key/value heads copied per query head, as transformers
            k, v = (x.repeat_interleave(heads // kv_heads, dim=1) for x in (k, v))
        sdpa = torch.nn.functional.scaled_dot_product_attention
        kw = {"dropout_p": dropout, "scale": scaling, **({"enable_gqa": True} if gqa else {})}
        outs = []
        if Pm:  # right-padded: causal alone keeps a real query off the padding after its prompt
            layout = lambda x: x.index_select(0, self.prompt_src).view(U, Pm, *x.shape[1:]).transpose(1, 2)  # noqa: E731
            outs.append(sdpa(layout(q), layout(k), layout(v), is_causal=True, **kw).transpose(1, 2).reshape(
                U * Pm, heads, -1))
        if Tm:
            qc = q.index_select(0, self.comp_src).view(B, Tm, *q.shape[1:]).transpose(1, 2)
            kc, vc = (x.index_select(0, self.key_src).view(B, Pm + Tm, *x.shape[1:]).transpose(1, 2) for x in (k, v))
            math = (Tm * (Pm + Tm) <= MATH_MAX_SCORES and heads == kv_heads and query.dtype == torch.float32
                    and torch.is_grad_enabled() and query.requires_grad)
            with sdpa_kernel(SDPBackend.MATH) if math else contextlib.nullcontext():
                oc = sdpa(qc, kc, vc, attn_mask=self.comp_mask, **kw)
            outs.append(oc.transpose(1, 2).reshape(B * Tm, heads, -1))
        out = torch.cat(outs) if len(outs) > 1 else outs[0]
        return out.index_select(0, self.out_src).unsqueeze(0)


def kernel_fits(dtype: torch.dtype, head_dim: int, heads: int, kv_heads: int) -> bool:
    """Whether csrc/segment_attend.cpp takes a row of these heads (and is switched on): float32, head size 32, 64 or
    128, query heads a multiple of key/value heads. bench/_ceilings.py counts attention's work by it too."""
    return ENABLED and dtype == torch.float32 and head_dim in (32, 64, 128) and heads % kv_heads == 0


def _kernel(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, dropout: float):
    """csrc/segment_attend.cpp where it applies (``kernel_fits``, on the CPU, no dropout); None elsewhere (torch's
    kernels below)."""
    if (query.device.type != "cpu" or not query.dtype == key.dtype == value.dtype or dropout
            or not kernel_fits(query.dtype, query.shape[-1], query.shape[1], key.shape[1])):
        return None
    return native.segment_attend()


class _Attend(torch.autograd.Function):
    """The kernel's attention as one node: its forward keeps each query's log-sum-exp, its backward recomputes the
    weights from them (csrc/segment_attend.cpp ``backward``)."""

    @staticmethod
    def forward(ctx, q, k, v, units, scale, kernel):
        out, lse = kernel.forward(q, k, v, units, scale, True)
        ctx.save_for_backward(q, k, v, out, lse, units)
        ctx.scale, ctx.kernel = scale, kernel
        return out

    @staticmethod
    def backward(ctx, g):
        q, k, v, out, lse, units = ctx.saved_tensors
        dq, dk, dv = ctx.kernel.backward(q, k, v, out, g.contiguous(), lse, units, ctx.scale)
        return dq, dk, dv, None, None, None


def eligible(model) -> bool:
    """Whether ``model`` can run a packed row: a CPU model of a listed type on transformers' SDPA attention (or
    ours, trainer/models/attention.py), every layer full attention."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    cfg, device = getattr(base, "config", None), getattr(base, "device", None)
    if cfg is None or device is None or device.type != "cpu" or getattr(cfg, "model_type", None) not in MODEL_TYPES:
        return False
    text = cfg.get_text_config()
    return (getattr(cfg, "_attn_implementation", None) in ("sdpa", NAME)
            and getattr(text, "sliding_window", None) is None
            and all(t == "full_attention" for t in (getattr(text, "layer_types", None) or ())))
