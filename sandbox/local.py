"""Backend ``local``: warm bwrap jails, each with one pre-forked worker (see ``_worker.py``), pooled.

One jail = ``setpriv`` to uid/gid 65534 without capabilities -> ``bwrap`` (new user, PID, network, IPC,
UTS and cgroup namespaces; read-only /usr/{bin,lib,lib64,share} and the jail's Python (interpreter.py),
empty tmpfs /tmp and /dev/shm, no /etc, /usr/local, /home, /root or /work; an empty environment; our
seccomp BPF; ``--new-session``) -> the worker as PID 1, inside its own control groups (memory, pids, cpu and
a way to kill the tree, on whichever cgroup layout the host has: cgroups.py). The host decides each Result
from the worker's plain JSON plus what it reads from the cgroups itself, and recycles the jail after
``recycle_after`` runs or after any run that was not plainly ok / runtime_error.
"""
from __future__ import annotations

import importlib.util
import json
import marshal
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from pathlib import Path
from typing import Sequence, Union

from . import cgroups, interpreter, seccomp
from .types import Harness, Limits, Result, SandboxError, SandboxUnavailable, Status, sandbox_error

PYTHON: str | None = None  # the jail's interpreter; None: $RLVR_SANDBOX_PYTHON or ours (sandbox/interpreter.py)
NOBODY = 65534
WORKER_SRC = (Path(__file__).parent / "_worker.py").read_text()
MiB = 1 << 20
START_TIMEOUT = 10.0  # seconds for a new jail to say it is ready
GRACE = 2.0           # seconds past the wall limit before the host stops waiting for the worker


# Only these parts of /usr (package-managed code and data): /usr/local and /usr/etc can hold a machine's
# own tools and credentials (an npmrc token, say) and stay outside.
USR_PARTS = ("bin", "lib", "lib64", "share")


def _usr_binds() -> list[str]:
    out: list[str] = []
    for part in USR_PARTS:
        path = f"/usr/{part}"
        if os.path.isdir(path) and not os.path.islink(path):
            out += ["--ro-bind", path, path]
    return out


def jail_python() -> interpreter.Interpreter:
    return interpreter.resolve(PYTHON, tuple(f"/usr/{p}" for p in USR_PARTS))


def bwrap_command(tmpfs_bytes: int, seccomp_fd: int) -> list[str]:
    py = jail_python()
    own = [a for src, dest in py.binds for a in ("--ro-bind", src, dest)]  # the interpreter + stdlib, read-only
    own += [a for h in py.hidden for a in ("--tmpfs", h, "--remount-ro", h)]  # its site-packages: empty
    return [
        "/usr/bin/setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--inh-caps=-all",
        "/usr/bin/bwrap",
        "--unshare-all", "--as-pid-1", "--new-session",
        "--clearenv", "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "LANG", "C.UTF-8",
        "--setenv", "HOME", "/tmp",
        *_usr_binds(), *own,
        "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64", "--symlink", "usr/bin", "/bin",
        "--proc", "/proc", "--dev", "/dev",
        "--size", str(tmpfs_bytes), "--tmpfs", "/tmp",
        "--size", str(tmpfs_bytes), "--tmpfs", "/dev/shm",  # POSIX semaphores (multiprocessing) live here
        "--remount-ro", "/dev", "--remount-ro", "/",
        "--seccomp", str(seccomp_fd),
        "--chdir", "/",
        py.executable, "-I", "-c", WORKER_SRC,
    ]


@lru_cache(maxsize=16)
def _compiled(source: str) -> bytes | None:
    """A harness's code, marshalled for the jail's interpreter, when that is the one running us (same
    bytecode); None: send its text."""
    py = jail_python()
    if py.executable != os.path.realpath(sys.executable) or py.version != sys.version.split()[0]:
        return None
    try:
        return importlib.util.MAGIC_NUMBER + marshal.dumps(compile(source, "main.py", "exec"))
    except (SyntaxError, ValueError):  # the jail reports it, as for any program
        return None


def _payload(program: Union[bytes, Harness]) -> tuple[bytes, bool]:
    if isinstance(program, Harness):
        code = _compiled(program.source)
        return (code, True) if code is not None else (program.source.encode(), False)
    return program, False


def probe() -> dict[str, str]:
    """Raise :class:`SandboxUnavailable` with the reason if this machine cannot run the local backend;
    else say what it will use (interpreter, cgroup layout)."""
    for tool in ("/usr/bin/bwrap", "/usr/bin/setpriv"):
        if not os.access(tool, os.X_OK):
            hint = " (apt-get install -y bubblewrap)" if "bwrap" in tool else ""
            raise SandboxUnavailable(f"local backend: {tool} not found{hint}")
    py = jail_python()
    seccomp.bpf_program()
    lay = cgroups.probe()
    return {"interpreter": py.describe(), "cgroups": lay.describe()}


class Jail:
    """One warm jail. Not thread-safe: the pool hands each jail to one thread at a time."""

    def __init__(self, tmpfs_bytes: int = 256 * MiB, cpu_shares: int = 1024) -> None:
        self.runs = 0
        self.cg = cgroups.CgroupSet("jail", cpu_shares)
        host, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        bpf = seccomp.bpf_fd()
        try:
            self.proc = subprocess.Popen(
                bwrap_command(tmpfs_bytes, bpf), stdin=child.fileno(), stdout=child.fileno(),
                stderr=subprocess.DEVNULL, env={},  # empty: bwrap's environment is readable in the jail
                pass_fds=(bpf,), preexec_fn=self.cg.join_self, close_fds=True,
            )
        except OSError as e:
            self.cg.remove()
            raise SandboxUnavailable(f"local backend: cannot start bwrap: {e}") from e
        finally:
            os.close(bpf)
            child.close()
        self.sock = host
        try:
            self.sock.settimeout(START_TIMEOUT)
            msg = self.sock.recv(4096)
            if json.loads(msg or b"{}").get("ready") is not True:
                raise SandboxError(f"jail did not start (got {msg[:200]!r}); is bwrap allowed user namespaces?")
        except (OSError, ValueError, SandboxError) as e:
            self.close()
            raise SandboxUnavailable(f"local backend: jail failed to start: {e}") from e
        self.base_tasks = self.cg.tasks()
        self.base_mem = self.cg.memory_usage()

    def run(self, program: bytes | Harness, stdin: bytes, limits: Limits) -> tuple[Result, bool]:
        """Run once; returns (result, healthy). An unhealthy jail must be closed, not reused."""
        self.runs += 1
        program, compiled = _payload(program)
        t0 = time.monotonic()
        ooms = -1
        try:
            self.cg.set_memory(limits.memory_mb * MiB + self.base_mem)
            self.cg.set_pids(self.base_tasks + limits.max_processes)
            ooms = self.cg.oom_kills()
            req = {"wall_s": limits.wall_s, "cpu_s": limits.cpu, "max_output_bytes": limits.max_output_bytes,
                   "max_file_bytes": limits.max_file_bytes, "max_open_files": limits.max_open_files,
                   "compiled": compiled}
            fds = [_memfd("program", program), _memfd("stdin", stdin)]
            try:
                socket.send_fds(self.sock, [json.dumps(req).encode()], fds)
            finally:
                for fd in fds:
                    os.close(fd)
            self.sock.settimeout(limits.wall_s + GRACE)
            head = _parse_head(self.sock.recv(65536), limits)
            out, err = self._recv_exact(head["out_len"]), self._recv_exact(head["err_len"])
        except socket.timeout:
            # The worker failed to enforce the wall clock: kill the jail from outside.
            self.close()
            return Result(Status.timeout, wall_s=time.monotonic() - t0,
                          reason="killed by the host watchdog: the jail overran its wall clock"), False
        except (OSError, ValueError, KeyError, TypeError) as e:
            oom = self._oom_since(ooms)
            self.close()
            if oom:  # the OOM killer chose the worker itself (all share one group): still the program's doing
                return Result(Status.memory_limit, wall_s=time.monotonic() - t0,
                              reason=f"OOM-killed at the {limits.memory_mb} MiB limit (jail restarted)"), False
            return sandbox_error(f"jail protocol failure: {e!r}", time.monotonic() - t0), False
        oom = self.cg.oom_kills() > ooms
        leftover = self.cg.tasks() - self.base_tasks
        healthy = not head["recycle"] and leftover == 0
        if head["error"]:
            return sandbox_error(f"jail: {head['error']}", head["wall"]), False
        if leftover:
            return sandbox_error(f"{leftover} process(es) survived the run's cleanup"), False
        sig = head["signal"]
        if oom:
            status, why = Status.memory_limit, f"OOM-killed at the {limits.memory_mb} MiB limit"
        elif head["output_exceeded"]:
            status, why = Status.output_limit, f"output passed {limits.max_output_bytes} bytes"
        elif head["timed_out"]:
            status, why = Status.timeout, f"wall clock limit {limits.wall_s}s"
        elif sig == signal.SIGXCPU or (sig == signal.SIGKILL and head["cpu"] >= limits.cpu / 2):
            # The kernel counts RLIMIT_CPU on the scheduler's clock, which in a VM includes steal time, so
            # rusage can read well under the limit when it fires: trust the signal, not the number. SIGKILL
            # is the hard limit (a program that caught SIGXCPU) only when the CPU time is near it.
            status, why = Status.timeout, f"CPU time limit {limits.cpu}s"
        elif head["exit"] == 0:
            status, why = Status.ok, ""
        else:
            status = Status.runtime_error
            why = f"killed by signal {sig}" if sig is not None else f"exit code {head['exit']}"
        healthy = healthy and status in (Status.ok, Status.runtime_error)
        res = Result(status=status, exit_code=head["exit"], signal=sig, stdout=bytes(out), stderr=bytes(err),
                     truncated=head["output_exceeded"], wall_s=head["wall"], cpu_s=head["cpu"],
                     peak_mem=head["maxrss"], reason=why)
        return res, healthy

    def _oom_since(self, before: int) -> bool:
        try:
            return before >= 0 and self.cg.oom_kills() > before
        except (OSError, ValueError):
            return False

    def _recv_exact(self, n: int) -> bytearray:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ValueError("jail closed the channel mid-output")
            buf += chunk
        if len(buf) != n:
            raise ValueError("jail sent more output than announced")
        return buf

    def close(self) -> None:
        if self.sock.fileno() >= 0:
            self.sock.close()  # the worker sees EOF and exits; cgroup.kill makes sure of the rest
        self.cg.kill()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.cg.remove()


def _memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(f"rlvr-{name}", os.MFD_CLOEXEC)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


_HEAD_TYPES = {"exit": (int, type(None)), "signal": (int, type(None)), "wall": (int, float),
               "cpu": (int, float), "maxrss": int, "timed_out": bool, "output_exceeded": bool,
               "out_len": int, "err_len": int, "recycle": bool, "error": (str, type(None))}


def _parse_head(msg: bytes, limits: Limits) -> dict:
    """The worker's answer, checked field by field: only these plain values cross the boundary."""
    if not msg:
        raise ValueError("jail closed the channel")
    head = json.loads(msg)
    if not isinstance(head, dict) or set(head) != set(_HEAD_TYPES):
        raise ValueError(f"malformed jail answer: {msg[:200]!r}")
    for k, t in _HEAD_TYPES.items():
        if not isinstance(head[k], t):
            raise ValueError(f"malformed jail answer field {k}: {head[k]!r}")
    if head["out_len"] + head["err_len"] > limits.max_output_bytes + 1 or min(head["out_len"], head["err_len"]) < 0:
        raise ValueError("jail announced more output than the limit")
    return head


class LocalBackend:
    """A pool of warm jails sized to the cores; ``run`` is thread-safe, ``run_many`` fans out over the pool."""

    name = "local"
    compiles_harnesses = True  # sandbox.Harness programs are sent compiled (_compiled)

    def __init__(self, workers: int | None = None, recycle_after: int = 1000, tmpfs_mb: int = 256,
                 cpu_shares: int = 1024, queue_timeout_s: float = 600.0) -> None:
        """``cpu_shares`` < 1024 makes jails yield to the host's other work when CPUs are contended;
        ``queue_timeout_s`` bounds how long a run waits for a free jail."""
        probe()
        cgroups.remove_stale()
        self.queue_timeout_s = queue_timeout_s
        self.cpu_shares = cpu_shares
        self.size = workers or os.cpu_count() or 1
        self.recycle_after = recycle_after
        self.tmpfs_bytes = tmpfs_mb * MiB
        self._idle: queue.LifoQueue[Jail] = queue.LifoQueue()
        self._slots = threading.Semaphore(self.size)
        self._lock = threading.Lock()
        self._live: set[Jail] = set()
        self._starting = 0
        self._closed = False

    def run(self, program: bytes | Harness, stdin: bytes, limits: Limits) -> Result:
        if not self._slots.acquire(timeout=self.queue_timeout_s):
            return sandbox_error(f"no jail became free within {self.queue_timeout_s}s")
        try:
            try:
                jail = self._acquire()
            except SandboxError as e:
                return sandbox_error(str(e))
            res, healthy = jail.run(program, stdin, limits)
            if healthy and jail.runs < self.recycle_after and not self._closed:
                self._idle.put(jail)
            else:
                self._retire(jail)
                if not self._closed:  # a jail takes ~0.1 s to start: make the replacement off this path
                    threading.Thread(target=self._spare, daemon=True).start()
            return res
        finally:
            self._slots.release()

    def _acquire(self) -> Jail:
        try:
            return self._idle.get_nowait()
        except queue.Empty:
            pass
        with self._lock:
            make = len(self._live) + self._starting < self.size
            self._starting += make
        if not make:  # a replacement is starting: wait for it (or for any jail coming back)
            try:
                return self._idle.get(timeout=START_TIMEOUT * 2)
            except queue.Empty:
                raise SandboxError("no jail became available in time") from None
        try:
            jail = Jail(self.tmpfs_bytes, self.cpu_shares)
        finally:
            with self._lock:
                self._starting -= 1
        with self._lock:
            self._live.add(jail)
        return jail

    def _spare(self) -> None:
        with self._lock:
            if self._closed or len(self._live) + self._starting >= self.size:
                return
            self._starting += 1
        jail = None
        try:
            jail = Jail(self.tmpfs_bytes, self.cpu_shares)
        except SandboxError:
            pass  # the next run() tries again and reports the error
        with self._lock:
            keep = jail is not None and not self._closed
            if keep:
                self._live.add(jail)
        if jail is not None and not keep:
            jail.close()  # before _starting drops, so close() has waited for it
        with self._lock:
            self._starting -= 1
        if keep:
            self._idle.put(jail)

    def run_many(self, jobs: Sequence[tuple[bytes | Harness, bytes, Limits]]) -> list[Result]:
        with ThreadPoolExecutor(self.size) as ex:
            return list(ex.map(lambda j: self.run(*j), jobs))

    def _retire(self, jail: Jail) -> None:
        with self._lock:
            self._live.discard(jail)
        jail.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
        deadline = time.monotonic() + START_TIMEOUT
        while self._starting and time.monotonic() < deadline:  # spares starting now retire themselves
            time.sleep(0.01)
        while True:
            try:
                self._retire(self._idle.get_nowait())
            except queue.Empty:
                break
        with self._lock:
            live = list(self._live)
        for jail in live:
            self._retire(jail)


__all__ = ["LocalBackend", "Jail", "probe", "bwrap_command"]
