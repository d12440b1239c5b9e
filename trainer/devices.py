"""Where a job's tensors live: one accelerator per rank when there is one, the CPU otherwise.

``select(pref, local_rank)`` is the one place that decides: ``pref`` is the spec's ``train.device``
(``auto`` | ``cpu`` | ``cuda``); ``local_rank`` indexes the CUDA devices this process can see, which
``CUDA_VISIBLE_DEVICES`` has already narrowed (so rank r of a worker started with ``--gpus 2,3`` uses
physical GPU 2 + r as ``cuda:r``). ``describe()`` reports what a host offers (``rlvr doctor``).
"""
from __future__ import annotations

import os

import torch


class DeviceError(RuntimeError):
    """The spec asks for a device this host does not have."""


def cuda_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def select(pref: str = "auto", local_rank: int = 0) -> torch.device:
    n = cuda_count()
    if pref == "cpu" or (pref == "auto" and n == 0):
        return torch.device("cpu")
    if n == 0:
        raise DeviceError("train.device is 'cuda' but no CUDA device is visible "
                          f"(torch {torch.__version__}, "
                          f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})")
    if local_rank >= n:
        raise DeviceError(f"rank {local_rank} needs its own GPU but only {n} are visible "
                          f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})")
    return torch.device("cuda", local_rank)


def producer_device(pref: str = "auto") -> torch.device:
    """The async rollout producer's device (trainer/producer.py): a GPU of its own when this process sees
    more than one (the trainer keeps cuda:0), else the trainer's — one GPU holds both, no GPU: the CPU."""
    return select(pref, 1 if cuda_count() > 1 else 0)


def deterministic(on: bool) -> None:
    """Bit-for-bit repeatable kernels (``train.deterministic``): torch's deterministic algorithms (warn-only:
    an op without a deterministic kernel warns instead of failing the job) and cuBLAS's fixed workspace, which
    must be set before CUDA starts.

    Without torch's fill of every ``torch.empty`` (``fill_uninitialized_memory``, on by default with deterministic
    algorithms): a diagnostic that makes a kernel reading memory it never wrote repeat its garbage, where ours
    write every element they allocate. It filled ~3,500 tensors an update on SmolLM2-135M, ~30 ms of 2.75 s
    (bench/RESULTS.md, session 58); the repeated-run tests (tests/test_determinism.py) hold without it."""
    import os

    if on:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(on, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = False


def keep_freed_memory() -> bool:
    """glibc malloc: serve every allocation from the heap and keep freed memory for reuse instead of
    returning it to the system. By default a block over 32 MB is mmap'd and unmapped again when freed, so
    every training step page-faults its large tensors in afresh (the logits of a 49k vocabulary are
    ~120 MB each): SmolLM2's update at one thread 1.17-1.24x faster, ~460k page faults per update gone
    (bench/update.py). The cost: the heap stays near the peak of a step (SmolLM2 sync run, 30 steps:
    5.4 GB resident against a 4.4 GB peak with the defaults), which the next step reuses, as a GPU
    caching allocator does. Process-wide; returns whether it applied (False off glibc)."""
    import ctypes
    import ctypes.util
    import sys

    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and others: no mallopt
        return False
    M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # <malloc.h>
    # the threshold is a size_t that mallopt takes as an int: -1 becomes SIZE_MAX, never trim (a positive
    # int would cap it at 2 GB, less than a 135M model's update frees at the top of the heap)
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, -1))


def memory_metrics(device: torch.device) -> dict[str, float]:
    """GPU memory of this process on ``device`` (allocated now, peak since the last step), in GB."""
    if device.type != "cuda":
        return {}
    out = {"gpu/mem_allocated_gb": torch.cuda.memory_allocated(device) / 2**30,
           "gpu/mem_peak_gb": torch.cuda.max_memory_allocated(device) / 2**30}
    torch.cuda.reset_peak_memory_stats(device)
    return out


def visible_gpus(spec: str) -> list[str]:
    """``rlvr worker --gpus 0,1`` / ``all``: the GPU ids to run one worker on each (CUDA_VISIBLE_DEVICES
    values). Ids are checked, never passed through blindly: digits or GPU UUIDs only."""
    import re

    if spec.strip() == "all":
        inherited = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
        if inherited:  # this process sees GPUs 0..n-1 of that list: its children need the list's own ids
            return [s.strip() for s in inherited.split(",")][: cuda_count()]
        return [str(i) for i in range(cuda_count())]
    ids = [s.strip() for s in spec.split(",") if s.strip()]
    bad = [i for i in ids if not re.fullmatch(r"\d+|GPU-[0-9a-fA-F-]+|MIG-[0-9a-fA-F/-]+", i)]
    if bad or not ids or len(set(ids)) != len(ids):
        raise DeviceError(f"--gpus takes distinct GPU indices or UUIDs separated by commas, got {spec!r}")
    return ids


def describe() -> dict:
    """torch build, CPU kernel path and CUDA devices of this host."""
    cuda = [{"index": i, "name": torch.cuda.get_device_name(i),
             "memory_gb": round(torch.cuda.get_device_properties(i).total_memory / 2**30, 1)}
            for i in range(cuda_count())]
    return {"torch": torch.__version__, "cuda_build": torch.version.cuda, "cpu_capability":
            torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads(), "cuda_devices": cuda,
            "device": str(select("auto"))}
