"""The sampler's linear layers on weights packed once per call for MKL's GEMM (CPU, float32).

A decode step multiplies a few dozen rows by every weight matrix of the model. MKL's ``sgemm`` packs the
weight into its blocked layout inside every call, and at so few rows that packing is a large share of the
call: profiled on SmolLM2-135M's decode (32 rows, one thread) the projections ran at 62 GFLOP/s and the
49,152-row output layer at 41, against a 172 GFLOP/s peak. torch exposes MKL's packed GEMM
(``torch.ops.mkl._mkl_reorder_linear_weight`` / ``_mkl_linear``, what inductor's CPU freezing uses): the weights
are packed once when a ``generate`` call starts and every step of the call reuses them (bench/rollout.py).

Only exact ``torch.nn.Linear`` modules with float32 CPU weights and no hooks or instance ``forward`` of their
own are switched, only inside the ``with`` block, and a call that needs gradients takes ``F.linear``. The
products are the same sums in MKL's own blocking: they agree with ``F.linear`` to float32 rounding
(tests/test_packed_linear.py; often bitwise, though not on every MKL code path and row count).
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch
import torch.nn.functional as F


def available() -> bool:
    """Whether this torch build has MKL's packed GEMM (x86 wheels do; others fall back)."""
    return torch.backends.mkl.is_available() and hasattr(torch.ops.mkl, "_mkl_linear")


# A smaller weight (256 KB) stays in cache between calls and MKL packs it cheaply inside each one: packing the
# bundled tiny model's layers (the largest 49,152 entries) made its sampler 0.95x as fast (bench/rollout.py),
# SmolLM2's (110,592 to 28.3M entries) 1.09x faster.
MIN_ENTRIES = 65536
# Packing costs one pass over the weights per call (SmolLM2-135M: 0.22-0.26 cpu-s) and saves ~30 ms per decode
# step at 32 rows: even at 8-9 steps. A call decoding fewer tokens than this (a short Tinker ``sample``) keeps
# the stock layers.
MIN_STEPS = 16


def _switchable(m: torch.nn.Module) -> bool:
    w = getattr(m, "weight", None)
    return (type(m) is torch.nn.Linear and isinstance(w, torch.Tensor) and w.dtype == torch.float32
            and w.device.type == "cpu" and w.dim() == 2 and w.numel() >= MIN_ENTRIES and "forward" not in m.__dict__
            and not (m._forward_hooks or m._forward_pre_hooks))


@contextlib.contextmanager
def packed_linears(model: torch.nn.Module, rows: int, steps: int = MIN_STEPS, enabled: bool = True) -> Iterator[int]:
    """Within the block, ``model``'s eligible linear layers multiply by weights packed now for about ``rows``
    rows per call (any row count is correct), when the block decodes at least MIN_STEPS ``steps``. Yields how
    many layers were switched."""
    switched: list[torch.nn.Module] = []
    if enabled and steps >= MIN_STEPS and available():
        hint = max(int(rows), 16)  # MKL picks its blocking from this; below 16 rows it takes another path
        try:
            for m in filter(_switchable, model.modules()):
                packed = torch.ops.mkl._mkl_reorder_linear_weight(m.weight.detach(), hint)
                m.forward = _packed_forward(packed, m.weight, m.bias, hint)
                switched.append(m)
        except RuntimeError:  # a build whose MKL op refuses: sample with the stock layers
            for m in switched:
                del m.forward
            switched = []
    try:
        yield len(switched)
    finally:
        for m in switched:
            del m.forward  # back to nn.Linear.forward; the packed copies are freed with the closures


def _packed_forward(packed: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, hint: int):
    def forward(x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
            return F.linear(x, weight, bias)  # a backward needs the stock op
        return torch.ops.mkl._mkl_linear(x, packed, weight, bias, hint)

    return forward
