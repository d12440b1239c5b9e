"""Run untrusted programs: ``sandbox.run(program, stdin=..., limits=Limits(...)) -> Result``.

Backend ``local`` (the default) runs each program in a warm bubblewrap jail through a pre-forked worker;
backend ``docker`` runs one container per program where a Docker engine exists.

What IS isolated (local backend), each enforced from outside the program:
  * identity: uid/gid 65534 (nobody) outside the jail, no capabilities, no new privileges;
  * filesystem: only /usr/{bin,lib,lib64,share} read-only (not /usr/local or /usr/etc), a fresh /proc and a
    read-only minimal /dev; /tmp and /dev/shm are
    size-capped tmpfs, the only writable places, wiped after every run. No /etc, /home, /root, /work,
    no host secrets, no other run's files, no test files (tests never enter the jail);
  * environment: empty (bwrap starts with an empty environment, so /proc/1/environ is clean too);
  * network: own network namespace (loopback only, nothing listening), plus seccomp refusing every
    socket family but AF_UNIX: host services on 127.0.0.1 (Redis, Postgres) are unreachable;
  * processes: own PID namespace; every process the program started (setsid daemons, double forks)
    is SIGKILLed at the end of the run; ``cgroup.kill`` (v2) or the freezer (v1) ends the whole jail on
    recycle;
  * limits: wall clock (worker, plus a host watchdog), CPU time (RLIMIT_CPU), memory incl. tmpfs files
    and without swap, tasks (cgroup v1 or v2, whichever the host has: ``sandbox/cgroups.py``), output size,
    file size, open files; there are
    never more jails than cores, and ``LocalBackend(cpu_shares=...)`` can lower their CPU weight;
  * kernel surface: seccomp denies ptrace, mount/namespaces, bpf, perf, io_uring, userfaultfd, keys,
    modules, SysV IPC and POSIX message queues (they would outlive a run), TIOCSTI/TIOCLINUX (terminal
    injection) and more (see ``sandbox/seccomp.py``); the worker (PID 1) is not dumpable, so no run
    can read or write its memory through /proc.

What is NOT isolated:
  * the kernel itself: a kernel exploit escapes (this is not a VM); CPU time side channels;
  * runs in the same warm jail are sequential forks of one clean worker: a run cannot see an earlier
    run's files, processes or inputs (the worker never reads programs or stdin, and zeroes outputs),
    but it starts from a copy of the worker's interpreter (stdlib only, nothing secret is ever in it);
  * programs run inside an already started interpreter (fork, then ``exec`` of the source in a fresh
    ``__main__``), not a new ``python3`` process: a program sees a few stdlib modules pre-imported;
  * /usr/{bin,lib,lib64,share} are readable (the system's packaged software: public, no secrets);
  * a program's own stdout/stderr are returned as untrusted bytes: callers must judge them outside;
  * the processes of ONE run share its uid, PID namespace, scratch /tmp and limits: they can signal
    each other and starve each other of time or memory, but not read or write each other's memory
    (the run is not dumpable unless a process makes itself so; ptrace, process_vm_* and pidfd_getfd are
    denied) nor any descriptor they were not given. A harness that runs two parties in one run (the
    code verifier's judge and candidate, ``verifiers/code/_judge.py``) must treat a signalled or
    starved party as a failure, never a pass.

No code from a request, an upload or a dataset runs outside a jail: callers (verifiers) hand the
sandbox programs, tests and reference code alike, and only ever parse what comes back.

Sharing: ``with sandbox.lane(key, limit):`` caps how many jails the runs started in that context may
hold at once, across every context using the same key (the service gives each tenant one lane, so
one tenant's slow verifier cannot hold the whole pool); ``with sandbox.budget(seconds):`` caps the
jail-seconds they spend together (the service gives each request one): each run's wall limit is cut
to what is left, and what a run did not use is given back.

Harnesses: ``sandbox.run(sandbox.Harness(source), stdin)`` runs a program of the caller's own (never
untrusted text) that is sent compiled, once per process, when the jail runs our interpreter: a 10 KB
harness then costs no compile in each run.
"""
from __future__ import annotations

import contextvars
import dataclasses
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, Iterator, Sequence, Union

from .types import Harness, Limits, Result, SandboxError, SandboxUnavailable, Status, sandbox_error

Program = Union[str, bytes, Harness]
_backends: dict[str, tuple[int, Any]] = {}  # name -> (pid that built it, backend)
_lock = threading.Lock()
BACKENDS = {"local": "sandbox.local:LocalBackend", "docker": "sandbox.docker:DockerBackend"}


def get_backend(name: str = "local", **kwargs: Any) -> Any:
    """The shared backend ``name`` (built on first use); raises :class:`SandboxUnavailable` with the reason.

    A backend this host cannot run is probed once per process: the reason is logged once and every later
    call raises it again at once (each run then returns ``sandbox_error`` saying why), instead of probing
    the host again on every verifier call."""
    if name not in BACKENDS:
        raise ValueError(f"unknown sandbox backend {name!r}; known: {', '.join(sorted(BACKENDS))}")
    with _lock:
        pid, be = _backends.get(name, (0, None))
        if be is None or pid != os.getpid():  # a forked child (e.g. a Celery worker) needs its own jails
            import importlib
            module, _, attr = BACKENDS[name].partition(":")
            try:
                be = getattr(importlib.import_module(module), attr)(**kwargs)
            except SandboxUnavailable as e:
                be = e
                import logging
                logging.getLogger("rlvr.sandbox").warning("sandbox backend %r unavailable: %s", name, e)
            _backends[name] = (os.getpid(), be)
        if isinstance(be, SandboxUnavailable):
            raise be
        return be


class _Lane:
    def __init__(self, limit: int, wait_s: float) -> None:
        self.limit, self.wait_s = limit, wait_s
        self.slots = threading.BoundedSemaphore(limit)


_lanes: dict[str, _Lane] = {}
_current_lane: contextvars.ContextVar[_Lane | None] = contextvars.ContextVar("sandbox_lane", default=None)


@contextmanager
def lane(key: str, limit: int, wait_s: float = 600.0) -> Iterator[None]:
    """Runs started in this context (this thread and what it calls) share ``limit`` concurrent jails
    with every other context using the same ``key``: a caller's fair share of the pool (the service
    keys lanes by tenant). A run that waits longer than ``wait_s`` for its lane is a ``sandbox_error``."""
    if limit < 1:
        raise ValueError("a lane needs at least one slot")
    with _lock:
        ln = _lanes.get(key)
        if ln is None or ln.limit != limit:
            ln = _lanes[key] = _Lane(limit, wait_s)
    token = _current_lane.set(ln)
    try:
        yield
    finally:
        _current_lane.reset(token)


class Budget:
    """Jail-seconds the runs started in one context may spend together (the service gives each request
    one). A run reserves its wall limit, cut to what is left, before it starts, and gives back what it did
    not use; so however many runs there are, and however many at once, they never spend more."""

    def __init__(self, seconds: float) -> None:
        if not seconds > 0:
            raise ValueError("a budget needs seconds > 0")
        self.seconds = float(seconds)
        self._left = float(seconds)
        self._lock = threading.Lock()

    @property
    def spent(self) -> float:
        """Seconds used by finished runs plus those reserved by runs in flight."""
        with self._lock:
            return self.seconds - self._left

    def _reserve(self, want: float) -> float:
        with self._lock:
            got = min(want, self._left)
            if got < min(want, MIN_RUN_S):
                return 0.0
            self._left -= got
            return got

    def _settle(self, reserved: float, used: float) -> None:
        with self._lock:  # a run that overran its limit (the host watchdog's grace) leaves a debt
            self._left += reserved - used


MIN_RUN_S = 0.05  # less than this left is no run at all: an interpreter barely starts
# What one run costs the pool at least, however short its program or its limit: the fork, the result and the
# cleanup (4-5 ms on an idle 2-core machine, more under load). Budgets count every run as at least this.
RUN_FLOOR_S = 0.01


def run_cost(wall_s: float) -> float:
    """The jail-seconds a budget counts for a run whose wall limit is ``wall_s``, at most."""
    return max(wall_s, RUN_FLOOR_S)
_current_budget: contextvars.ContextVar[Budget | None] = contextvars.ContextVar("sandbox_budget", default=None)


@contextmanager
def budget(seconds: float) -> Iterator[Budget]:
    """Runs started in this context (this thread and what it calls, :func:`run_many`'s fan-out included)
    share ``seconds`` of jail wall clock: each run's limit is cut to what is left, and once it is spent a
    run is a ``timeout`` that never starts. Nested budgets: the innermost one counts."""
    b = Budget(seconds)
    token = _current_budget.set(b)
    try:
        yield b
    finally:
        _current_budget.reset(token)


def _metered(bud: Budget | None, be: Any, program: bytes | Harness, stdin: bytes, limits: Limits) -> Result:
    if bud is None:
        return be.run(program, stdin, limits)
    got = bud._reserve(run_cost(limits.wall_s))
    if got <= 0:
        return Result(Status.timeout, reason=f"the sandbox budget of {bud.seconds:g} s (for this request) is spent")
    cut = got < limits.wall_s
    if cut:
        limits = dataclasses.replace(limits, wall_s=got, cpu_s=min(limits.cpu, got))
    res = None
    try:
        res = be.run(program, stdin, limits)
    finally:
        bud._settle(got, run_cost(res.wall_s) if res is not None else got)
    if cut and res.status is Status.timeout:
        res = dataclasses.replace(res, reason=f"{res.reason} (cut to what was left of the {bud.seconds:g} s "
                                              "sandbox budget)")
    return res


def _one(ln: _Lane | None, bud: Budget | None, be: Any, program: bytes | Harness, stdin: bytes,
         limits: Limits) -> Result:
    if ln is None:
        return _metered(bud, be, program, stdin, limits)
    if not ln.slots.acquire(timeout=ln.wait_s):  # before reserving: a run waiting here spends nothing
        return sandbox_error(f"this caller's share of the sandbox pool stayed busy for {ln.wait_s:g}s")
    try:
        return _metered(bud, be, program, stdin, limits)
    finally:
        ln.slots.release()


def _b(x: Program | None) -> bytes:
    if isinstance(x, Harness):
        return x.source.encode()
    return b"" if x is None else x.encode() if isinstance(x, str) else bytes(x)


def _prog(be: Any, x: Program) -> bytes | Harness:
    """The program as ``be`` takes it: a Harness stays one for backends that compile it once."""
    return x if isinstance(x, Harness) and getattr(be, "compiles_harnesses", False) else _b(x)


def run(program: Program, stdin: Program | None = b"", limits: Limits | None = None,
        backend: str = "local") -> Result:
    """Run a Python ``program`` with ``stdin``; never raises for program or infrastructure failures."""
    try:
        be = get_backend(backend)
    except SandboxError as e:
        return sandbox_error(str(e))
    return _one(_current_lane.get(), _current_budget.get(), be, _prog(be, program), _b(stdin), limits or Limits())


def run_many(jobs: Sequence[tuple[Program, Program | None] | Program], limits: Limits | None = None,
             backend: str = "local") -> list[Result]:
    """Run many programs over the backend's pool; ``jobs`` are programs or (program, stdin) pairs."""
    lim = limits or Limits()
    pairs = [(j, b"") if isinstance(j, (str, bytes, Harness)) else (j[0], j[1]) for j in jobs]
    try:
        be = get_backend(backend)
    except SandboxError as e:
        return [sandbox_error(str(e)) for _ in pairs]
    norm = [(_prog(be, p), _b(i), lim) for p, i in pairs]
    ln, bud = _current_lane.get(), _current_budget.get()
    if ln is None and bud is None:
        return be.run_many(norm)
    # fan out no wider than the lane (the rest of the pool stays free for others), each run metered
    width = ln.limit if ln is not None else getattr(be, "size", 1)
    with ThreadPoolExecutor(max(1, min(width, len(norm)))) as ex:
        return list(ex.map(lambda j: _one(ln, bud, be, *j), norm))


async def run_async(program: Program, stdin: Program | None = b"", limits: Limits | None = None,
                    backend: str = "local") -> Result:
    """:func:`run` for asyncio code: waits in a thread, so the event loop keeps going."""
    import asyncio
    return await asyncio.to_thread(run, program, stdin, limits, backend)


def close() -> None:
    """Stop every warm jail (also done at interpreter exit)."""
    with _lock:
        for pid, be in _backends.values():
            if pid == os.getpid() and not isinstance(be, SandboxUnavailable):
                be.close()
        _backends.clear()


import atexit  # noqa: E402

atexit.register(close)

__all__ = ["Limits", "Result", "Status", "SandboxError", "SandboxUnavailable", "Harness", "run", "run_many",
           "run_async", "get_backend", "close", "lane", "budget", "Budget", "run_cost", "BACKENDS"]
