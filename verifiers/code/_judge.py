# Runs INSIDE the jail, appended to values.py's source (so ``encode``, ``decode`` and ``Opaque`` are in
# scope): one jail run judges one completion against HumanEval-style tests, as two processes.
#
#   candidate  forked first, before the tests are read, so they are never in its memory; it loads the
#              completion and answers each call with a typed plain value (values.py), nothing else;
#   judge      runs the reference's prompt and ``check(candidate)`` against a proxy whose every call is
#              one message to the candidate, and alone holds the verdict channel (the run's stdout).
#
# The candidate cannot write the verdict channel (closed in it before any of its code runs), nor read
# or write the judge's memory (the run is not dumpable; ptrace, process_vm_* and pidfd_getfd are denied
# by the jail's seccomp filter). Whatever else it does to the judge (a signal, starving it of time or
# memory) ends the run without a verdict, which the host scores as a failure, never as a pass.
import json as _json
import os as _os
import signal as _signal
import socket as _socket
import struct as _struct
import sys as _sys
import time as _time

_HEAD = _struct.Struct(">I")
_MAX_MESSAGE = 64 << 20  # a result bigger than this is the candidate's failure, not the judge's memory


class CandidateFailed(BaseException):
    """A BaseException, so a check's own ``except Exception`` cannot turn a crash into a pass."""

    def __init__(self, kind, detail):
        super().__init__(f"{kind}: {detail}")
        self.kind, self.detail = kind, detail


class ReferenceBroken(BaseException):
    """The reference itself is unusable (the dataset's problem, not the candidate's)."""


def _send(sock, obj):
    data = _json.dumps(obj).encode()
    sock.sendall(_HEAD.pack(len(data)) + data)


def _recv_exact(sock, n, deadline):
    buf = bytearray()
    while len(buf) < n:
        if deadline is not None:
            left = deadline - _time.monotonic()
            if left <= 0:
                raise _socket.timeout()
            sock.settimeout(left)
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise EOFError()
        buf += chunk
    return bytes(buf)


def _recv(sock, deadline=None):
    (n,) = _HEAD.unpack(_recv_exact(sock, 4, deadline))
    if n > _MAX_MESSAGE:
        raise ValueError(f"a message of {n} bytes")
    return _json.loads(_recv_exact(sock, n, deadline))


def _describe(e):
    try:
        return f"{type(e).__name__}: {e}"[:500]
    except BaseException:  # noqa: BLE001 - a __str__ that raises
        return type(e).__name__[:200]


# -- the candidate's process -----------------------------------------------------------------------------
def _candidate(sock):
    try:
        req = _recv(sock)
    except BaseException:  # noqa: BLE001 - the judge gave up before loading (a broken reference)
        return
    g = {"__name__": "solution", "__builtins__": __builtins__}
    try:
        exec(compile(req["code"], "solution.py", "exec"), g)
        fn = g.get(req["entry_point"])
        if not callable(fn):
            raise NameError(f"no function named {req['entry_point']!r}")
    except BaseException as e:  # noqa: BLE001 - any failure to load is the candidate's
        _send(sock, {"load_error": _describe(e)})
        return
    _send(sock, {"loaded": True})
    while True:
        try:
            args, kwargs = _recv(sock)
        except EOFError:
            return
        try:
            line = {"ok": encode(fn(*decode(args), **decode(kwargs)))}
        except BaseException as e:  # noqa: BLE001 - reported, judged by the judge
            line = {"exc": type(e).__name__[:200]}
        _send(sock, line)


def _become_candidate(sock, verdict_fd):
    """In the forked child: keep only stderr and the socket (as fd 3), then serve calls; never returns."""
    try:
        fd = sock.detach()
        _os.dup2(fd, 3)
        null = _os.open("/dev/null", _os.O_RDONLY)
        _os.dup2(null, 0)        # the tests arrive on stdin: this process never reads it
        _os.dup2(2, 1)           # the verdict channel is gone; prints go to stderr
        _os.closerange(4, 1 << 16)  # the verdict channel among them
        _candidate(_socket.socket(fileno=3))
        for stream in (_sys.stdout, _sys.stderr):
            stream.flush()
    except BaseException:  # noqa: BLE001 - whatever it did, the judge sees the socket close
        pass
    _os._exit(0)


# -- the judge's process ---------------------------------------------------------------------------------
class _Proxy:
    """``candidate`` as ``check`` sees it: each call is one round trip to the candidate's process.
    A failure is sticky: a check that swallows it (a bare ``except:``) still fails."""

    def __init__(self, sock, pid, deadline, max_calls):
        self.sock, self.pid, self.deadline, self.max_calls = sock, pid, deadline, max_calls
        self.calls = 0
        self.failure = None
        self.broken = None

    def _fail(self, kind, detail):
        if self.failure is None:
            self.failure = CandidateFailed(kind, detail)
        self.stop()
        raise self.failure

    def _ask(self, obj, what):
        try:
            _send(self.sock, obj)
            return _recv(self.sock, self.deadline)
        except _socket.timeout:
            self._fail("timeout", f"{what} did not return within the time limit")
        except (EOFError, OSError):
            self._fail("crashed", f"the candidate's process ended during {what}{self._exit_status()}")
        except (ValueError, TypeError, RecursionError):
            self._fail("malformed", f"unreadable answer to {what}")

    def load(self, code, entry_point):
        ans = self._ask({"code": code, "entry_point": entry_point}, "loading")
        if ans == {"loaded": True}:
            return None
        if type(ans) is dict and set(ans) == {"load_error"}:
            return str(ans["load_error"])[:500]
        return "unexpected answer while loading"

    def __call__(self, *args, **kwargs):
        if self.failure is not None:
            raise self.failure
        enc = encode([list(args), kwargs])
        if _has_opaque(enc):
            if any(isinstance(a, Opaque) for a in (*args, *kwargs.values())):
                raise OpaqueValueUsed("a non-plain result was passed back to the candidate")
            self.broken = self.broken or "check passed a non-plain argument to the candidate"
            raise ReferenceBroken(self.broken)
        self.calls += 1
        if self.calls > self.max_calls:
            self._fail("too_many_calls", f"check made more than {self.max_calls} calls")
        ans = self._ask([enc[0], enc[1]], f"call {self.calls}")
        if type(ans) is dict and len(ans) == 1:
            if "ok" in ans:
                try:
                    return decode(ans["ok"])
                except (ValueError, TypeError, OverflowError, RecursionError, OpaqueValueUsed) as e:
                    self._fail("malformed", f"unreadable result of call {self.calls}: {_describe(e)}")
            if type(ans.get("exc")) is str:
                self._fail("exception", f"candidate raised {ans['exc'][:100]} on call {self.calls}")
        self._fail("malformed", f"unexpected answer to call {self.calls}")

    def _exit_status(self):
        pid = status = 0
        for _ in range(20):  # it closed its end: give it a moment to exit, then it is killed
            try:
                pid, status = _os.waitpid(self.pid, _os.WNOHANG)
            except ChildProcessError:
                return ""
            if pid:
                break
            _time.sleep(0.005)
        if not pid:
            return " (it closed its channel)"
        self.pid = None
        if _os.WIFSIGNALED(status):
            return f" (killed by signal {_os.WTERMSIG(status)})"
        return f" (exit code {_os.WEXITSTATUS(status)})"

    def stop(self):
        try:
            self.sock.close()
        except OSError:
            pass
        if self.pid is not None:  # at once (a hung call must not eat the judge's time); the jail reaps it
            try:
                _os.kill(self.pid, _signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.pid = None


def _has_opaque(j):
    if type(j) is dict:
        return "o" in j or any(_has_opaque(v) for v in j.values())
    if type(j) is list:
        return any(_has_opaque(v) for v in j)
    return False


def _judge(req, proxy):
    ns = {"__name__": "__check__"}
    for what, src, name in (("prompt", req["prompt"], "<prompt>"), ("test", req["test"], "<check>")):
        if what == "test":
            ns[req["entry_point"]] = proxy  # some checks call the function by its name: the candidate too
        try:
            exec(compile(src, name, "exec"), ns)
        except BaseException as e:  # noqa: BLE001 - the reference's own failure
            return {"reference_error": f"{what} code failed: {_describe(e)}"}
    check = ns.get("check")
    if not callable(check):
        return {"reference_error": "test code defines no check(candidate)"}
    try:
        load_error = proxy.load(req["code"], req["entry_point"])
    except CandidateFailed as e:
        return {"passed": False, "kind": e.kind, "reason": f"candidate failed to load: {e.detail}", "calls": 0}
    if load_error:
        return {"passed": False, "kind": "load", "reason": f"candidate failed to load: {load_error}", "calls": 0}
    error = None
    try:
        check(proxy)
    except BaseException as e:  # noqa: BLE001 - the verdict on this run
        error = e
    out = {"passed": False, "calls": proxy.calls}
    if proxy.broken:
        return {"reference_error": proxy.broken}
    if proxy.failure is not None:
        error = proxy.failure
    elif Opaque.refused and error is None:  # a check that caught the refusal still fails
        error = OpaqueValueUsed("the candidate returned a non-plain object")
    if error is None:
        return {**out, "passed": True, "kind": "", "reason": ""}
    if isinstance(error, CandidateFailed):
        return {**out, "kind": error.kind, "reason": error.detail}
    kind = ("assertion" if isinstance(error, AssertionError) else "opaque" if isinstance(error, OpaqueValueUsed)
            else "check_error")
    return {**out, "kind": kind, "reason": _describe(error)[:300]}


def _main():
    verdict_fd = _os.dup(1)  # the verdict channel: only this process ever holds it
    sock, child_sock = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_STREAM)
    pid = _os.fork()
    if pid == 0:
        sock.close()
        _become_candidate(child_sock, verdict_fd)
    child_sock.close()
    _signal.signal(_signal.SIGINT, _signal.SIG_DFL)  # a signal ends the judge; it never raises inside check
    req = _json.loads(_sys.stdin.buffer.read())
    _os.dup2(_os.open("/dev/null", _os.O_RDONLY), 0)
    _os.dup2(2, 1)  # check's own prints go to stderr
    _sys.stdout = _sys.stderr
    _os.chdir("/")  # read-only: nothing the candidate writes to /tmp is in the judge's way
    proxy = _Proxy(sock, pid, _time.monotonic() + req["budget_s"], req["max_calls"])
    try:
        out = _judge(req, proxy)
    finally:
        proxy.stop()
    data = (_json.dumps(out) + "\n").encode()
    while data:
        data = data[_os.write(verdict_fd, data):]


_main()
