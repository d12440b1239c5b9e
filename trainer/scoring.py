"""Turn completions into rewards with the job's verifiers (weighted sum of verdict scores).

Scoring runs in this process, or elsewhere through ``Scorer(specs, remote=...)`` (the service's verify
queue: CPU workers score, so a GPU worker never runs a verifier). Verifiers that run untrusted code use
the sandbox themselves, in whichever process.

Each call also measures verifier health (per verifier): calls, mean score, the rate of every verdict
status (error, timeout, unparseable, …) and per-completion latency p50/p95. A step that scores several
times (zero-variance groups resampled) reports ONE health record over all its calls
(:func:`health_metrics`): the numbers the dashboard and Prometheus show are the ones a job is paused on.
"""
from __future__ import annotations

import bisect
import json
import math
import time
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Sequence

from verifiers import BaseVerifier, Status, get_verifier

HEALTH_KEYS = ("calls", "mean", *(f"{s.value}_rate" for s in Status), "latency_p50_s", "latency_p95_s")
# Upper bounds of the per-call latency histogram each step records (``verifier/{name}/latency_counts``:
# one count per bound, then one for slower calls), so Prometheus can show a real histogram over a job:
# string checks take microseconds, sympy milliseconds, sandboxed programs up to their time limit
LATENCY_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


@dataclass
class Scores:
    rewards: list[float]                      # (N,) weighted sum over verifiers
    correct: list[bool]                       # (N,) primary (first) verifier said `correct`
    per_verifier: dict[str, list[float]]      # name -> (N,) scores
    statuses: dict[str, Counter] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    verdicts: dict[str, list[Any]] = field(default_factory=dict)       # name -> (N,) final verdicts
    infra: list[bool] = field(default_factory=list)    # (N,) an infrastructure failure survived the retry
    retried: int = 0                                   # completions scored a second time
    # every call made, retries included (health is over calls): name -> verdicts / seconds per call
    calls: dict[str, list[Any]] = field(default_factory=dict)
    latencies: dict[str, list[float]] = field(default_factory=dict)
    health: dict[str, dict[str, float]] = field(default_factory=dict)  # name -> HEALTH_KEYS

    def metrics(self) -> dict[str, float]:
        """``verifier/{name}/{key}`` for every health key: merge into the step's job metrics."""
        return health_metrics([self])


def _quantile(xs: Sequence[float], q: float) -> float:
    if not xs:
        return 0.0
    s = sorted(xs)
    pos = q * (len(s) - 1)  # linear interpolation between closest ranks (numpy's default)
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def health(verdicts: Sequence[Any], latencies: Sequence[float]) -> dict[str, float]:
    n = len(verdicts)
    st = Counter(v.status.value for v in verdicts)
    return {"calls": float(n), "mean": sum(v.score for v in verdicts) / n if n else 0.0,
            **{f"{s.value}_rate": st[s.value] / n if n else 0.0 for s in Status},
            "latency_p50_s": _quantile(latencies, 0.5), "latency_p95_s": _quantile(latencies, 0.95)}


def health_metrics(calls: Sequence[Scores]) -> dict[str, float]:
    """One health record over every scoring call of a step: ``verifier/{name}/{key}`` (HEALTH_KEYS)."""
    names = list(dict.fromkeys(n for sc in calls for n in sc.verdicts))
    out = {}
    for name in names:
        verdicts = [v for sc in calls for v in (sc.calls or sc.verdicts).get(name, [])]
        lat = [x for sc in calls for x in sc.latencies.get(name, [])]
        out.update({f"verifier/{name}/{k}": v for k, v in health(verdicts, lat).items()})
        out[f"verifier/{name}/latency_counts"] = latency_counts(lat)
        out[f"verifier/{name}/latency_sum_s"] = float(sum(lat))
    return out


def latency_counts(latencies: Sequence[float]) -> list[int]:
    """Calls per LATENCY_BUCKETS_S bucket (not cumulative; the last entry counts calls slower than all)."""
    counts = [0] * (len(LATENCY_BUCKETS_S) + 1)
    for x in latencies:
        counts[bisect.bisect_left(LATENCY_BUCKETS_S, x)] += 1
    return counts


def error_rate(scores: Scores, name: str | None = None, statuses: Sequence[str] = ("error",)) -> float:
    """Fraction of this step's calls whose verdict status is in ``statuses`` (default: ``error``, i.e.
    the verifier or its infrastructure failed), for verifier ``name`` or the worst verifier."""
    names = [name] if name is not None else list(scores.statuses)
    rates = [sum(scores.statuses[n][s] for s in statuses) / max(1, sum(scores.statuses[n].values())) for n in names]
    return max(rates, default=0.0)


def _spec_dict(s: Any) -> dict[str, Any]:
    if isinstance(s, dict):
        return {"name": s["name"], "weight": s.get("weight", 1.0), "config": s.get("config") or {},
                "version": s.get("version")}
    return {"name": s.name, "weight": s.weight, "config": dict(s.config or {}), "version": getattr(s, "version", None)}


def _build(specs: list[dict[str, Any]]) -> list[tuple[str, float, Any]]:
    entries, seen = [], Counter()
    for s in specs:
        seen[s["name"]] += 1  # the same verifier twice (different configs) gets "name#2"
        label = s["name"] if seen[s["name"]] == 1 else f"{s['name']}#{seen[s['name']]}"
        entries.append((label, s["weight"], get_verifier(s["name"], s["config"], version=s["version"])))
    for _label, _w, v in entries:  # start what a verifier needs (the math verifier's sympy workers) now,
        warm = getattr(v, "warm_up", None)  # so its first check is held to its time budget like the rest
        if callable(warm):
            warm()
    return entries


def _run(entries, completions: list[str], references: list[Any]) -> list[tuple[list[Any], list[float], float]]:
    """(verdicts, per-completion latencies, seconds) per verifier, in entry order."""
    out = []
    for _label, _w, verifier in entries:
        t0 = time.perf_counter()
        if type(verifier).verify_batch is BaseVerifier.verify_batch:
            # the default batch is a plain loop: run that loop here and time each call
            verdicts, lat = [], []
            for c, r in zip(completions, references):
                t = time.perf_counter()
                verdicts.append(verifier.verify(c, r))
                lat.append(time.perf_counter() - t)
        else:
            verdicts = verifier.verify_batch(completions, references)
            if len(verdicts) != len(completions):
                raise ValueError(f"verifier {_label!r} returned {len(verdicts)} verdicts for {len(completions)}")
            mean = (time.perf_counter() - t0) / max(1, len(completions))
            lat = [float(v.details.get("elapsed_s", mean)) for v in verdicts]  # measured per call if it can
        out.append((verdicts, lat, time.perf_counter() - t0))
    return out


@lru_cache(maxsize=32)
def _built(specs_json: str):
    return _build(json.loads(specs_json))


def run_specs(specs: list[dict[str, Any]], completions: list[str], references: list[Any]):
    """Score with verifiers built from plain spec dicts: what a remote scorer runs on its side.
    Verifiers are built once per process per spec set (a code verifier's jail pool is costly to start)."""
    return _run(_built(json.dumps(specs, sort_keys=True)), completions, references)


class Scorer:
    def __init__(self, specs: Sequence[Any], timeout_s: float = 3600.0, remote=None):
        """``specs``: objects with .name, .weight, .config (and .version) — trainer.config.VerifierSpec.

        ``remote(specs, completions, references, timeout_s)`` scores elsewhere instead (e.g. the
        service's `verify` Celery queue) and returns what :func:`run_specs` returns; ``timeout_s``
        bounds one such call.
        """
        self.remote = remote
        self.specs = [_spec_dict(s) for s in specs]
        self.entries = _build(self.specs)  # also validates every config here, before anything runs
        self.timeout_s = timeout_s

    def _score(self, completions: list[str], references: list[Any]):
        if self.remote is not None:
            return self.remote(self.specs, completions, references, self.timeout_s)
        return _run(self.entries, completions, references)

    def __call__(self, completions: Sequence[str], references: Sequence[Any], retry_infra: bool = True) -> Scores:
        """Score every completion. A completion on which a weighted verifier reported an infrastructure
        failure (status ``error``: sandbox down, verifier crash, an overloaded pool) is scored once more;
        if it fails again it is flagged in ``Scores.infra`` — its reward is not a judgement of the
        completion, so the trainer leaves it out of its group's statistics and of the loss."""
        if len(completions) != len(references):
            raise ValueError(f"{len(completions)} completions but {len(references)} references")
        comps, refs = list(completions), list(references)
        per = [(list(v), list(lat), sec) for v, lat, sec in self._score(comps, refs)]
        calls = {name: (list(v), list(lat)) for (name, _w, _v), (v, lat, _s) in zip(self.entries, per)}
        again = [j for j in range(len(comps)) if self._infra(per, j)] if retry_infra else []
        if again:
            second = self._score([comps[j] for j in again], [refs[j] for j in again])
            for (name, _w, _v), (verdicts, lat, sec), (v2, lat2, sec2) in zip(self.entries, per, second):
                for k, j in enumerate(again):
                    verdicts[j], lat[j] = v2[k], lat2[k]
                calls[name][0].extend(v2)
                calls[name][1].extend(lat2)
        out = Scores([0.0] * len(comps), [], {}, retried=len(again))
        for i, ((name, weight, _v), (verdicts, lat, seconds)) in enumerate(zip(self.entries, per)):
            out.seconds[name] = seconds
            out.per_verifier[name] = [v.score for v in verdicts]
            out.statuses[name] = Counter(v.status.value for v in verdicts)
            out.verdicts[name] = verdicts
            out.latencies[name] = calls[name][1]  # every call, retries included (health)
            out.health[name] = health(calls[name][0], calls[name][1])
            for j, v in enumerate(verdicts):
                out.rewards[j] += weight * v.score
            if i == 0:
                out.correct = [v.status.value == "correct" for v in verdicts]
        out.infra = [self._infra(per, j) for j in range(len(comps))]
        out.calls = {name: calls[name][0] for name in calls}
        return out

    def _infra(self, per, j: int) -> bool:
        return any(w != 0 and verdicts[j].status is Status.error for (_n, w, _v), (verdicts, _l, _s) in zip(self.entries, per))
