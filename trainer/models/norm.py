"""RMSNorm's forward in one pass and its backward written out (CPU).

transformers' Llama-style RMSNorm is six tensor ops (``pow``, ``mean``, ``add``, ``rsqrt`` and two products), each
a node of the autograd graph: its backward is about fifteen more, with broadcast gradients reduced one by one.
Here the forward is one pass a row in csrc/rms_norm.cpp (float32 on the CPU; torch's same six ops where it cannot
build), one autograd node, and the backward is the closed form: with x̂ = x · r, r = 1 / sqrt(mean(x²) + eps) and
g the output's gradient,

    dL/dw = Σ_rows g · x̂            dL/dx = r · (g·w − x̂ · mean(g·w · x̂))

The kernel sums each row's squares in another order than torch's ``mean``: its output agrees with the stock one to
float32 rounding and is as close to float64 (tests/test_norm.py). It runs for every forward of a module it is
installed on, with or without a graph, so the sampler, the update and a frozen reference at the policy's weights
(trainer/loop.py installs it there too) compute the same bits.

Applied beside the linear layers' gradient (trainer/models/linear.py): to the policy on the CPU, never under FSDP,
and to the job's frozen models; only to a module whose ``forward`` is Llama's very code (Qwen2/3, Mistral and
others copy it; Gemma's ``1 + weight`` differs and keeps its own). It runs only for a float32 input and weight
and no autocast; anything else takes the stock forward.
"""
from __future__ import annotations

import types

import torch

from ..engines import native

ENABLED = True  # csrc/rms_norm.cpp for the forward; bench/update.py's peer and tests switch it off


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float, kernel) -> torch.Tensor:
        if kernel is not None:
            y, r = kernel.forward(x, weight, eps)
        else:
            r = x.pow(2).mean(-1, keepdim=True).add_(eps).rsqrt_()  # the stock rsqrt(variance + eps)
            y = weight * (x * r)
        ctx.save_for_backward(x, r, weight)  # x rather than x̂: the same size, and no x̂ pass in the forward
        return y

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        x, r, w = ctx.saved_tensors
        xh = x * r
        gw = (g * xh).reshape(-1, xh.shape[-1]).sum(0) if ctx.needs_input_grad[1] else None
        gx = None
        if ctx.needs_input_grad[0]:
            gxh = g * w
            gx = gxh.sub_(xh * (gxh * xh).mean(-1, keepdim=True)).mul_(r)
        return gx, gw, None, None


def _stock():
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    return LlamaRMSNorm.forward


def _forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    w = self.weight
    if (hidden_states.dtype != torch.float32 or w.dtype != torch.float32 or hidden_states.device.type != "cpu"
            or torch.is_autocast_enabled("cpu")):
        return type(self).forward(self, hidden_states)
    kernel = native.rms_norm() if ENABLED else None
    if torch.is_grad_enabled() and (w.requires_grad or hidden_states.requires_grad):
        return _RMSNorm.apply(hidden_states, w, self.variance_epsilon, kernel)
    if kernel is None:
        return type(self).forward(self, hidden_states)
    return kernel.forward(hidden_states, w, self.variance_epsilon)[0]


def _same_code(f, g) -> bool:
    a, b = getattr(f, "__code__", None), getattr(g, "__code__", None)
    return a is not None and b is not None and (a.co_code, a.co_consts, a.co_names) == (b.co_code, b.co_consts,
                                                                                         b.co_names)


def _eligible(m: torch.nn.Module, stock) -> bool:
    w = getattr(m, "weight", None)
    return (isinstance(w, torch.nn.Parameter) and w.dim() == 1 and w.device.type == "cpu"
            and isinstance(getattr(m, "variance_epsilon", None), float) and "forward" not in m.__dict__
            and _same_code(type(m).forward, stock))


def fused_rms_norm(model: torch.nn.Module) -> int:
    """Give ``model``'s Llama-formula RMSNorm modules the one-pass forward and closed-form backward (module
    docstring); how many."""
    stock = _stock()
    layers = [m for m in model.modules() if _eligible(m, stock)]
    for m in layers:
        m.forward = types.MethodType(_forward, m)
    return len(layers)
