"""A fork server for sympy workers: sympy is imported once, and each worker is a fork of that process.

Why: a worker killed at its deadline must be replaced before the next check's budget runs out, and a
fresh interpreter needs 0.4-0.8 s to import sympy (longer on a loaded machine) -- as long as the
budget itself. A fork of a process that has already imported it is ready in milliseconds.

The server is started with ``Popen`` (so it works from any thread, and from a daemonic Celery child
where ``multiprocessing`` cannot start processes). The client sends it the child's two pipe ends
over a UNIX socket (``SCM_RIGHTS``); the server forks, the child runs ``worker.serve`` on those
pipes, and the server answers with the child's pid. The server ignores ``SIGCHLD`` so the kernel
reaps the children; the client kills a child through a pidfd, which cannot hit a recycled pid.
The server exits when its client closes the socket or dies; a child exits when the server dies.
"""
from __future__ import annotations

import os
import select
import signal
import socket
import struct
import subprocess
import sys
import time

_PID = struct.Struct("!i")
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def available() -> bool:
    return hasattr(socket, "send_fds") and hasattr(os, "pidfd_open") and hasattr(signal, "pidfd_send_signal")


class ForkServer:
    """Client side: start the server, then ``fork()`` workers from it."""

    def __init__(self, startup_timeout_s: float) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [_ROOT, os.environ.get("PYTHONPATH")])))
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", f"from verifiers.math.forkserved import main; main({theirs.fileno()})"],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),), env=env, start_new_session=True)
        finally:
            theirs.close()
        self.sock = ours
        if self._recv(1, time.monotonic() + startup_timeout_s) != b"R":
            self.close()
            raise OSError("fork server sent garbage")

    def _recv(self, n: int, deadline: float) -> bytes:
        buf = b""
        poller = select.poll()  # not select.select: Celery workers may hold fds above 1024
        poller.register(self.sock, select.POLLIN)
        while len(buf) < n:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not poller.poll(remaining * 1000):
                raise TimeoutError("fork server did not answer")
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise EOFError("fork server exited")
            buf += chunk
        return buf

    def alive(self) -> bool:
        return self.proc.poll() is None

    def fork(self, timeout_s: float = 10.0):
        """A new worker: (pid, pidfd, its stdin as a writable file, its stdout as a readable file)."""
        in_r, in_w = os.pipe()
        out_r, out_w = os.pipe()
        try:
            socket.send_fds(self.sock, [b"F"], [in_r, out_w])
            (pid,) = _PID.unpack(self._recv(_PID.size, time.monotonic() + timeout_s))
            pidfd = os.pidfd_open(pid)
        except BaseException:
            for fd in (in_w, out_r):
                os.close(fd)
            raise
        finally:
            os.close(in_r)
            os.close(out_w)
        return pid, pidfd, os.fdopen(in_w, "wb"), os.fdopen(out_r, "rb")

    def close(self) -> None:
        try:
            self.sock.close()
        finally:
            try:
                self.proc.kill()
                self.proc.wait(timeout=5)
            except Exception:  # already gone
                pass
