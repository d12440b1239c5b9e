"""The rotary position embedding without its rotated copy, and its backward written out (CPU).

transformers rotates queries and keys as ``x * cos + rotate_half(x) * sin``, ``rotate_half(x) = cat(-x2, x1)``.
autograd's backward of that graph gives each half-slice its own zero-filled full-size gradient and sums them in
(``SliceBackward``, ``NegBackward``, the input buffer's adds): about ten kernels per tensor where the closed form
is four, ``g * cos + rotate_half_t(g * sin)`` with ``rotate_half_t(y) = cat(y2, -y1)``.

The forward computes each element as the stock expression does, the same two products and one sum, but writes the
rotated half's product into ``x * cos`` in place instead of building ``-x2``, the concatenated copy and a third
product (``_rotate``; forward passes without a graph, a reference's or a sampler's prefill, take it too). The
backward adds the same two terms at every position (the zeros autograd adds are exact): both are bitwise torch's own
(tests/test_rope.py). Where it can build, csrc/rope.cpp computes that forward for the queries and the keys in one
call, the same products and sums without FMA contraction, so the same bits: at a small model's decode step the
five to seven ops a tensor were mostly their fixed cost (the bundled tiny model's rollout 1.054x, RESULTS
"Session 73"). It runs only for float32 CPU queries and keys, constant ``cos``/``sin`` and no autocast;
anything else calls the stock function. It is installed in the modeling module of a policy's layers when that
module's ``apply_rotary_pos_emb`` and ``rotate_half`` are Llama's very code (Qwen2, Mistral and others copy them);
the function is a module global there, so every model of that family in the process calls it, and any call it does
not take goes to the stock one unchanged.
"""
from __future__ import annotations

import sys

import torch

from ..engines import native
from .norm import _same_code


def _rotate_half(x: torch.Tensor) -> torch.Tensor:  # Llama's
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def _rotate_half_t(g: torch.Tensor) -> torch.Tensor:  # its transpose: the gradient of rotate_half
    h = g.shape[-1] // 2
    return torch.cat((g[..., h:], -g[..., :h]), dim=-1)


# From this many elements of a query or key tensor, each half is written into the product ``x * cos`` in place
# (``_rotate``): no negated half, no concatenated copy, no third full-size tensor. One thread on an Intel Xeon
# (AVX-512), stock against in place: 2.79 against 0.65 ms for SmolLM2's (1, 9, 836, 64) queries, 0.64 against 0.41
# at 420 tokens, 0.19 against 0.11 for a 256-row decode step's; below ~40k elements the two extra calls cost more
# than the copies (a 32-row decode step: 41 against 52 us).
IN_PLACE_FROM = 1 << 16


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x * cos + rotate_half(x) * sin``, bit for bit: each output element is the same two products and one sum,
    since (-a) * b is -(a * b) and c + (-d) is c - d exactly in IEEE arithmetic."""
    h = x.shape[-1] // 2
    if x.numel() < IN_PLACE_FROM or x.shape[-1] % 2:
        return (x * cos) + (_rotate_half(x) * sin)
    out = x * cos
    out[..., :h].sub_(x[..., h:] * sin[..., :h])
    out[..., h:].add_(x[..., :h] * sin[..., h:])
    return out


def _rotate_t(g: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The gradient of ``_rotate``'s input, ``g * cos + rotate_half_t(g * sin)``, bit for bit likewise."""
    h = g.shape[-1] // 2
    if g.numel() < IN_PLACE_FROM or g.shape[-1] % 2:
        return (g * cos).add_(_rotate_half_t(g * sin))
    out = g * cos
    out[..., :h].add_(g[..., h:] * sin[..., h:])
    out[..., h:].sub_(g[..., :h] * sin[..., :h])
    return out


ENABLED = True  # csrc/rope.cpp for the forward; tests switch it off


def _fits(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool:
    """csrc/rope.cpp's layouts: (batch, heads, positions, even head size) float32 queries and keys whose last dim is
    contiguous, ``cos``/``sin`` (batch or 1, 1, positions, head size) likewise."""
    return (q.dim() == k.dim() == cos.dim() == 4 and q.shape[-1] % 2 == 0 and sin.shape == cos.shape
            and cos.dtype == sin.dtype == torch.float32 and cos.shape[1] == 1
            and cos.shape[2] == q.shape[2] == k.shape[2] and cos.shape[0] in (1, q.shape[0])
            and q.shape[0] == k.shape[0]
            and cos.shape[-1] == q.shape[-1] == k.shape[-1]
            and q.stride(-1) == k.stride(-1) == cos.stride(-1) == sin.stride(-1) == 1)


def _both(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """``_rotate`` of the queries and the keys: csrc/rope.cpp's one call where it can run (the same bits), else
    torch's ops."""
    kernel = native.rope() if ENABLED and _fits(q, k, cos, sin) else None
    if kernel is not None:
        shape = (q.shape[0], 1, *cos.shape[2:])
        return tuple(kernel.forward(q, k, cos.expand(shape), sin.expand(shape)))
    return _rotate(q, cos, sin), _rotate(k, cos, sin)


class _Rope(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        ctx.save_for_backward(cos, sin)
        return _both(q, k, cos, sin)

    @staticmethod
    def backward(ctx, gq, gk):
        cos, sin = ctx.saved_tensors
        grads = [None if g is None or not need else _rotate_t(g, cos, sin)
                 for g, need in zip((gq, gk), ctx.needs_input_grad[:2])]
        return grads[0], grads[1], None, None


def _wrap(stock):
    def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
        if (q.dtype == k.dtype == torch.float32 and q.device.type == "cpu" and not cos.requires_grad
                and not sin.requires_grad and not torch.is_autocast_enabled("cpu")):
            cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
            if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad):
                return _Rope.apply(q, k, cos, sin)
            return _both(q, k, cos, sin)  # no graph: a reference's, a sampler's forward
        return stock(q, k, cos, sin, unsqueeze_dim)

    apply_rotary_pos_emb.rlvr_stock = stock  # type: ignore[attr-defined]
    return apply_rotary_pos_emb


def fused_rope(model: torch.nn.Module) -> int:
    """Install the closed-form backward (module docstring) in the modeling modules of ``model``'s layers that
    use Llama's rotary code; how many modules carry it now (already installed ones included)."""
    from transformers.models.llama import modeling_llama as llama

    ref_apply = getattr(llama.apply_rotary_pos_emb, "rlvr_stock", llama.apply_rotary_pos_emb)
    done = 0
    for name in {type(m).__module__ for m in model.modules()}:
        mod = sys.modules.get(name)
        fn = getattr(mod, "apply_rotary_pos_emb", None)
        if fn is None:
            continue
        if hasattr(fn, "rlvr_stock"):
            done += 1
        elif _same_code(fn, ref_apply) and _same_code(getattr(mod, "rotate_half", None), llama.rotate_half):
            mod.apply_rotary_pos_emb = _wrap(fn)
            done += 1
    return done
