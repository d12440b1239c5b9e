"""What a program must not reach: other processes, the network, host files and environment, other runs."""
from __future__ import annotations

import os
import socket
import threading
import uuid

import pytest

from sandbox import Limits, Status
from sandbox.local import LocalBackend


def test_tree_kill_setsid_daemons_and_double_forks(run, wait_gone):
    marker = f"rlvr-daemon-{uuid.uuid4().hex}"
    sleeper = f"import time; time.sleep(120)  # {marker}"
    prog = (
        "import os\n"
        "if os.fork() == 0:\n"                 # double fork + setsid: a classic daemon
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        f"        os.execv('/usr/bin/python3.11', ['python3.11', '-c', {sleeper!r}])\n"
        "    os._exit(0)\n"
        "if os.fork() == 0:\n"                 # a plain background child too
        f"    os.execv('/usr/bin/python3.11', ['python3.11', '-c', {sleeper!r}])\n"
        "import time; time.sleep(0.5)\n"
        "print('parent done')\n"
    )
    r = run(prog)
    assert r.status is Status.ok and r.stdout == b"parent done\n", r
    assert wait_gone(marker) == []


def test_tree_kill_when_the_run_times_out(run, wait_gone):
    marker = f"rlvr-daemon-{uuid.uuid4().hex}"
    sleeper = f"import time; time.sleep(120)  # {marker}"
    prog = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        f"    os.execv('/usr/bin/python3.11', ['python3.11', '-c', {sleeper!r}])\n"
        "time.sleep(60)\n"
    )
    assert run(prog, wall_s=1.0).status is Status.timeout
    assert wait_gone(marker) == []


def test_no_network_not_even_host_loopback(run):
    # A real listener on the host's loopback (as Redis is on 127.0.0.1:6379 in this project).
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    srv.settimeout(0.1)
    port = srv.getsockname()[1]
    accepted: list = []
    stop = threading.Event()
    t = threading.Thread(target=lambda: accepted.append(_try_accept(srv, stop)), daemon=True)
    t.start()
    prog = (
        "import socket\n"
        f"for host, port in [('127.0.0.1', {port}), ('127.0.0.1', 6379), ('10.0.2.2', 80), ('::1', {port})]:\n"
        "    try:\n"
        "        socket.create_connection((host, port), timeout=1).close(); print('CONNECTED', port)\n"
        "    except OSError as e:\n"
        "        print('refused', e.errno)\n"
    )
    r = run(prog)
    stop.set()
    t.join(5)
    srv.close()
    assert b"CONNECTED" not in r.stdout, r
    assert r.stdout.count(b"refused") == 4
    assert accepted == [None]


def _try_accept(srv: socket.socket, stop: threading.Event):
    while not stop.is_set():
        try:
            conn, _ = srv.accept()
            conn.close()
            return "accepted"
        except OSError:
            continue
    return None


def test_no_host_secrets_or_caller_environment():
    canary = f"rlvr-canary-{uuid.uuid4().hex}"
    os.environ["RLVR_TEST_SECRET"] = canary  # what the caller's environment holds when the jail starts
    secret_file = f"/tmp/rlvr-secret-{uuid.uuid4().hex}"
    with open(secret_file, "w") as f:
        f.write(canary)
    be = LocalBackend(workers=1)  # fresh jails, started after the canary went into our environment
    try:
        prog = (
            "import os, glob\n"
            "seen = []\n"
            f"for p in ['/proc/1/environ', '/proc/self/environ', {secret_file!r}, '/etc/shadow',\n"
            "          '/usr/local/etc/npmrc', '/usr/etc/npmrc',\n"
            "          '/root/.bashrc', '/work/main/pyproject.toml', '/proc/1/mem']:\n"
            "    try:\n"
            "        seen.append(open(p, 'rb').read(100000))\n"
            "    except OSError as e:\n"
            "        print(p, 'denied', e.errno)\n"
            "for p in glob.glob('/proc/*/environ'):\n"
            "    try: seen.append(open(p, 'rb').read())\n"
            "    except OSError: pass\n"
            "print(repr(dict(os.environ)))\n"
            "print(b''.join(seen).decode('latin-1'))\n"
        )
        r = be.run(prog.encode(), b"", Limits())
        assert r.status is Status.ok, r
        assert canary.encode() not in r.stdout + r.stderr
        assert b"/proc/1/environ denied" in r.stdout  # PID 1 is the worker and is not dumpable
        assert f"{secret_file} denied".encode() in r.stdout
        assert b"/usr/local/etc/npmrc denied 2" in r.stdout  # machine-local config is not even there
    finally:
        be.close()
        os.environ.pop("RLVR_TEST_SECRET", None)
        os.unlink(secret_file)


def test_no_files_from_other_runs():
    be = LocalBackend(workers=1)  # one jail: both runs go through the same warm worker
    try:
        a = be.run(b"open('/tmp/left-behind', 'w').write('run A secret')\nimport os\n"
                   b"open('/dev/shm/sem.x', 'w').write('run A')\n"
                   b"os.makedirs('/tmp/d/e'); os.chmod('/tmp/d', 0)\nprint(os.listdir('/tmp'))", b"", Limits())
        assert a.status is Status.ok and b"left-behind" in a.stdout, a
        b = be.run(b"import os\nprint(sorted(os.listdir('/tmp')), os.listdir('.'), os.listdir('/dev/shm'))",
                   b"", Limits())
        assert b.status is Status.ok and b.stdout == b"[] [] []\n", b
    finally:
        be.close()


def test_no_write_outside_scratch(run):
    prog = (
        "import os\n"
        "for p in ['/usr/evil', '/evil', '/dev/evil', '/proc/evil', '/sys/evil', '/usr/lib/python3.11/os.py']:\n"
        "    try:\n"
        "        open(p, 'a').write('x'); print('WROTE', p)\n"
        "    except OSError as e:\n"
        "        print('refused', p)\n"
        "open('/tmp/fine', 'w').write('ok'); print('tmp ok')\n"
    )
    r = run(prog)
    assert b"WROTE" not in r.stdout, r
    assert r.stdout.count(b"refused") == 6 and b"tmp ok" in r.stdout
    assert not os.path.exists("/evil") and not os.path.exists("/usr/evil")


def test_kernel_surface_denied(run):
    prog = (
        "import ctypes, os, errno\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "def rc(v): return 'ok' if v == 0 else errno.errorcode[ctypes.get_errno()]\n"
        "print('ptrace', rc(libc.ptrace(16, 1, 0, 0)))\n"           # PTRACE_ATTACH to PID 1
        "print('unshare', rc(libc.unshare(0x10000000)))\n"          # CLONE_NEWUSER
        "c = ctypes.c_char(b'x')\n"
        "print('tiocsti', rc(libc.ioctl(0, 0x5412, ctypes.byref(c))))\n"
        "print('sysv', rc(0 if libc.shmget(1234, 4096, 0o1666) >= 0 else -1))\n"      # IPC that would outlive the run
        "print('uid', os.getuid(), os.getgid())\n"
    )
    r = run(prog)
    assert r.status is Status.ok, r
    for what in (b"ptrace", b"unshare", b"tiocsti", b"sysv"):
        assert what + b" EPERM" in r.stdout, (what, r.stdout)
    assert b"uid 65534 65534" in r.stdout


def test_missing_feature_is_a_clear_error_not_a_pass(monkeypatch):
    from sandbox import local
    from sandbox.types import SandboxUnavailable

    monkeypatch.setattr(local, "PYTHON", "/nonexistent/python3.11")
    with pytest.raises(SandboxUnavailable, match="/nonexistent/python3.11 not found"):
        LocalBackend()
