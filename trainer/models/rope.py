"""The rotary position embedding's backward written out (CPU training).

transformers rotates queries and keys as ``x * cos + rotate_half(x) * sin``, ``rotate_half(x) = cat(-x2, x1)``.
autograd's backward of that graph gives each half-slice its own zero-filled full-size gradient and sums them in
(``SliceBackward``, ``NegBackward``, the input buffer's adds): about ten kernels per tensor where the closed form
is four, ``g * cos + rotate_half_t(g * sin)`` with ``rotate_half_t(y) = cat(y2, -y1)``.

The forward is the stock ops in the stock order. The backward adds the same two terms at every position (the
zeros autograd adds are exact): both are bitwise torch's own (tests/test_rope.py). It runs only for float32 CPU
queries and keys with a gradient wanted, constant ``cos``/``sin`` and no autocast; anything else calls the stock
function. It is installed in the modeling module of a policy's layers when that module's
``apply_rotary_pos_emb`` and ``rotate_half`` are Llama's very code (Qwen2, Mistral and others copy them); the
function is a module global there, so every model of that family in the process calls it, and any call it does
not take goes to the stock one unchanged.
"""
from __future__ import annotations

import sys

import torch

from .norm import _same_code


def _rotate_half(x: torch.Tensor) -> torch.Tensor:  # Llama's
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def _rotate_half_t(g: torch.Tensor) -> torch.Tensor:  # its transpose: the gradient of rotate_half
    h = g.shape[-1] // 2
    return torch.cat((g[..., h:], -g[..., :h]), dim=-1)


class _Rope(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        ctx.save_for_backward(cos, sin)
        return (q * cos) + (_rotate_half(q) * sin), (k * cos) + (_rotate_half(k) * sin)

    @staticmethod
    def backward(ctx, gq, gk):
        cos, sin = ctx.saved_tensors
        grads = [None if g is None or not need else (g * cos).add_(_rotate_half_t(g * sin))
                 for g, need in zip((gq, gk), ctx.needs_input_grad[:2])]
        return grads[0], grads[1], None, None


def _wrap(stock):
    def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
        if (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad) and q.dtype == k.dtype == torch.float32
                and q.device.type == "cpu" and not cos.requires_grad and not sin.requires_grad
                and not torch.is_autocast_enabled("cpu")):
            return _Rope.apply(q, k, cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim))
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
