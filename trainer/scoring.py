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
from typing import Any, NamedTuple, Sequence

from verifiers import Status, Verdict, Verifier, get_verifier
from verifiers.spec import VerifierSpec

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


class Entry(NamedTuple):
    """One of a job's verifiers, built: its label (``name``, or ``name#2`` for a second use), weight, verifier."""
    label: str
    weight: float
    verifier: Verifier


class Call(NamedTuple):
    """What one verifier made of a batch: a verdict and a latency per completion, and the seconds it took."""
    verdicts: list[Verdict]
    latencies: list[float]
    seconds: float


def _build(specs: Sequence[VerifierSpec]) -> list[Entry]:
    entries, seen = [], Counter()
    for s in specs:
        seen[s.name] += 1  # the same verifier twice (different configs) gets "name#2"
        label = s.name if seen[s.name] == 1 else f"{s.name}#{seen[s.name]}"
        entries.append(Entry(label, s.weight, get_verifier(s.name, dict(s.config), version=s.version)))
    for e in entries:  # start what a verifier needs (the math verifier's sympy workers) now,
        e.verifier.warm_up()  # so its first check is held to its time budget like the rest
    return entries


def _timed_one_by_one(verifier: Verifier, completions: list[str], references: list[Any]) -> tuple[list, list]:
    verdicts, lat = [], []
    for c, r in zip(completions, references):
        t = time.perf_counter()
        verdicts.append(verifier.verify(c, r))
        lat.append(time.perf_counter() - t)
    return verdicts, lat


def _run(entries: list[Entry], completions: list[str], references: list[Any]) -> list[Call]:
    """One Call per verifier, in entry order."""
    out = []
    for e in entries:
        t0 = time.perf_counter()
        if not e.verifier.batches:  # its batch is a plain loop: run that loop here and time each call
            verdicts, lat = _timed_one_by_one(e.verifier, completions, references)
        else:
            verdicts = e.verifier.verify_batch(completions, references)
            if len(verdicts) != len(completions):
                raise ValueError(f"verifier {e.label!r} returned {len(verdicts)} verdicts for {len(completions)}")
            mean = (time.perf_counter() - t0) / max(1, len(completions))
            lat = [float(v.details.get("elapsed_s", mean)) for v in verdicts]  # measured per call if it can
        out.append(Call(verdicts, lat, time.perf_counter() - t0))
    return out


@lru_cache(maxsize=32)
def _built(specs_json: str) -> list[Entry]:
    return _build([VerifierSpec.model_validate(d) for d in json.loads(specs_json)])


def run_specs(specs: list[dict[str, Any]], completions: list[str], references: list[Any]) -> list[Call]:
    """Score with verifiers built from the specs' JSON form: what a remote scorer runs on its side.
    Verifiers are built once per process per spec set (a code verifier's jail pool is costly to start)."""
    return _run(_built(json.dumps(specs, sort_keys=True)), completions, references)


class Scorer:
    def __init__(self, specs: Sequence[VerifierSpec], timeout_s: float = 3600.0, remote=None):
        """``remote(specs, completions, references, timeout_s)`` scores elsewhere instead (e.g. the
        service's `verify` Celery queue: ``specs`` as JSON dicts) and returns what :func:`run_specs`
        returns; ``timeout_s`` bounds one such call.
        """
        self.remote = remote
        self.specs = [s.model_dump(mode="json") for s in specs]
        self.entries = _build(specs)  # also validates every config here, before anything runs
        self.timeout_s = timeout_s

    def _score(self, completions: list[str], references: list[Any]) -> list[Call]:
        if self.remote is not None:  # a remote may answer in plain tuples (verdicts, latencies, seconds)
            return [Call(*c) for c in self.remote(self.specs, completions, references, self.timeout_s)]
        return _run(self.entries, completions, references)

    def __call__(self, completions: Sequence[str], references: Sequence[Any], retry_infra: bool = True) -> Scores:
        """Score every completion. A completion on which a weighted verifier reported an infrastructure
        failure (status ``error``: sandbox down, verifier crash, an overloaded pool) is scored once more;
        if it fails again it is flagged in ``Scores.infra`` — its reward is not a judgement of the
        completion, so the trainer leaves it out of its group's statistics and of the loss."""
        if len(completions) != len(references):
            raise ValueError(f"{len(completions)} completions but {len(references)} references")
        comps, refs = list(completions), list(references)
        final = [Call(list(c.verdicts), list(c.latencies), c.seconds) for c in self._score(comps, refs)]
        every = [Call(list(c.verdicts), list(c.latencies), c.seconds) for c in final]  # retries included
        again = [j for j in range(len(comps)) if self._infra(final, j)] if retry_infra else []
        if again:
            second = self._score([comps[j] for j in again], [refs[j] for j in again])
            for f, e, s in zip(final, every, second):
                for k, j in enumerate(again):
                    f.verdicts[j], f.latencies[j] = s.verdicts[k], s.latencies[k]
                e.verdicts.extend(s.verdicts)
                e.latencies.extend(s.latencies)
        out = Scores([0.0] * len(comps), [], {}, retried=len(again))
        for i, (entry, f, e) in enumerate(zip(self.entries, final, every)):
            name = entry.label
            out.seconds[name] = f.seconds
            out.per_verifier[name] = [v.score for v in f.verdicts]
            out.statuses[name] = Counter(v.status.value for v in f.verdicts)
            out.verdicts[name] = f.verdicts
            out.latencies[name] = e.latencies  # every call, retries included (health)
            out.health[name] = health(e.verdicts, e.latencies)
            out.calls[name] = e.verdicts
            for j, v in enumerate(f.verdicts):
                out.rewards[j] += entry.weight * v.score
            if i == 0:
                out.correct = [v.status.value == "correct" for v in f.verdicts]
        out.infra = [self._infra(final, j) for j in range(len(comps))]
        return out

    def _infra(self, calls: list[Call], j: int) -> bool:
        return any(e.weight != 0 and c.verdicts[j].status is Status.error for e, c in zip(self.entries, calls))
