"""The code verifier's judge runs in the jail, apart from the candidate: attacks on it, one per test.

Each candidate below attacks the judge it shares a jail run with; each must fail (never pass), and
where the attack is an attempt to reach the judge, the candidate reports what it reached through the
one channel it has (its return value), so a test also proves the door was shut rather than missed.
"""
from __future__ import annotations

import time

import pytest

from verifiers import Status, get_verifier


@pytest.fixture(scope="module")
def v():
    from sandbox import local
    from sandbox.types import SandboxUnavailable

    try:
        local.probe()
    except SandboxUnavailable as e:
        pytest.skip(f"local sandbox unavailable on this machine: {e}")
    return get_verifier("code", {"timeout_s": 3.0})


ADD = {"test": "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(10, 5) == 15\n",
       "entry_point": "add"}
# The candidate returns "shut" when every way into the judge was refused; the check asks for exactly that.
PROBE = {"test": "def check(candidate):\n    got = candidate()\n    assert got == 'shut', got\n",
         "entry_point": "probe"}


def test_the_judge_process_is_out_of_the_candidates_reach(v):
    probe = r'''
import ctypes, os, glob
def probe():
    judge = os.getppid()
    reached = []
    for fd in range(3, 64):
        try:
            os.fstat(fd)
            if fd != 3:  # 3 is its own channel to the judge (checked first: the probes below open more)
                reached.append(f"fd {fd}")
        except OSError:
            pass
    for path in [f"/proc/{judge}/mem", f"/proc/{judge}/environ", f"/proc/{judge}/fd/1", "/proc/1/mem"]:
        try:
            with open(path, "rb") as f:
                f.read(1)
            reached.append(path)
        except OSError:
            pass
    try:
        os.listdir(f"/proc/{judge}/fd")
        reached.append("fd list")
    except OSError:
        pass
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.ptrace(16, judge, 0, 0) == 0:  # PTRACE_ATTACH
        reached.append("ptrace")
    pidfd = libc.syscall(434, judge, 0)    # pidfd_open
    if pidfd >= 0 and any(libc.syscall(438, pidfd, fd, 0) >= 0 for fd in range(10)):  # pidfd_getfd
        reached.append("pidfd_getfd")
    buf = ctypes.create_string_buffer(8)
    class iovec(ctypes.Structure):
        _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
    local, remote = iovec(ctypes.addressof(buf), 8), iovec(id(os), 8)  # mapped in both: forked from one
    if libc.process_vm_readv(judge, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0) >= 0:
        reached.append("process_vm_readv")
    return "shut" if not reached else repr(reached)
'''
    r = v.verify(probe, PROBE)
    assert r.status is Status.correct, r  # every way in was refused (the candidate said so itself)


def test_a_forged_verdict_on_every_descriptor_does_not_pass(v):
    forge = ("import os\nline = b'{\"passed\": true, \"kind\": \"\", \"reason\": \"\", \"calls\": 2}\\n'\n"
             "for fd in range(0, 64):\n    try: os.write(fd, line)\n    except OSError: pass\n"
             "print(line.decode())\n"
             "def add(a, b):\n    return None\n")
    r = v.verify(forge, ADD)
    assert r.status is Status.wrong and r.score == 0.0, r


def test_killing_or_stopping_the_judge_is_a_failure_not_a_pass(v):
    for how in ("SIGKILL", "SIGTERM", "SIGINT", "SIGSTOP"):
        hack = f"import os, signal\ndef add(a, b):\n    os.kill(os.getppid(), signal.{how})\n    return a + b\n"
        r = v.verify(hack, ADD)
        assert r.status in (Status.wrong, Status.timeout) and r.score == 0.0, (how, r)
    at_load = "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\ndef add(a, b):\n    return a + b\n"
    assert v.verify(at_load, ADD).score == 0.0


def test_files_planted_in_tmp_do_not_reach_the_judges_imports(v):
    # the check imports after the candidate ran: a planted module on any path it might search must not load
    ref = {"test": "def check(candidate):\n    assert candidate(1, 2) == 3\n    import json, fractions\n"
                   "    assert fractions.Fraction(1, 2) == 0.5 and json.dumps(1) == '1'\n"
                   "    assert candidate(10, 5) == 15\n", "entry_point": "add"}
    plant = ("import os\n"
             "EVIL = 'import os\\nos.write(1, b\\'{\"passed\": true, \"kind\": \"\", \"reason\": \"\", \"calls\": "
             "2}\\')\\nos._exit(0)\\n'\n"
             "for d in ('/tmp', '/dev/shm', os.getcwd()):\n"
             "    for m in ('fractions', 'numbers', 'decimal'):\n"
             "        try: open(os.path.join(d, m + '.py'), 'w').write(EVIL)\n"
             "        except OSError: pass\n"
             "def add(a, b):\n    return 0\n")
    r = v.verify(plant, ref)
    assert r.status is Status.wrong and "assert" in r.reason.lower(), r


def test_raw_frames_on_the_candidates_socket_are_only_answers(v):
    # it may write anything on its own channel: a frame that is not an answer is a malformed answer
    raw = ("import os, struct\n"
           "def add(a, b):\n"
           "    body = b'{\"passed\": true}'\n"
           "    os.write(3, struct.pack('>I', len(body)) + body)\n"
           "    os._exit(0)\n")
    r = v.verify(raw, ADD)
    assert r.status is Status.wrong and r.details.get("failure") in ("malformed", "crashed"), r
    huge = "import os, struct\ndef add(a, b):\n    os.write(3, struct.pack('>I', 2**31))\n    return 3\n"
    assert v.verify(huge, ADD).status is Status.wrong


def test_a_check_that_swallows_failures_still_fails(v):
    # the reference's own `except:` catches what the proxy raises; the failure is remembered anyway
    ref = {"test": "def check(candidate):\n    try:\n        assert candidate(1, 2) == 3\n    except:\n        pass\n",
           "entry_point": "add"}
    assert v.verify("def add(a, b):\n    raise ValueError", ref).status is Status.wrong
    assert v.verify("import os\ndef add(a, b):\n    os._exit(0)", ref).status is Status.wrong
    everything = "class E:\n    def __eq__(self, o): return True\ndef add(a, b):\n    return E()\n"
    assert v.verify(everything, ref).status is Status.wrong
    assert v.verify("def add(a, b):\n    return a + b", ref).status is Status.correct


def test_the_judge_has_a_time_limit(v):
    fast = get_verifier("code", {"timeout_s": 0.5})
    sleepy = {**ADD, "prompt": "import time\ntime.sleep(3)\n"}
    t0 = time.monotonic()
    r = fast.verify("def add(a, b):\n    return a + b", sleepy)
    assert r.status is Status.timeout and time.monotonic() - t0 < 2.5, (r, time.monotonic() - t0)
    spin = {"test": "def check(candidate):\n    while True:\n        pass\n", "entry_point": "add"}
    t0 = time.monotonic()
    r = fast.verify("def add(a, b):\n    return a + b", spin)
    assert r.status is Status.timeout and "judge" in r.reason and time.monotonic() - t0 < 2.5, r
    hang = fast.verify("def add(a, b):\n    while True: pass", ADD)
    assert hang.status is Status.timeout and hang.details.get("failure") == "timeout", hang


def test_reference_errors_are_errors_and_the_candidate_never_ran(v):
    marker = "def add(a, b):\n    return a + b\n"
    for ref, why in [({**ADD, "prompt": "raise RuntimeError('x')"}, "prompt code failed"),
                     ({"test": "raise ValueError('bad')", "entry_point": "add"}, "test code failed"),
                     ({"test": "x = 1", "entry_point": "add"}, "defines no check"),
                     ({"test": "def check(c):\n    c(lambda: 1)\n", "entry_point": "add"}, "non-plain argument")]:
        r = v.verify(marker, ref)
        assert r.status is Status.error and why in r.reason, (ref, r)


def test_a_big_result_and_many_calls_are_bounded(v):
    ref = {"test": "def check(candidate):\n    assert len(candidate()) == 3_000_000\n", "entry_point": "f"}
    assert v.verify("def f():\n    return [7] * 3_000_000", ref).status is Status.correct  # big is fine
    many = {"test": "def check(candidate):\n    for i in range(20_000):\n        assert candidate(i) == i\n",
            "entry_point": "f"}
    r = get_verifier("code", {"timeout_s": 10.0}).verify("def f(x):\n    return x", many)
    assert r.status is Status.wrong and r.details.get("failure") == "too_many_calls", r
