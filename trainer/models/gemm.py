"""Which library multiplies the training layers' float32 matrices on a CPU: MKL (torch's ``mm``) or oneDNN.

torch runs a float32 product in MKL. MKL chooses its kernels by the CPU's vendor: on an AMD CPU it runs its AVX2
kernels even where the CPU has AVX-512. Measured on an AMD EPYC Zen 5 host (family 26, full-width AVX-512; one
thread): every product of SmolLM2-135M's update (forward, input and weight gradients, 300-4,096 rows, the
49,152-row output layer) ran at 96-122 GFLOP/s in MKL, with ``MKL_ENABLE_INSTRUCTIONS=AVX512`` and
``MKL_DEBUG_CPU_TYPE=5`` alike, and at 150-282 in oneDNN, which every x86 torch wheel carries as well and which
runs the ISA the CPU has (bench/RESULTS.md, "Session 62"). On the Zen 4 host of session 60 oneDNN's products were
ahead by ~1.1x. So where the CPU is not Intel's and has AVX-512, the layers' products go to oneDNN
(``torch.ops.mkldnn._linear_pointwise``, the op inductor's CPU backend uses): the forward, the input's gradient
(the weight's transpose, a view) and the weight's gradient (the two operands' transposes, views; added to an
existing sum inside the product, as a fused post-op). On an Intel CPU MKL is at home and stays: on an Intel
Xeon with AVX-512 and AMX (family 6 model 167) the update took 1.13-1.20x as long with every product in oneDNN,
1.19x at two threads, the critic's forward 1.10x (RESULTS "Session 67"; ``bench/update.py --sides onednn_gemm``).

Small weights stay in MKL there too (``MIN_ENTRIES``). oneDNN builds a kernel for each new shape of a product, and
an update's row count is new at every step: a weight of the bundled tiny model (128 x 384) met that cost once per
step for its 4 layers, more than oneDNN's faster kernel saved. Each weight shape at 1,500-1,760 rows, forward and
both gradients, 4 layers, a new row count each round, on a Zen 4 host: oneDNN took 1.12x MKL's time at 128 x 128,
1.05x at 128 x 384, 0.95x at 256 x 256, 0.93x at 192 x 576 and 0.90x at 1536 x 576 (one thread; at two 1.32x,
1.19x, 1.12x, 0.80x and 0.93x). The tiny model's GRPO step (bench/grpo_vs_trl.py --quick, two runs of each,
alternated) was 1.13x faster all in MKL (RESULTS "Session 70"). Every SmolLM2 weight has 110,592 entries or more.
Not so on AMD's family 26 (Zen 5) and later, whose AVX-512 units are full width: the same measurement there read
1.02x at 128 x 128, 0.58-0.67x at 128 x 384 (either way round), 0.64x at 256 x 256 and 0.52x at 192 x 576 (one
thread; at two 1.25x, 0.76-0.89x, 0.78x, 0.65x), and the tiny model's GRPO job, its steps taking turns between the
rules in one process, took 0.22 s a step all in oneDNN against 0.25 s with weights under 32,768 entries in MKL and
0.33 s all in MKL (at two threads 0.21, 0.22 and 0.26 s); ``bench/gemm_rule.py --quick``, this rule against all in
MKL: 0.258 against 0.338 s (0.194 against 0.217 s at two threads; RESULTS "Session 77"). There every float32
product goes to oneDNN.

The choice is a rule of the CPU and the weight's size, not a timing, so a job and its resumption, or two runs of a
test, take the same path on one machine. ``RLVR_CPU_GEMM=mkl|onednn`` overrides it (``onednn``: every float32
product, whatever its size; ``auto``, the default). The sums are the same products summed in another blocking: they
agree with torch's to float32 rounding, not bitwise
(tests/test_cpu_gemm.py). float64, other dtypes and other devices always take torch's ops.
"""
from __future__ import annotations

import functools
import os

import torch
import torch.nn.functional as F

CHOICES = ("auto", "mkl", "onednn")


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of Linux's /proc/cpuinfo (elsewhere: none)."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if not key.strip() and fields:  # the blank line after the first processor
                    break
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return fields


def cpu() -> tuple[str, set[str]]:
    """The CPU's vendor and flags (Linux's /proc/cpuinfo; elsewhere unknown: ("", set()))."""
    info = _cpuinfo()
    return info.get("vendor_id", ""), set(info.get("flags", "").split())


def family() -> int:
    """The CPU's family number (/proc/cpuinfo's "cpu family"; 0 where unknown)."""
    value = _cpuinfo().get("cpu family", "")
    return int(value) if value.isdigit() else 0


def _has_onednn() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


# where oneDNN is chosen by the rule (``auto``), a weight of fewer entries than this stays in MKL (module docstring)
MIN_ENTRIES = 1 << 16
# AMD's family 26 (Zen 5) and later run AVX-512 at full width, where oneDNN's kernels run ~2x MKL's AVX2 ones: there
# every size goes to oneDNN, a kernel built per new row count included (module docstring)
FULL_WIDTH_FAMILY = 26


@functools.cache
def min_entries() -> int | None:
    """The smallest weight (entries) whose float32 CPU products this process runs in oneDNN, None for none (module
    docstring); decided once."""
    choice = os.environ.get("RLVR_CPU_GEMM", "auto").strip().lower() or "auto"
    if choice not in CHOICES:
        raise ValueError(f"RLVR_CPU_GEMM={choice!r}: expected one of {', '.join(CHOICES)}")
    if choice == "mkl" or not _has_onednn():
        return None
    if choice == "onednn":
        return 0
    vendor, flags = cpu()
    if vendor == "GenuineIntel" or "avx512f" not in flags or not torch.backends.mkl.is_available():
        return None
    return 0 if vendor == "AuthenticAMD" and family() >= FULL_WIDTH_FAMILY else MIN_ENTRIES


def onednn() -> bool:
    """Whether this process multiplies any float32 CPU layer in oneDNN."""
    return min_entries() is not None


def takes(*ts: torch.Tensor | None, entries: int) -> bool:
    """Whether oneDNN multiplies these operands here (None: an absent bias or sum), for a weight of ``entries``
    entries: float32 CPU tensors, none empty (a sum over no rows, which oneDNN refuses: torch's ops write its zeros),
    on a CPU where gemm.py chose it, and a weight it takes."""
    least = min_entries()
    return (least is not None and entries >= least
            and all(t is None or (t.dtype == torch.float32 and t.device.type == "cpu" and t.numel()) for t in ts))


def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, w, b)`` without a graph (callers needing one take ``F.linear`` or linear.py's Function)."""
    if takes(x, w, b, entries=w.numel()):
        return torch.ops.mkldnn._linear_pointwise(x, w, b, "none", [], "")
    return F.linear(x, w, b)


def input_grad(g: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``g @ w``: the gradient of a linear layer's input from its output's ``g`` (..., out) and weight (out, in)."""
    if takes(g, w, entries=w.numel()):
        return torch.ops.mkldnn._linear_pointwise(g, w.t(), None, "none", [], "")
    return g.matmul(w)


def weight_grad(g2: torch.Tensor, x2: torch.Tensor, acc: torch.Tensor | None) -> torch.Tensor:
    """``g2.t() @ x2 (+ acc)`` in oneDNN, a new tensor (rows x out and rows x in give out x in); for operands it
    ``takes`` (``acc`` contiguous). The sum so far is added inside the product, as a fused post-op."""
    if acc is None:
        return torch.ops.mkldnn._linear_pointwise(g2.t(), x2.t(), None, "none", [], "")
    return torch.ops.mkldnn._linear_pointwise.binary(g2.t(), acc, x2.t(), None, "add")
