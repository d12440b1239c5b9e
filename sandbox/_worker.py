"""The pre-forked worker: PID 1 of one bwrap jail, run by the jail's Python (``sandbox/interpreter.py``) as
``python -I -c <this file>``.

Standard library only; it never imports the rest of the package. Per request it forks one child that
reads the program and stdin straight from the memfds the host sent (so this process never holds a
program, a test input or anything else worth stealing: every child is a copy of it), runs the program
in a fresh ``__main__`` and exits. This process is not dumpable, so nothing in the jail can read or
write its memory through /proc (children inherit that until they exec). The worker enforces the wall
clock and the output size, then SIGKILLs every other process in the jail's PID namespace (``kill(-1)``
from PID 1 reaches exactly those, setsid daemons and double forks included), reaps them and wipes the
scratch /tmp and /dev/shm. The host checks the
task count and the OOM counter of the jail's cgroups itself; it trusts nothing here beyond plain JSON.

Protocol on fd 0 (an AF_UNIX SOCK_SEQPACKET socket): the host sends one JSON message with two fds
(program, stdin); the worker answers with one JSON message, then stdout and stderr as chunk messages.
"""
import atexit
import ctypes
import importlib.util
import io
import json
import linecache
import marshal
import os
import resource
import select
import signal
import socket
import sys
import time
import traceback
import types

# Modules programs commonly import, loaded once here so each forked run gets them for free: one line
# kept apart from the sorted block above (isort: split), the names unused here on purpose (F401).
# isort: split
import base64, bisect, collections, functools, heapq, itertools, math, re, string, typing  # noqa: E401,F401,I001

CHUNK = 32768
MAGIC = importlib.util.MAGIC_NUMBER
_libc = ctypes.CDLL(None, use_errno=True)


def _prctl(option, value):
    if _libc.prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}, {value}) failed")

SCRATCH = "/tmp"
WIPED = (SCRATCH, "/dev/shm")  # the only writable places


def _child(req, pfd, sfd, w_out, w_err):
    """Runs in the forked child; never returns."""
    code = 1
    try:
        os.setsid()
        cpu = max(1, int(-(-req["cpu_s"] // 1)))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        resource.setrlimit(resource.RLIMIT_FSIZE, (req["max_file_bytes"], req["max_file_bytes"]))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        src = os.pread(pfd, os.fstat(pfd).st_size, 0)
        os.dup2(sfd, 0)
        os.dup2(w_out, 1)
        os.dup2(w_err, 2)
        os.closerange(3, 65536)
        resource.setrlimit(resource.RLIMIT_NOFILE, (req["max_open_files"], req["max_open_files"]))
        os.chdir(SCRATCH)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)))
        sys.stdout = sys.__stdout__ = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "w", closefd=False)))
        sys.stderr = sys.__stderr__ = io.TextIOWrapper(io.FileIO(2, "w", closefd=False),
                                                       errors="backslashreplace", write_through=True)
        compiled = req["compiled"]  # a harness of the host's, compiled by this same interpreter (local.py)
        if compiled and src[:len(MAGIC)] != MAGIC:
            raise ValueError("the program was compiled for another Python")
        text = "" if compiled else src.decode("utf-8", "surrogateescape")
        linecache.cache["main.py"] = (len(text), None, text.splitlines(True), "main.py")
        main = types.ModuleType("__main__")
        main.__file__ = "main.py"
        sys.modules["__main__"] = main
        sys.argv = ["main.py"]
        blob = src[len(MAGIC):] if compiled else b""
        del src, req
        try:
            exec(marshal.loads(blob) if compiled else compile(text, "main.py", "exec"), main.__dict__)
            code = 0
        except SystemExit as e:
            code = _exit_code(e)
        except BaseException as e:
            traceback.print_exception(type(e), e, e.__traceback__.tb_next)  # hide the worker's frame
            code = 1
        try:
            if "threading" in sys.modules:
                sys.modules["threading"]._shutdown()
            atexit._run_exitfuncs()
        except SystemExit as e:
            code = _exit_code(e)
        except BaseException:
            pass
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:
                code = code or 120  # what CPython returns when flushing stdout fails at exit
    except BaseException as e:  # setup failed: say so on stderr, exit 1
        try:
            os.write(w_err, f"sandbox: child setup failed: {e!r}\n".encode())
        except OSError:
            pass
    os._exit(code)


def _exit_code(e):
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code & 0xFF
    try:
        sys.stderr.write(f"{e.code}\n")
    except BaseException:
        pass
    return 1


def _kill_all():
    """SIGKILL every process in this PID namespace but us and reap them all (orphans reparent to us)."""
    while True:
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def _wipe(path):
    for e in os.scandir(path):
        if e.is_dir(follow_symlinks=False):
            os.chmod(e.path, 0o700)  # a program may have made its directories unreadable
            _wipe(e.path)
            os.rmdir(e.path)
        else:
            os.unlink(e.path)


def _serve(sock, req, fds):
    pfd, sfd = fds
    r_out, w_out = os.pipe()
    r_err, w_err = os.pipe()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:
        sock.close()
        _child(req, pfd, sfd, w_out, w_err)
    for fd in (pfd, sfd, w_out, w_err):
        os.close(fd)
    pidfd = os.pidfd_open(pid)
    limit = req["max_output_bytes"]
    buf = {r_out: bytearray(), r_err: bytearray()}
    total, timed_out, exceeded, status, ru = 0, False, False, None, None
    deadline = t0 + req["wall_s"]
    poller = select.poll()
    for fd in (r_out, r_err, pidfd):
        poller.register(fd, select.POLLIN)
    open_fds = {r_out, r_err}
    while status is None or open_fds:
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = status is None
            break
        for fd, _ in poller.poll(left * 1000):
            if fd == pidfd:
                _, status, ru = os.wait4(pid, 0)
                poller.unregister(pidfd)
                _kill_all()  # the program is done: anything it left behind goes now
                continue
            data = os.read(fd, CHUNK)
            if not data:
                poller.unregister(fd)
                open_fds.discard(fd)
                continue
            room = limit + 1 - total  # keep one byte past the limit so the host sees it was passed
            buf[fd] += data[:room]
            total += min(len(data), room)
            if total > limit:
                exceeded = True
                break
        if exceeded:
            break
    wall = time.monotonic() - t0
    if status is None:
        os.kill(pid, signal.SIGKILL)
        _, status, ru = os.wait4(pid, 0)
    _kill_all()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    for fd in (r_out, r_err, pidfd):
        os.close(fd)
    recycle, error = False, None
    try:
        for d in WIPED:
            _wipe(d)
    except Exception as e:  # whatever it left that we cannot remove, the next run must not see
        recycle, error = True, f"scratch cleanup failed: {e!r}"
    out, err = buf[r_out], buf[r_err]
    head = {
        "exit": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
        "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
        "wall": wall,
        "cpu": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
        "maxrss": ru.ru_maxrss * 1024,
        "timed_out": timed_out,
        "output_exceeded": exceeded,
        "out_len": len(out),
        "err_len": len(err),
        "recycle": recycle,
        "error": error,
    }
    sock.send(json.dumps(head).encode())
    for data in (out, err):
        view = memoryview(data)
        for i in range(0, len(data), CHUNK):
            sock.send(view[i:i + CHUNK])
        view.release()
        data[:] = bytes(len(data))  # no copy of this run's output survives into the next child
    return recycle


def main():
    # Not dumpable: children (same uid) cannot read or write our memory through /proc/1/mem.
    _prctl(4, 0)  # PR_SET_DUMPABLE
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # PID 1 only gets signals it handles: handle none
    os.chdir("/")
    # Warm what every run uses (the compiler's first call costs ~1 ms, the UTF-8 encoder a bit), so each
    # fork inherits it ready instead of paying again.
    with open("/dev/null", "w", encoding="utf-8") as f:
        exec(compile("print(1, file=f)", "<warm>", "exec"), {"f": f})
    import gc
    gc.freeze()  # everything so far is shared with the children: keep their GC from touching (copying) it
    sock = socket.socket(fileno=0)
    os.dup2(os.open("/dev/null", os.O_RDWR), 1)  # fd 0/1 were the socket; keep 1 harmless
    sock.send(b'{"ready": true}')
    while True:
        msg, fds, _, _ = socket.recv_fds(sock, 65536, 2)
        if not msg:
            return  # host closed the channel: PID 1 exits, the kernel kills the rest of the jail
        if len(fds) != 2:
            for fd in fds:
                os.close(fd)
            sock.send(json.dumps({"error": "expected 2 fds", "recycle": True}).encode())
            return
        if _serve(sock, json.loads(msg), fds):
            return


main()
