"""The fork server's own process (started by forkserver.ForkServer): import sympy and the checker once,
then fork a worker per request. Kept apart from the client side so that the worker pool (worker.py),
which starts the server, and the server, which runs the workers, do not import each other."""
from __future__ import annotations

import os
import select
import signal
import socket

from . import exact, structure, symbolic, worker  # noqa: F401  (imported here so that every fork has them)
from .forkserver import _PID


def main(ctl_fd: int) -> None:
    """Server side (its own process): import sympy once, then fork a worker per request."""
    ctl = socket.socket(fileno=ctl_fd)

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the workers
    parent = os.getppid()
    ctl.sendall(b"R")
    poller = select.poll()
    poller.register(ctl, select.POLLIN)
    while True:
        if os.getppid() != parent:  # the client died without closing the socket
            os._exit(0)
        if not poller.poll(1000):
            continue
        msg, fds, _flags, _addr = socket.recv_fds(ctl, 1, 2)
        if not msg or len(fds) != 2:
            os._exit(0)
        pid = os.fork()
        if pid == 0:
            ctl.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            os.setsid()  # a terminal's Ctrl-C goes to the client, not to us
            os.dup2(fds[0], 0)
            os.dup2(fds[1], 1)
            for fd in fds:
                os.close(fd)
            try:
                worker.serve()
            finally:
                os._exit(0)
        for fd in fds:
            os.close(fd)
        ctl.sendall(_PID.pack(pid))
