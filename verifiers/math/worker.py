"""Hard time limits for sympy: it runs in small reusable subprocesses that are killed on overrun.

Why a subprocess: ``signal.alarm`` only fires in the main thread (Math-Verify's timeout silently does
nothing in a thread pool), a thread cannot be stopped, and ``multiprocessing`` may not start children
from a daemonic Celery prefork child. A child process with pipes works from any thread or process;
``poll`` on its stdout gives the deadline and a kill enforces it. Workers are forks of a fork server
that has already imported sympy (forkserver.py), so a killed worker is replaced in milliseconds, in
the background; where that is not available, each worker is a fresh interpreter (~0.5 s to start).

Every wait of a check is bounded by one deadline that the verifier derives from its ``budget_s``
(waiting for a free worker, for a starting one, and for the answer), so that a check returns within
its budget in any thread or process. The one exception is a cold pool: until a worker of this
process has become ready once, a check waits up to ``startup_timeout_s`` for sympy to import.
A worker that is still starting when a check's deadline passes is kept, not killed.

Protocol: the worker writes ``R`` when ready, then answers each length-prefixed pickled
``(gold_ast, pred_ast, decimal_rules)`` with a pickled ``(status, reason)``. Both ends are this module.
"""
from __future__ import annotations

import atexit
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import threading
import time

from . import forkserver

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


def _popen_worker():
    """A worker in a fresh interpreter: the fallback when there is no fork server."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [_ROOT, os.environ.get("PYTHONPATH")])))
    proc = subprocess.Popen(
        [sys.executable, "-c", "from verifiers.math.worker import serve; serve()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        env=env, start_new_session=True,  # terminal Ctrl-C goes to the parent, not to us
    )
    return proc.pid, None, proc, proc.stdin, proc.stdout


class _Worker:
    """One sympy worker process, talked to over two pipes. It is started on a thread of its own, so
    that no check waits for a start it does not need."""

    def __init__(self, launch) -> None:
        self.ready = False
        self.pid: int | None = None
        self.stdin = self.stdout = None
        self._pidfd: int | None = None  # a fork of the fork server: killed through its pidfd
        self._proc: subprocess.Popen | None = None  # a fresh interpreter: our own child
        self._started = threading.Event()
        self._lock = threading.Lock()
        self._killed = False
        threading.Thread(target=self._start, args=(launch,), name="math-worker-start", daemon=True).start()

    def _start(self, launch) -> None:
        try:
            handle = launch()
        except Exception:  # reported as a dead worker to whoever waits for it
            handle = None
        with self._lock:
            if handle is not None:
                self.pid, self._pidfd, self._proc, self.stdin, self.stdout = handle
            self._started.set()
            killed = self._killed
        if killed:
            self._killed = False
            self.kill()

    def wait_ready(self, deadline: float) -> None:
        if self.ready:
            return
        if not self._started.wait(max(0.0, deadline - time.monotonic())):
            raise TimeoutError
        if self.stdout is None:
            raise EOFError("worker failed to start")
        if _read_exact(self.stdout.fileno(), 1, deadline) != b"R":
            raise EOFError("worker sent garbage")
        self.ready = True

    def is_ready_now(self) -> bool:
        try:
            self.wait_ready(time.monotonic() + 0.0005)
        except (TimeoutError, EOFError, OSError):
            return False
        return True

    def dead(self) -> bool:
        """Exited (or failed to start) while idle."""
        with self._lock:
            if not self._started.is_set():
                return False
            if self.stdout is None or self._killed:
                return True
            if self._proc is not None:
                return self._proc.poll() is not None
            poller = select.poll()
            poller.register(self._pidfd, select.POLLIN)  # a pidfd is readable once the process exits
            return bool(poller.poll(0))

    def call(self, payload: bytes, deadline: float):
        self.stdin.write(_HEADER.pack(len(payload)) + payload)
        self.stdin.flush()
        fd = self.stdout.fileno()
        (n,) = _HEADER.unpack(_read_exact(fd, _HEADER.size, deadline))
        return pickle.loads(_read_exact(fd, n, deadline))

    def kill(self) -> None:
        """Kill the process and close its pipes; once, and also when it has not started yet."""
        with self._lock:
            if self._killed:
                return
            self._killed = True
            if not self._started.is_set():
                return  # _start kills it as soon as it exists
            proc, pidfd, files = self._proc, self._pidfd, (self.stdin, self.stdout)
            self._pidfd = None
        try:
            if proc is not None:
                proc.kill()
                proc.wait(timeout=5)
            elif pidfd is not None:
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        except Exception:  # already gone; nothing else to do
            pass
        if pidfd is not None:
            os.close(pidfd)
        for f in files:
            try:
                if f is not None:
                    f.close()
            except Exception:  # closing a pipe of a dead child can raise BrokenPipe
                pass

    def forget(self) -> None:
        """In a forked child of the pool's process: close our copies of the pipes, kill nothing."""
        for f in (self.stdin, self.stdout):
            try:
                if f is not None:
                    f.close()
            except Exception:  # best effort; the fds belong to the parent's workers
                pass
        if self._pidfd is not None:
            try:
                os.close(self._pidfd)
            except OSError:
                pass


class WorkerPool:
    """At most ``size`` workers per process, shared by all threads. ``warm`` starts them all, so that
    when one is killed another is already ready while its replacement imports sympy."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._idle: list[_Worker] = []
        self._live = 0
        self._cond = threading.Condition()
        self.ever_ready = False  # a worker of this process has finished importing sympy at least once
        self._server: forkserver.ForkServer | None = None
        self._server_lock = threading.Lock()  # one fork request at a time; also guards (re)starting it
        self._server_failed_at = -1e9

    def _launch(self):
        """Start one worker process (on the worker's own thread): a fork of the fork server, started
        on first use, or a fresh interpreter if the server cannot run here."""
        with self._server_lock:
            if self._server is not None and not self._server.alive():
                self._server.close()
                self._server = None
            if self._server is None and forkserver.available() and time.monotonic() - self._server_failed_at > 60:
                try:
                    self._server = forkserver.ForkServer(startup_timeout_s=120)
                except Exception:  # no fork server (sandboxed, odd platform): fresh interpreters
                    self._server_failed_at = time.monotonic()
            if self._server is not None:
                try:
                    pid, pidfd, stdin, stdout = self._server.fork()
                    return pid, pidfd, None, stdin, stdout
                except (OSError, EOFError, TimeoutError):
                    self._server.close()
                    self._server = None
        return _popen_worker()

    def warm(self, wait_s: float = 0.0) -> bool:
        """Start all workers; with ``wait_s``, also wait (that long at most) until the idle ones are
        ready. True when they are."""
        with self._cond:
            while self._live < self.size:
                self._idle.append(self._spawn())
            idle = list(self._idle)
        deadline = time.monotonic() + wait_s
        while True:
            with self._cond:  # is_ready_now reads a worker's pipe: not while another thread uses it
                pending = [w for w in idle if w in self._idle and not w.is_ready_now()]
            if len(pending) < len(idle):
                self.ever_ready = True
            if not pending or time.monotonic() >= deadline:
                return not pending
            time.sleep(0.01)

    def _spawn(self) -> _Worker:
        self._live += 1
        return _Worker(self._launch)

    def _acquire(self, deadline: float) -> _Worker | None:
        with self._cond:
            while True:
                for w in [w for w in self._idle if w.dead()]:  # died while idle
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
        """Kill ``w`` and start its replacement, off the caller's path: reaping a big process and
        starting a new one take milliseconds that the caller's budget does not have."""
        def replace() -> None:
            w.kill()
            with self._cond:
                self._live -= 1
                self._idle.append(self._spawn())  # replacement imports sympy while we carry on
                self._cond.notify()

        threading.Thread(target=replace, name="math-worker-replace", daemon=True).start()

    def check(self, gold, pred, rules, deadline: float, timeout_s: float,
              startup_timeout_s: float) -> tuple[str, str]:
        """("correct"|"wrong"|"timeout"|"error", reason). Every wait ends by ``deadline`` (a
        ``time.monotonic()`` value), the sympy work also after ``timeout_s``; only a cold pool (see
        the module docstring) may wait ``startup_timeout_s`` for its first worker."""
        payload = pickle.dumps((gold, pred, rules))
        for attempt in range(2):  # a second try only when a worker turned out to be dead
            cold = not self.ever_ready
            wait_until = max(deadline, time.monotonic() + startup_timeout_s) if cold else deadline
            w = self._acquire(wait_until)
            if w is None:
                if cold:
                    return "error", f"no free math worker within {startup_timeout_s:g}s"
                return "timeout", "no free math worker within the check's time budget"
            try:
                w.wait_ready(wait_until)
            except TimeoutError:
                self._release(w)  # still importing sympy: the next check can use it
                if cold:
                    return "error", f"math worker failed to start within {startup_timeout_s:g}s"
                return "timeout", "no math worker ready within the check's time budget"
            except (EOFError, OSError) as e:
                self._discard(w)
                if attempt == 0:
                    continue
                return "error", f"math worker failed to start ({type(e).__name__})"
            self.ever_ready = True
            start = time.monotonic()
            call_deadline = start + timeout_s if cold else min(start + timeout_s, deadline)
            if call_deadline <= start:  # the wait used the whole budget: sending the work now would only
                self._release(w)         # kill a healthy worker at once
                return "timeout", "no math worker free within the check's time budget"
            try:
                reply = w.call(payload, call_deadline)
            except TimeoutError:
                self._discard(w)
                return "timeout", f"sympy check exceeded {call_deadline - start:.2g}s"
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
        with self._server_lock:
            if self._server is not None:
                self._server.close()
                self._server = None


_pool: WorkerPool | None = None
_pool_lock = threading.Lock()


def get_pool(size: int) -> WorkerPool:
    """This process's pool, as large as the largest ``workers`` any verifier asked for."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = WorkerPool(size)
        elif size > _pool.size:
            with _pool._cond:
                _pool.size = size
                _pool._cond.notify_all()
        return _pool


def _forget_after_fork() -> None:
    """A forked child must not talk to its parent's workers: drop them (without killing)."""
    global _pool, _pool_lock
    if _pool is not None:
        for w in _pool._idle:
            w.forget()
        if _pool._server is not None:
            try:
                _pool._server.sock.close()
            except OSError:
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
        gold, pred, rules = pickle.loads(inp.read(_HEADER.unpack(head)[0]))
        try:
            ok, reason = compare(gold, pred, SympyEq(gold, rules))
            reply = ("correct" if ok else "wrong", reason)
        except MemoryError:
            reply = ("wrong", "answer too large to evaluate")
        except Exception as e:  # sympy rejecting a malformed answer: the answer's fault, not ours
            reply = ("wrong", f"could not evaluate answer ({type(e).__name__})")
        data = pickle.dumps(reply)
        out.write(_HEADER.pack(len(data)) + data)
        out.flush()
