"""Hard time limits for sympy: it runs in small reusable subprocesses that are killed on overrun.

Why a subprocess: ``signal.alarm`` only fires in the main thread (Math-Verify's timeout silently does
nothing in a thread pool), a thread cannot be stopped, and ``multiprocessing`` may not start children
from a daemonic Celery prefork child. A ``Popen`` child with pipes works from any thread or process;
``poll`` on its stdout gives the deadline and ``kill`` enforces it. A killed worker is replaced at
once, in the background, so the next check rarely waits for sympy to import (~0.4 s).

Protocol: the worker writes ``R`` when ready, then answers each length-prefixed pickled
``(gold_ast, pred_ast)`` with a pickled ``(status, reason)``. Both ends are this module.
"""
from __future__ import annotations

import atexit
import os
import pickle
import select
import struct
import subprocess
import sys
import threading
import time

_HEADER = struct.Struct("!I")
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_MEMORY_LIMIT = 2 << 30  # bytes of address space per worker: a runaway power fails fast instead


def _read_exact(fd: int, n: int, deadline: float) -> bytes:
    buf = b""
    poller = select.poll()  # not select.select: Celery workers may hold fds above 1024
    poller.register(fd, select.POLLIN)
    while len(buf) < n:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not poller.poll(remaining * 1000):
            raise TimeoutError
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            raise EOFError("worker exited")
        buf += chunk
    return buf


class _Worker:
    def __init__(self) -> None:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [_ROOT, os.environ.get("PYTHONPATH")])))
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from verifiers.math.worker import serve; serve()"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            env=env, start_new_session=True,  # terminal Ctrl-C goes to the parent, not to us
        )
        self.ready = False

    def wait_ready(self, deadline: float) -> None:
        if not self.ready:
            if _read_exact(self.proc.stdout.fileno(), 1, deadline) != b"R":
                raise EOFError("worker sent garbage")
            self.ready = True

    def is_ready_now(self) -> bool:
        try:
            self.wait_ready(time.monotonic() + 0.0005)
        except (TimeoutError, EOFError, OSError):
            return False
        return True

    def call(self, payload: bytes, deadline: float):
        self.proc.stdin.write(_HEADER.pack(len(payload)) + payload)
        self.proc.stdin.flush()
        fd = self.proc.stdout.fileno()
        (n,) = _HEADER.unpack(_read_exact(fd, _HEADER.size, deadline))
        return pickle.loads(_read_exact(fd, n, deadline))

    def kill(self) -> None:
        try:
            self.proc.kill()
            self.proc.wait(timeout=5)
        except Exception:  # already gone; nothing else to do
            pass
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except Exception:  # closing a pipe of a dead child can raise BrokenPipe
                pass


class WorkerPool:
    """At most ``size`` workers per process, shared by all threads. ``warm`` starts them all, so that
    when one is killed another is already ready while its replacement imports sympy."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._idle: list[_Worker] = []
        self._live = 0
        self._cond = threading.Condition()

    def warm(self) -> None:
        with self._cond:
            while self._live < self.size:
                self._idle.append(self._spawn())

    def _spawn(self) -> _Worker:
        self._live += 1
        return _Worker()

    def _acquire(self, deadline: float) -> _Worker | None:
        with self._cond:
            while True:
                for w in [w for w in self._idle if w.proc.poll() is not None]:  # died while idle
                    self._idle.remove(w)
                    self._live -= 1
                    w.kill()
                for k, w in enumerate(self._idle):  # prefer one that has finished importing sympy
                    if w.is_ready_now():
                        return self._idle.pop(k)
                if self._idle:
                    return self._idle.pop(0)
                if self._live < self.size:
                    return self._spawn()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._cond.wait(remaining)

    def _release(self, w: _Worker) -> None:
        with self._cond:
            self._idle.append(w)
            self._cond.notify()

    def _discard(self, w: _Worker) -> None:
        w.kill()
        with self._cond:
            self._live -= 1
            self._idle.append(self._spawn())  # replacement imports sympy while we carry on
            self._cond.notify()

    def check(self, gold, pred, timeout_s: float, startup_timeout_s: float) -> tuple[str, str]:
        """("correct"|"wrong"|"timeout"|"error", reason). ``timeout_s`` bounds the sympy work only;
        waiting for a free or starting worker is bounded separately by ``startup_timeout_s``."""
        payload = pickle.dumps((gold, pred))
        for attempt in range(2):  # a second try only when a worker turned out to be dead
            w = self._acquire(time.monotonic() + startup_timeout_s)
            if w is None:
                return "error", f"no free math worker within {startup_timeout_s:g}s"
            try:
                w.wait_ready(time.monotonic() + startup_timeout_s)
            except (TimeoutError, EOFError, OSError) as e:
                self._discard(w)
                if attempt == 0 and not isinstance(e, TimeoutError):
                    continue
                return "error", f"math worker failed to start ({type(e).__name__})"
            try:
                reply = w.call(payload, time.monotonic() + timeout_s)
            except TimeoutError:
                self._discard(w)
                return "timeout", f"sympy check exceeded {timeout_s:g}s"
            except (EOFError, OSError) as e:
                self._discard(w)
                if attempt == 0:
                    continue  # killed while idle (OOM killer, operator): retry on a fresh worker
                return "error", f"math worker died ({type(e).__name__})"
            except BaseException:  # KeyboardInterrupt mid-call: the worker's state is unknown
                self._discard(w)
                raise
            self._release(w)
            return reply
        return "error", "math workers keep dying"

    def close(self) -> None:
        with self._cond:
            idle, self._idle = self._idle, []
            self._live -= len(idle)
        for w in idle:
            w.kill()


_pool: WorkerPool | None = None
_pool_lock = threading.Lock()


def get_pool(size: int) -> WorkerPool:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = WorkerPool(size)
        return _pool


def _forget_after_fork() -> None:
    """A forked child must not talk to its parent's workers: drop them (without killing)."""
    global _pool, _pool_lock
    if _pool is not None:
        for w in _pool._idle:
            for f in (w.proc.stdin, w.proc.stdout):
                try:
                    f.close()
                except Exception:  # best effort; the fds belong to the parent's workers
                    pass
    _pool, _pool_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)
atexit.register(lambda: _pool is not None and _pool.close())


def serve() -> None:
    """Worker main loop (runs in the child)."""
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (_MEMORY_LIMIT, _MEMORY_LIMIT))
    except (ImportError, ValueError, OSError):  # not fatal: the time limit still holds
        pass
    from .structure import compare
    from .symbolic import SympyEq

    parent = os.getppid()

    def orphan_watch() -> None:  # exit if the parent dies mid-computation: nobody would kill us
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=orphan_watch, daemon=True).start()
    inp, out = sys.stdin.buffer, os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # a stray print() from any library must not corrupt the protocol: send it to stderr
    out.write(b"R")
    out.flush()
    while True:
        head = inp.read(_HEADER.size)
        if len(head) < _HEADER.size:
            return  # parent closed the pipe or died
        gold, pred = pickle.loads(inp.read(_HEADER.unpack(head)[0]))
        try:
            ok, reason = compare(gold, pred, SympyEq(gold))
            reply = ("correct" if ok else "wrong", reason)
        except MemoryError:
            reply = ("wrong", "answer too large to evaluate")
        except Exception as e:  # sympy rejecting a malformed answer: the answer's fault, not ours
            reply = ("wrong", f"could not evaluate answer ({type(e).__name__})")
        data = pickle.dumps(reply)
        out.write(_HEADER.pack(len(data)) + data)
        out.flush()
