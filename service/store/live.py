"""A running job's live state for GET /metrics, folded from each step record as the worker records it.

The runner calls :func:`fold` on every new step record and stores the result in the job's one
``job_live`` row; a scrape reads those rows for every running job in ONE query (service.api.prom), never
each job's metrics series. Pure functions: the previous state and a step record in, the next state out.

State: ``steps_per_s`` and ``tokens_per_s`` of the last step, its GPU memory in bytes, and per verifier the
last step's error rate and latency quantiles plus a latency histogram summed over every step recorded
(Prometheus histograms are cumulative: rate() over them gives calls/s per latency bucket).
"""
from __future__ import annotations

import math
from typing import Any

from trainer.scoring import LATENCY_BUCKETS_S

N_BUCKETS = len(LATENCY_BUCKETS_S) + 1  # the bounds, then +Inf


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def fold(prev: dict[str, Any] | None, m: dict[str, Any]) -> dict[str, Any]:
    """The live state after step record ``m``. What ``m`` lacks (an eval-only record) keeps its last value."""
    state = {k: v for k, v in (prev or {}).items() if k != "verifiers"}
    step_s, tokens_s = _num(m.get("time/step_s")), _num(m.get("tokens_per_s"))
    if step_s and step_s > 0:
        state["steps_per_s"] = 1.0 / step_s
    if tokens_s is not None:
        state["tokens_per_s"] = tokens_s
    gpu = _gpu_bytes(m)
    if gpu:
        state["gpu"] = gpu
    verifiers = {name: dict(v) for name, v in ((prev or {}).get("verifiers") or {}).items()}
    for key in m:
        parts = key.split("/")
        if len(parts) == 3 and parts[0] == "verifier" and parts[2] == "calls":
            verifiers[parts[1]] = _verifier(verifiers.get(parts[1], {}), parts[1], m)
    if verifiers:
        state["verifiers"] = verifiers
    return state


def _gpu_bytes(m: dict[str, Any]) -> dict[str, float]:
    """``gpu/mem_{kind}_gb`` (trainer.devices.memory_metrics) as bytes by kind: Prometheus' unit."""
    out = {}
    for k, v in m.items():
        x = _num(v)
        if x is not None and k.startswith("gpu/mem_") and k.endswith("_gb"):
            out[k[len("gpu/mem_"):-len("_gb")]] = x * 2**30
    return out


def _verifier(old: dict[str, Any], name: str, m: dict[str, Any]) -> dict[str, Any]:
    v = dict(old)
    for src, dst in (("error_rate", "error_rate"), ("latency_p50_s", "p50"), ("latency_p95_s", "p95")):
        x = _num(m.get(f"verifier/{name}/{src}"))
        if x is not None:
            v[dst] = x
    counts = m.get(f"verifier/{name}/latency_counts")
    if isinstance(counts, list) and len(counts) == N_BUCKETS and all(_num(c) is not None for c in counts):
        before = old.get("counts") if isinstance(old.get("counts"), list) and len(old["counts"]) == N_BUCKETS \
            else [0] * N_BUCKETS
        v["counts"] = [int(a) + int(b) for a, b in zip(before, counts)]
        v["sum"] = float(old.get("sum", 0.0)) + (_num(m.get(f"verifier/{name}/latency_sum_s")) or 0.0)
    return v


def histogram(counts: list[int]) -> list[tuple[str, int]]:
    """Prometheus buckets (cumulative, ``le`` as text) from per-bucket counts."""
    out, total = [], 0
    for bound, c in zip([*(repr(b) for b in LATENCY_BUCKETS_S), "+Inf"], counts):
        total += int(c)
        out.append((bound, total))
    return out
