"""Our C++ kernels (``csrc/``): the sampler's decode attention (two), the packed row's attention and its backward,
RMSNorm's forward and the rotary embedding, the update's vocabulary softmax and MLP activation. Each is compiled on
first use for this host's CPU and cached.

``torch.utils.cpp_extension.load`` builds a kernel once per machine (~30-40 s with g++ and ninja; ``make setup``
does it ahead of time) beside the installed packages (``_build_dir``) and loads it in ~0.1 s afterwards. The build
is for this CPU (``-march=native``), so its name carries a digest of the CPU's vendor and flags: a directory shared
between hosts never loads another CPU's build. Where it cannot be built (no compiler) or ``RLVR_NATIVE_KERNELS=0``,
the caller takes its torch path, with one warning saying why.
"""
from __future__ import annotations

import functools
import hashlib
import os
import sys
import warnings
from pathlib import Path
from typing import Callable

CSRC = Path(__file__).parent / "csrc"


def _host_digest() -> str:
    """The CPU this build is for: its vendor and instruction-set flags (trainer/models/gemm.py reads them)."""
    import platform

    from ..models.gemm import cpu

    vendor, flags = cpu()
    return hashlib.sha256(" ".join([platform.machine(), vendor, *sorted(flags)]).encode()).hexdigest()[:12]


def _headers_digest() -> str:
    """csrc/'s shared headers (vec8.h): torch rebuilds a kernel when its source or flags change, not a header it
    includes, so their digest is in every build's name."""
    h = hashlib.sha256()
    for f in sorted(CSRC.glob("*.h")):
        h.update(f.name.encode() + f.read_bytes())
    return h.hexdigest()[:8]


def _build_dir(name: str) -> str | None:
    """Where a build lives: ``TORCH_EXTENSIONS_DIR`` when set (torch's own choice, None here), else beside the
    installed packages (``<venv>/var/rlvr-kernels``), so a process with another ``$HOME`` (a job's sandbox, a test's
    clean home) loads ``make setup``'s build instead of compiling its own; torch's default under ``~/.cache`` where
    that is not writable."""
    if os.environ.get("TORCH_EXTENSIONS_DIR"):
        return None
    d = Path(sys.prefix) / "var" / "rlvr-kernels" / name
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return str(d) if os.access(d, os.W_OK) else None


def _load(name: str, source: str, purpose: str, cflags: tuple[str, ...] = ()) -> object | None:
    """The built module of ``csrc/<source>`` (module docstring), or None, with one warning, where it cannot build."""
    if os.environ.get("RLVR_NATIVE_KERNELS", "1") == "0":
        return None
    try:
        from torch.utils.cpp_extension import load

        # torch finds ninja on PATH: the one our venv installed (pyproject) sits beside this interpreter
        here, path = str(Path(sys.executable).parent), os.environ.get("PATH", "")
        if here not in path.split(os.pathsep):
            os.environ["PATH"] = os.pathsep.join([here, path])
        name = f"{name}_{_host_digest()}_{_headers_digest()}"
        # -fopenmp: at::parallel_for is an ``omp parallel`` region compiled into the caller (ATen/ParallelOpenMP.h);
        # without it the kernel ran on one thread whatever torch's count. The library it names, libgomp.so.1, is
        # the one torch loaded already (torch/lib), so the kernel's threads are torch's
        return load(name, [str(CSRC / source)], build_directory=_build_dir(name),
                    extra_cflags=["-O3", "-march=native", "-fopenmp", *cflags], extra_ldflags=["-fopenmp"],
                    verbose=False)
    except Exception as e:  # no compiler, no ninja, a read-only cache: the caller's torch path instead
        warnings.warn(f"trainer/engines/csrc/{source} could not be built here ({type(e).__name__}: {e}); "
                      f"{purpose}", RuntimeWarning, stacklevel=3)
        return None


@functools.cache
def own_keys_merge() -> Callable | None:
    """``own_keys_merge(q, k, v, o1, l1, scale)`` (csrc/decode_merge.cpp), or None where it cannot run here."""
    mod = _load("rlvr_decode_merge", "decode_merge.cpp", "decode attention takes torch's flash kernel")
    return None if mod is None else mod.own_keys_merge


@functools.cache
def decode_attend() -> Callable | None:
    """``decode_attend(q, pk, pv, bias, group, k, v, scale)`` (csrc/decode_attend.cpp), or None where it cannot run."""
    mod = _load("rlvr_decode_attend", "decode_attend.cpp", "decode attention takes torch's flash kernel and the merge")
    return None if mod is None else mod.decode_attend


@functools.cache
def segment_attend() -> object | None:
    """csrc/segment_attend.cpp's ``segment_attend``, ``forward`` and ``backward`` (trainer/models/segments.py), or
    None where it cannot run here."""
    return _load("rlvr_segment_attend", "segment_attend.cpp", "the packed row's attention takes torch's kernels")


@functools.cache
def rms_norm() -> object | None:
    """csrc/rms_norm.cpp's ``forward`` (trainer/models/norm.py), or None where it cannot run here."""
    return _load("rlvr_rms_norm", "rms_norm.cpp", "RMSNorm takes torch's ops")


@functools.cache
def rope() -> object | None:
    """csrc/rope.cpp's ``forward`` (trainer/models/rope.py), or None where it cannot run here. Built without FMA
    contraction: its products and sums round as torch's do."""
    return _load("rlvr_rope", "rope.cpp", "the rotary embedding takes torch's ops", ("-ffp-contract=off",))


@functools.cache
def vocab_softmax() -> object | None:
    """csrc/vocab_softmax.cpp's ``forward`` and ``backward`` (trainer/logprobs.py), or None where it cannot run."""
    return _load("rlvr_vocab_softmax", "vocab_softmax.cpp", "log-probs take torch's ops, chunk by chunk")


@functools.cache
def swiglu() -> object | None:
    """csrc/swiglu.cpp's ``forward`` and ``backward`` (trainer/models/mlp.py), or None where it cannot run here."""
    return _load("rlvr_swiglu", "swiglu.cpp", "the MLP's activation takes torch's ops")
