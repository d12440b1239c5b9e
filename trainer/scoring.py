"""Turn completions into rewards with the job's verifiers (weighted sum of verdict scores).

Scoring runs in this process, or with ``Scorer(specs, workers=N)`` in N child processes that each
build the verifiers once: the batch is cut into N contiguous chunks and put back in order, so rewards,
statuses and verdicts are identical either way (a test holds this). The pool keeps slow CPU-bound
verifiers off the trainer's process and scores chunks in parallel; the step still needs every reward
before its update. Verifiers that run untrusted code use the sandbox themselves, in whichever process.

Each call also measures verifier health (per verifier): calls, mean score, error / timeout /
unparseable rates and per-completion latency p50/p95 — :meth:`Scores.metrics` flattens it for the
job metrics and :func:`error_rate` is the number a caller pauses a job on.
"""
from __future__ import annotations

import json
import math
import os
import pickle
import select
import struct
import subprocess
import sys
import time
import traceback
import weakref
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Sequence

from verifiers import BaseVerifier, get_verifier

HEALTH_KEYS = ("calls", "mean", "error_rate", "timeout_rate", "unparseable_rate", "latency_p50_s", "latency_p95_s")


@dataclass
class Scores:
    rewards: list[float]                      # (N,) weighted sum over verifiers
    correct: list[bool]                       # (N,) primary (first) verifier said `correct`
    per_verifier: dict[str, list[float]]      # name -> (N,) scores
    statuses: dict[str, Counter] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    verdicts: dict[str, list[Any]] = field(default_factory=dict)
    health: dict[str, dict[str, float]] = field(default_factory=dict)  # name -> HEALTH_KEYS

    def metrics(self) -> dict[str, float]:
        """``verifier/{name}/{key}`` for every health key: merge into the step's job metrics."""
        return {f"verifier/{name}/{k}": v for name, h in self.health.items() for k, v in h.items()}


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
            "error_rate": st["error"] / n if n else 0.0, "timeout_rate": st["timeout"] / n if n else 0.0,
            "unparseable_rate": st["unparseable"] / n if n else 0.0,
            "latency_p50_s": _quantile(latencies, 0.5), "latency_p95_s": _quantile(latencies, 0.95)}


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


# ---------------------------------------------------------------------------------------- pool
# Pool processes are plain Popen children speaking length-prefixed pickles on their stdin/stdout (both
# ends are this module): unlike multiprocessing, that works from a daemonic Celery prefork child and
# from any thread, and a deadline on the pipe lets a hung child be killed instead of waited on.
_HEADER = struct.Struct("!Q")


def _send(f, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    f.write(_HEADER.pack(len(data)) + data)
    f.flush()


def _recv(fd: int, deadline: float | None) -> Any:
    def exact(n: int) -> bytes:
        buf = bytearray()
        poller = select.poll()  # not select.select: a Celery worker may hold fds above 1024
        poller.register(fd, select.POLLIN)
        while len(buf) < n:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0 or not poller.poll(left * 1000):
                    raise TimeoutError("scoring worker did not answer in time")
            chunk = os.read(fd, min(n - len(buf), 1 << 20))
            if not chunk:
                raise EOFError("scoring worker exited")
            buf += chunk
        return bytes(buf)

    (n,) = _HEADER.unpack(exact(_HEADER.size))
    return pickle.loads(exact(n))


def _serve() -> None:
    """Pool process main: build the verifiers from the first message, then score each request."""
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # prints from verifiers go to stderr, never into the protocol
    sys.stdout = sys.stderr
    entries = None
    while True:
        try:
            kind, payload = _recv(0, None)
        except EOFError:
            return
        try:
            if kind == "init":
                entries = _build(payload)
                _send(out, ("ok", None))
            else:
                _send(out, ("ok", _run(entries, *payload)))
        except Exception:
            _send(out, ("error", traceback.format_exc()[-4000:]))


class _Worker:
    def __init__(self, specs: list[dict[str, Any]], deadline: float):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))  # same imports as here
        self.proc = subprocess.Popen([sys.executable, "-c", "from trainer.scoring import _serve; _serve()"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                                     start_new_session=True)  # a terminal's Ctrl-C goes to the trainer only
        self.call(("init", specs), deadline)

    def call(self, msg: Any, deadline: float) -> Any:
        try:
            _send(self.proc.stdin, msg)
            status, payload = _recv(self.proc.stdout.fileno(), deadline)
        except (OSError, EOFError, TimeoutError):
            self.kill()
            raise
        if status == "error":
            raise RuntimeError(f"scoring worker failed:\n{payload}")
        return payload

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # unkillable (D state): leave it to the OS, don't hang here
            pass
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass


def _kill_all(workers: list[_Worker]) -> None:
    for w in workers:
        w.kill()
    workers.clear()


class Scorer:
    def __init__(self, specs: Sequence[Any], workers: int = 0, timeout_s: float = 3600.0, remote=None):
        """``specs``: objects with .name, .weight, .config (and .version) — trainer.config.VerifierSpec.

        ``workers`` > 0 scores in that many child processes (started on first use, reused, killed on
        :meth:`close`); ``timeout_s`` bounds one call: a pool that does not answer in time is killed.
        ``remote(specs, completions, references, timeout_s)`` scores elsewhere instead (e.g. the
        service's `verify` Celery queue) and returns what :func:`run_specs` returns.
        """
        self.remote = remote
        self.specs = [_spec_dict(s) for s in specs]
        self.entries = _build(self.specs)  # also validates every config here, before any pool starts
        self.workers, self.timeout_s = workers, timeout_s
        self._pool: list[_Worker] = []
        # a long-lived Celery worker runs many jobs: a forgotten close() must not leak processes
        self._finalizer = weakref.finalize(self, _kill_all, self._pool)

    def close(self) -> None:
        _kill_all(self._pool)

    def __enter__(self) -> "Scorer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _score(self, completions: list[str], references: list[Any]):
        if self.remote is not None:
            return self.remote(self.specs, completions, references, self.timeout_s)
        if self.workers <= 0 or len(completions) < 2:
            return _run(self.entries, completions, references)
        deadline = time.monotonic() + self.timeout_s
        self._pool[:] = [w for w in self._pool if w.alive()]
        while len(self._pool) < self.workers:
            self._pool.append(_Worker(self.specs, deadline))
        k = min(self.workers, len(completions))
        bounds = [(len(completions) * i // k, len(completions) * (i + 1) // k) for i in range(k)]
        with ThreadPoolExecutor(k) as ex:  # threads only wait on pipes; the work is in the children
            futures = [ex.submit(w.call, ("run", (completions[a:b], references[a:b])), deadline)
                       for w, (a, b) in zip(self._pool, bounds)]
            parts = [f.result() for f in futures]  # each call has the deadline
        return [(sum((p[i][0] for p in parts), []), sum((p[i][1] for p in parts), []), max(p[i][2] for p in parts))
                for i in range(len(self.entries))]

    def __call__(self, completions: Sequence[str], references: Sequence[Any]) -> Scores:
        if len(completions) != len(references):
            raise ValueError(f"{len(completions)} completions but {len(references)} references")
        rewards = [0.0] * len(completions)
        out = Scores(rewards, [], {})
        per = self._score(list(completions), list(references))
        for i, ((name, weight, _v), (verdicts, lat, seconds)) in enumerate(zip(self.entries, per)):
            out.seconds[name] = seconds
            out.per_verifier[name] = [v.score for v in verdicts]
            out.statuses[name] = Counter(v.status.value for v in verdicts)
            out.verdicts[name] = verdicts
            out.health[name] = health(verdicts, lat)
            for j, v in enumerate(verdicts):
                rewards[j] += weight * v.score
            if i == 0:
                out.correct = [v.status.value == "correct" for v in verdicts]
        return out
