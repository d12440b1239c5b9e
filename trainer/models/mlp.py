"""The gated MLP's activation, silu(gate) * up, as one node with its backward written out (CPU float32).

transformers' Llama-style MLP is ``down(silu(gate(x)) * up(x))``: silu and the product are two passes over the
(rows, intermediate) activations forward, and their backward three more (the product's two gradients, then silu's
backward with its exponential again), with g, silu(g) and u all kept for it. Here csrc/swiglu.cpp computes
h = silu(g) * u in one pass and both gradients in one, keeping g and u only. SmolLM2-135M's update (its
intermediate size 1,536, 420 packed rows, 30 layers): RESULTS "Session 71".

Applied beside the fused RMSNorm (trainer/models/norm.py): to the policy on the CPU, never under FSDP, and only to
an MLP whose ``forward`` is Llama's very code (Qwen2/3, Mistral and others copy it) with transformers' SiLU as its
activation. It runs for float32 activations without autocast, with or without a graph (the policy's no-graph
forwards then give the same bits as its training forward); anything else, or a host that cannot build the kernel,
takes the stock forward. The projections stay the modules they are (linear.py's, a LoRA adapter's).
"""
from __future__ import annotations

import types

import torch

from ..engines import native
from .norm import _same_code

ENABLED = True  # bench/update.py's peer and tests switch it off


class _SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, g: torch.Tensor, u: torch.Tensor, kernel) -> torch.Tensor:
        ctx.save_for_backward(g, u)
        ctx.kernel = kernel
        return kernel.forward(g, u)

    @staticmethod
    def backward(ctx, gh: torch.Tensor):
        g, u = ctx.saved_tensors
        dg, du = ctx.kernel.backward(gh.contiguous(), g, u)
        return dg, du, None


def _stock():
    from transformers.models.llama.modeling_llama import LlamaMLP

    return LlamaMLP.forward


def _forward(self, x: torch.Tensor) -> torch.Tensor:
    kernel = native.swiglu() if ENABLED and x.dtype == torch.float32 and x.device.type == "cpu" else None
    if kernel is None or torch.is_autocast_enabled("cpu"):
        return type(self).forward(self, x)
    g, u = self.gate_proj(x).contiguous(), self.up_proj(x).contiguous()
    if g.dtype != torch.float32 or u.dtype != torch.float32:  # a projection of another dtype: the stock ops
        return self.down_proj(self.act_fn(g) * u)
    graph = torch.is_grad_enabled() and (g.requires_grad or u.requires_grad)
    return self.down_proj(_SwiGLU.apply(g, u, kernel) if graph else kernel.forward(g, u))


def _eligible(m: torch.nn.Module, stock) -> bool:
    from transformers.activations import SiLUActivation

    return (all(isinstance(getattr(m, n, None), torch.nn.Module) for n in ("gate_proj", "up_proj", "down_proj"))
            and type(getattr(m, "act_fn", None)) in (SiLUActivation, torch.nn.SiLU)
            and "forward" not in m.__dict__ and _same_code(type(m).forward, stock))


def fused_swiglu(model: torch.nn.Module) -> int:
    """Give ``model``'s Llama-code SiLU MLPs the one-pass activation and backward (module docstring); how many."""
    stock = _stock()
    layers = [m for m in model.modules() if _eligible(m, stock)]
    for m in layers:
        m.forward = types.MethodType(_forward, m)
    return len(layers)
