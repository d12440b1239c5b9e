"""The sampler's linear layers on weights packed once per call for a blocked GEMM (CPU, float32).

A decode step multiplies a few dozen rows by every weight matrix of the model. A stock ``sgemm`` packs the weight
into its blocked layout inside every call, and at so few rows that packing is a large share of the call: profiled
on SmolLM2-135M's decode (32 rows, one thread) the projections ran at 62 GFLOP/s and the 49,152-row output layer
at 41, against a 172 GFLOP/s peak. torch exposes two packed GEMMs, both what inductor's CPU freezing uses: MKL's
(``torch.ops.mkl._mkl_reorder_linear_weight`` / ``_mkl_linear``) and oneDNN's
(``torch.ops.mkldnn._reorder_linear_weight`` / ``_linear_pointwise``). The weights are packed once when a
``generate`` call starts and every step of the call reuses them (bench/rollout.py).

Which pays depends on the CPU. MKL's: 1.09-1.18x on Intel Xeons (AVX-512), but within a few per cent of the stock
product on AMD EPYCs, where packing the whole model each call made the sampler 0.94x as fast. oneDNN's on an AMD
Zen 4 host, each shape at 32 rows over cold weights: 71-95 GFLOP/s against the stock 54-71 and MKL's packed 57-65
(the output layer 95 against 54), and ahead at 8-24 rows too (RESULTS "Session 60"). So it is measured, not
assumed: the first time a weight shape is asked for at a row scale (the row count's power of two; per process and
thread count), packing is timed for each kind, and so are the products at that row count, over the model's layers
of that shape in turn as a decode streams them (``STREAM_BYTES``); a layer is packed for a call, in the kind that
gains most over the call, when the time it saves per step, times the call's steps, exceeds what packing it costs.
MKL's packed product serves exactly the row count it was packed for, and a decode's rows drop as completions end:
a step with fewer rows, down to a quarter of them, pads its rows with zeros up to that count (``PAD_FROM``).
oneDNN's serves any row count. A model that never changes over a job (the reference, a distillation teacher) is
packed once, for good (``pack_frozen``).

Only exact ``torch.nn.Linear`` modules with float32 CPU weights and no hooks or instance ``forward`` of their
own (but trainer/models/linear.py's training forward, put back after) are switched, only inside the ``with``
block, and a call that needs gradients takes ``F.linear``. The products are the same sums in another library's
blocking: they agree with ``F.linear`` to float32 rounding (tests/test_packed_linear.py; often bitwise, though
not on every code path and row count).
"""
from __future__ import annotations

import contextlib
import time
from typing import Iterator

import torch
import torch.nn.functional as F


def _mkl() -> bool:
    return torch.backends.mkl.is_available() and hasattr(torch.ops.mkl, "_mkl_linear")


def _onednn() -> bool:
    return (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))


def kinds() -> list[str]:
    """The packed GEMMs this torch build has (x86 wheels have both; others may have none and fall back)."""
    return [k for k, ok in (("mkl", _mkl), ("onednn", _onednn)) if ok()]


def available() -> bool:
    """Whether this torch build has a packed GEMM."""
    return bool(kinds())


def _pack(kind: str, weight: torch.Tensor, hint: int) -> torch.Tensor:
    if kind == "mkl":
        return torch.ops.mkl._mkl_reorder_linear_weight(weight, hint)
    return torch.ops.mkldnn._reorder_linear_weight(weight, hint)


def _product(kind: str, x: torch.Tensor, packed: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
             hint: int) -> torch.Tensor:
    if kind == "mkl":
        return torch.ops.mkl._mkl_linear(x, packed, weight, bias, hint)
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


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
# A decode step meets each weight after every other weight of the model, streaming them in turn: a large model's
# weights arrive cold. A shape is timed the same way, each product over the model's layers of that shape in turn, up
# to this many bytes of them. Timed on one warm weight, the stock product looked better than in a decode (RESULTS
# "Session 60": oneDNN's packed 576 x 576 product saved 0.03-0.05 ms a call warm, 0.11 ms streaming SmolLM2's 60
# such weights; session 59's padding rule the same); timed on one weight just evicted, both read the latency of
# a cold start.
STREAM_BYTES = 64 << 20
# A frozen model's forwards (pack_frozen) run a micro-batch's tokens, hundreds of rows per product: its layers are
# packed and measured for this many. The reference forward of SmolLM2's real-math batch, oneDNN's packed products
# against the stock ones on an AMD Zen 4 host: 95.5 against 84.0 GFLOP/s (RESULTS "Session 60").
FROZEN_ROWS = 256
# (out, in, row hint's power of two, threads) -> {kind: (seconds to pack one such weight, seconds one product saves)}
_MEASURED: dict[tuple[int, int, int, int], dict[str, tuple[float, float]]] = {}


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
                   always: bool = False, kind: str | None = None) -> Iterator[int]:
    """Within the block, ``model``'s eligible linear layers whose packing pays over ``steps`` decode steps
    (measured: see the module's doc; ``always``: every eligible layer) multiply by weights packed now for
    about ``rows`` rows per call (any row count is correct), in the packed GEMM that gains most (``kind``: that
    one). Yields how many layers were switched."""
    switched = _switch(model, rows, steps, always, kind) if enabled else []
    try:
        yield len(switched)
    finally:
        for m, prior in switched:
            _restore(m, prior)  # the packed copies are freed with the closures


def pack_frozen(model: torch.nn.Module) -> int:
    """A model that never changes over the job (the reference, a distillation teacher): its eligible layers packed
    once, for good, where that pays (measured as for a call of ``FROZEN_ROWS`` rows and very many steps). Its
    no-graph forwards take the packed products from then on; the copies live on the layers (a second copy of their
    weights). How many layers."""
    return len(_switch(model, FROZEN_ROWS, 1 << 30, False, None))


def _switch(model: torch.nn.Module, rows: int, steps: int, always: bool, kind: str | None) -> list:
    """``model``'s eligible layers switched to packed products where that pays: [(layer, its forward before)]."""
    switched: list[tuple[torch.nn.Module, object]] = []  # (layer, its forward before the call)
    if (steps >= MIN_STEPS or always) and available():
        hint = max(int(rows), 16)  # MKL picks its blocking from this; below 16 rows it takes another path
        groups: dict[tuple[int, ...], list[torch.nn.Module]] = {}  # the layers by weight shape
        for m in filter(_switchable, model.modules()):
            groups.setdefault(tuple(m.weight.shape), []).append(m)
        try:
            for layers in groups.values():
                chosen, copies = _kind_that_pays([m.weight.detach() for m in layers], hint, steps, always, kind)
                for i, m in enumerate(layers if chosen else ()):
                    packed = copies[i] if i < len(copies) else _pack(chosen, m.weight.detach(), hint)
                    switched.append((m, m.__dict__.get("forward")))
                    m.forward = _packed_forward(chosen, packed, m.weight, m.bias, hint)
        except RuntimeError:  # a build whose packed op refuses: sample with the stock layers
            for m, prior in switched:
                _restore(m, prior)
            switched = []
    return switched


def _kind_that_pays(weights: list[torch.Tensor], hint: int, steps: int, always: bool,
                    kind: str | None = None) -> tuple[str | None, list[torch.Tensor]]:
    """The packed kind that saves most over ``steps`` for ``weights`` (one shape) at ``hint`` rows, or None where
    none saves more than packing costs (``always``: the best all the same; with ``kind`` too, that one unmeasured);
    with the first weights already packed in it, where measuring packed them."""
    if always and kind is not None:
        return kind, []
    copies: dict[str, list[torch.Tensor]] = {}
    key = (*weights[0].shape, hint.bit_length(), torch.get_num_threads())
    if key not in _MEASURED:
        copies = _measure(weights, hint, key)
    gains = {k: saving_s * steps - pack_s for k, (pack_s, saving_s) in _MEASURED[key].items()
             if kind in (None, k) and k in kinds()}
    best = max(gains, key=gains.get, default=None)
    if best is None or not (always or gains[best] > 0):
        return None, []
    return best, copies.get(best, [])


def _measure(weights: list[torch.Tensor], hint: int, key: tuple) -> dict[str, list[torch.Tensor]]:
    """Time packing and the products at ``hint`` rows, stock and each packed kind, over ``weights`` in turn (up to
    ``STREAM_BYTES`` of them) into ``_MEASURED[key]``; returns their packed copies by kind."""
    weights = weights[:max(1, STREAM_BYTES // (weights[0].numel() * weights[0].element_size()))]
    packed, pack_s = {}, {}
    for k in kinds():
        t0 = time.perf_counter()
        packed[k] = [_pack(k, w, hint) for w in weights]
        pack_s[k] = (time.perf_counter() - t0) / len(weights)
    x = torch.randn(hint, weights[0].shape[1], generator=torch.Generator().manual_seed(0))  # not the global stream
    products = {"stock": lambda: [F.linear(x, w) for w in weights]}
    products.update({k: (lambda k=k: [_product(k, x, p, w, None, hint) for p, w in zip(packed[k], weights)])
                     for k in packed})
    best = dict.fromkeys(products, float("inf"))
    for f in products.values():
        f()  # oneDNN builds its kernel for a shape on the first call
    for _ in range(REPS):  # alternated, so a slow spell of the machine meets each
        for k, f in products.items():
            t0 = time.perf_counter()
            f()
            best[k] = min(best[k], time.perf_counter() - t0)
    _MEASURED[key] = {k: (pack_s[k], (best["stock"] - best[k]) / len(weights)) for k in packed}
    return packed


def _packed_forward(kind: str, packed: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, hint: int):
    pad_from = -(-hint // PAD_FROM) if kind == "mkl" else hint

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
            return _product(kind, flat, packed, weight, bias, hint)[:rows].view(*x.shape[:-1], -1)
        return _product(kind, x, packed, weight, bias, hint)

    return forward
