"""The sampler's linear layers on weights packed once per call for MKL's GEMM (CPU, float32).

A decode step multiplies a few dozen rows by every weight matrix of the model. MKL's ``sgemm`` packs the
weight into its blocked layout inside every call, and at so few rows that packing is a large share of the
call: profiled on SmolLM2-135M's decode (32 rows, one thread) the projections ran at 62 GFLOP/s and the
49,152-row output layer at 41, against a 172 GFLOP/s peak. torch exposes MKL's packed GEMM
(``torch.ops.mkl._mkl_reorder_linear_weight`` / ``_mkl_linear``, what inductor's CPU freezing uses): the weights
are packed once when a ``generate`` call starts and every step of the call reuses them (bench/rollout.py).

Whether it pays depends on the CPU: 1.09-1.18x on the Intel Xeon (AVX-512) that profile came from, but on an AMD
EPYC (AVX2) the packed and stock products ran within a few per cent of each other at 32 rows and packing the
whole model each call made the sampler 0.94x as fast (0.72x in one bench run). So it is measured, not assumed:
the first time a weight shape is asked for at a row scale (the row count's power of two; per process and
thread count), packing one such weight is timed, and so are both products at that row count; a layer is
packed for a call when the time it saves per step, times the call's steps, exceeds what packing it costs.
The packed product serves exactly the row count it was packed for, and a decode's rows drop as completions end:
a step with fewer rows, down to a quarter of them, pads its rows with zeros up to that count (``PAD_FROM``).

Only exact ``torch.nn.Linear`` modules with float32 CPU weights and no hooks or instance ``forward`` of their
own (but trainer/models/linear.py's training forward, put back after) are switched, only inside the ``with``
block, and a call that needs gradients takes ``F.linear``. The products are the same sums in MKL's own
blocking: they agree with ``F.linear`` to float32 rounding (tests/test_packed_linear.py; often bitwise, though
not on every MKL code path and row count).
"""
from __future__ import annotations

import contextlib
import time
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
# A call decoding fewer tokens than this (a short Tinker ``sample``) keeps the stock layers unmeasured: where
# packing paid (the Intel host: ~30 ms saved per step at 32 rows against 0.22-0.26 cpu-s to pack SmolLM2-135M)
# it paid from 8-9 steps, so below this the gain is small wherever it comes from.
MIN_STEPS = 16
# Timed calls of each product when a shape is measured (the fastest counts: the others met a busy core).
REPS = 3
# A call of at least 1/PAD_FROM of the rows a weight was packed for, and fewer, pads them up to it (_packed_forward).
# SmolLM2's real-math decode, each step's forward timed in one process, padded against not (4 rollouts each): 12
# rows 118 against 153 ms, 16-24 rows 119-121 against 123-134 ms, 32 rows 115-116 ms either way; the rollout 3.37
# against 3.54 s. A timing on a warm weight at packing time flattered the stock product (its padding choices gained
# ~1%): a decode meets each weight cold, where a packed product costs about the same at any row count up to the
# one it was packed for (it streams the weight) and MKL's stock sgemm packs the weight again in every call.
PAD_FROM = 4
# (out, in, row hint's power of two, threads) -> (seconds to pack one such weight, seconds one packed product saves)
_MEASURED: dict[tuple[int, int, int, int], tuple[float, float]] = {}


def _switchable(m: torch.nn.Module) -> bool:
    w = getattr(m, "weight", None)
    return (type(m) is torch.nn.Linear and isinstance(w, torch.Tensor) and w.dtype == torch.float32
            and w.device.type == "cpu" and w.dim() == 2 and w.numel() >= MIN_ENTRIES
            and getattr(m.__dict__.get("forward"), "rlvr_grad_in_place", "forward" not in m.__dict__)
            and not (m._forward_hooks or m._forward_pre_hooks))


def _restore(m: torch.nn.Module, prior) -> None:
    """The layer's forward as it was before the call: nn.Linear's own, or trainer/models/linear.py's."""
    if prior is None:
        del m.forward
    else:
        m.forward = prior


@contextlib.contextmanager
def packed_linears(model: torch.nn.Module, rows: int, steps: int = MIN_STEPS, enabled: bool = True,
                   always: bool = False) -> Iterator[int]:
    """Within the block, ``model``'s eligible linear layers whose packing pays over ``steps`` decode steps
    (measured: see the module's doc; ``always``: every eligible layer) multiply by weights packed now for
    about ``rows`` rows per call (any row count is correct). Yields how many layers were switched."""
    switched: list[tuple[torch.nn.Module, object]] = []  # (layer, its forward before the call)
    if enabled and (steps >= MIN_STEPS or always) and available():
        hint = max(int(rows), 16)  # MKL picks its blocking from this; below 16 rows it takes another path
        try:
            for m in filter(_switchable, model.modules()):
                packed = _packed_if_it_pays(m.weight.detach(), hint, steps, always)
                if packed is not None:
                    switched.append((m, m.__dict__.get("forward")))
                    m.forward = _packed_forward(packed, m.weight, m.bias, hint)
        except RuntimeError:  # a build whose MKL op refuses: sample with the stock layers
            for m, prior in switched:
                _restore(m, prior)
            switched = []
    try:
        yield len(switched)
    finally:
        for m, prior in switched:
            _restore(m, prior)  # the packed copies are freed with the closures


def _packed_if_it_pays(weight: torch.Tensor, hint: int, steps: int, always: bool) -> torch.Tensor | None:
    """``weight`` packed for ``hint`` rows, or None where packing costs more than it saves over ``steps``."""
    packed = None
    if not always:
        key = (*weight.shape, hint.bit_length(), torch.get_num_threads())
        if key not in _MEASURED:
            packed = _measure(weight, hint, key)
        pack_s, saving_s = _MEASURED[key]
        if saving_s * steps <= pack_s:
            return None
    return packed if packed is not None else torch.ops.mkl._mkl_reorder_linear_weight(weight, hint)


def _measure(weight: torch.Tensor, hint: int, key: tuple) -> torch.Tensor:
    """Time packing ``weight`` and both products at ``hint`` rows into ``_MEASURED[key]``; returns the packed copy."""
    t0 = time.perf_counter()
    packed = torch.ops.mkl._mkl_reorder_linear_weight(weight, hint)
    pack_s = time.perf_counter() - t0
    x = torch.randn(hint, weight.shape[1], generator=torch.Generator().manual_seed(0))  # not the global stream
    stock_s = packed_s = float("inf")
    F.linear(x, weight), torch.ops.mkl._mkl_linear(x, packed, weight, None, hint)  # both warm
    for _ in range(REPS):  # alternated, so a slow spell of the machine meets both
        t0 = time.perf_counter()
        F.linear(x, weight)
        t1 = time.perf_counter()
        torch.ops.mkl._mkl_linear(x, packed, weight, None, hint)
        t2 = time.perf_counter()
        stock_s, packed_s = min(stock_s, t1 - t0), min(packed_s, t2 - t1)
    _MEASURED[key] = (pack_s, stock_s - packed_s)
    return packed


def _packed_forward(packed: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, hint: int):
    pad_from = -(-hint // PAD_FROM)

    def forward(x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
            return F.linear(x, weight, bias)  # a backward needs the stock op
        rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
        if pad_from <= rows < hint:
            # MKL's packed product serves exactly ``hint`` rows; at any other count torch falls back to the stock
            # sgemm. A decode's rows drop as completions end, so most of its steps ran below the hint: zero rows
            # pad the call up to it (each row's sums are its own)
            flat = x.new_zeros(hint, x.shape[-1])
            flat[:rows] = x.reshape(rows, x.shape[-1])
            return torch.ops.mkl._mkl_linear(flat, packed, weight, bias, hint)[:rows].view(*x.shape[:-1], -1)
        return torch.ops.mkl._mkl_linear(x, packed, weight, bias, hint)

    return forward
