"""The linear layers' weight gradients multiplied straight into ``.grad`` (CPU training).

autograd gives every use of a weight a gradient tensor of its own and sums them out of place: the update's
two-call shared-prompt forward (trainer/batch.py) uses each weight twice, once for the prompts and once for the
completions, so per micro-batch every weight's backward writes two weight-sized products, adds them into a
third tensor, and adds that into ``.grad`` (~500 MB each, over SmolLM2-135M's weights). Here the backward
accumulates into the weight's existing ``.grad`` inside the product itself (``addmm_`` with beta = 1): the same
sum, no weight-sized temporaries. Measured (bench/RESULTS.md, session 49): 1.04-1.08x on a SmolLM2-135M update whose
rows share prompts, none where they do not, and 0.08-0.14 GB less peak memory. (The packed row,
trainer/models/segments.py, uses each weight once a micro-batch; micro-batches after the first still add into
``.grad`` without a temporary.) A step's first product overwrites the buffer an earlier step left (grads.py):
no pass zeroes it first.

Every product here is gemm.py's: torch's (MKL) on an Intel CPU, oneDNN's on another CPU with AVX-512, where MKL
runs its AVX2 kernels (SmolLM2-135M's update on an AMD Zen 5 host: RESULTS "Session 62"). oneDNN's weight
product writes a new tensor, the step's sum so far added inside it (a fused post-op), which becomes ``.grad``.

Applied like the embedding's (trainer/models/embedding.py): to exact ``torch.nn.Linear`` modules with float32
or float64 CPU weights, never under FSDP (sharded weights). A forward that builds a graph takes the Function here
(a frozen weight, such as a LoRA base, gets its input's gradient only), one under bf16 autocast ``F.linear``, one
without a graph gemm.py's product. Gradients reach ``.grad`` only, so a caller asking ``torch.autograd.grad`` for
a weight gets none: the trainer reads ``.grad``. The sampler's packed layers (trainer/engines/packed.py) replace
this forward for a ``generate`` call and put it back after.
"""
from __future__ import annotations

import types

import torch
import torch.nn.functional as F

from . import gemm, grads


class _GradInPlace(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        # the weight is saved too (an in-place change before the backward raises); x only for the weight's gradient
        ctx.save_for_backward(x if ctx.needs_input_grad[1] else None, weight)
        ctx.weight = weight  # the parameter itself, whose .grad takes the product
        return gemm.linear(x, weight, bias)  # no graph inside a Function's forward

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, w = ctx.saved_tensors
        gx = gemm.input_grad(grad, w) if ctx.needs_input_grad[0] else None
        g2 = grad.reshape(-1, grad.shape[-1])
        if ctx.needs_input_grad[1]:  # not for a frozen weight (a LoRA base): its input's gradient only
            _weight_grad(ctx.weight, g2, x.reshape(-1, x.shape[-1]))
        gb = g2.sum(0) if ctx.needs_input_grad[2] else None
        return gx, None, gb


def _weight_grad(p: torch.Tensor, g2: torch.Tensor, x2: torch.Tensor) -> None:
    live = grads.live(p)
    acc = p.grad if live else None
    if gemm.takes(g2, x2, acc, entries=p.numel()) and (acc is None or acc.is_contiguous()):
        # a stale buffer is freed before the product is allocated: glibc hands its memory straight back
        # (trainer.devices keeps freed memory). Held, the product took fresh pages at each step until the heap
        # settled: 27,648 page faults and +300 ms for SmolLM2's output layer, 80 ms without (one thread, Zen 5)
        p.grad = None
        p.grad = gemm.weight_grad(g2, x2, acc)  # oneDNN's: a new tensor, the sum so far added inside it
    elif p.grad is None:
        p.grad = g2.t().mm(x2)
    elif live:
        p.grad.addmm_(g2.t(), x2)
    else:  # an earlier step's buffer (grads.py): overwritten, never read
        p.grad.addmm_(g2.t(), x2, beta=0)


def _forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    autocast = torch.is_autocast_enabled("cpu")
    graph = torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad
                                         or (self.bias is not None and self.bias.requires_grad))
    if graph and not autocast:  # a frozen weight (a LoRA base) too: its input's gradient in gemm.py's product
        return _GradInPlace.apply(x, self.weight, self.bias)
    if graph or autocast:  # bf16 autocast: torch's op
        return F.linear(x, self.weight, self.bias)
    return gemm.linear(x, self.weight, self.bias)  # no graph: a reference, old-policy or critic forward


_forward.rlvr_grad_in_place = True  # what packed.py may replace for a call and must put back


def _eligible(m: torch.nn.Module) -> bool:
    w = getattr(m, "weight", None)
    return (type(m) is torch.nn.Linear and isinstance(w, torch.Tensor) and w.dtype in (torch.float32, torch.float64)
            and w.device.type == "cpu" and "forward" not in m.__dict__)


def grad_in_place(model: torch.nn.Module) -> int:
    """Give ``model``'s eligible linear layers the in-place weight gradient (module docstring); how many."""
    layers = [m for m in model.modules() if _eligible(m)]
    for m in layers:
        m.forward = types.MethodType(_forward, m)
        grads.adopt(m.weight)
    return len(layers)
