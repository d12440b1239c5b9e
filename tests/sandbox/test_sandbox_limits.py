"""Each resource limit is enforced from outside the program, and the host is fine afterwards."""
from __future__ import annotations

import time

from sandbox import Status


def test_ok_and_stdin_roundtrip(run):
    r = run("import sys\nprint(sys.stdin.read()[::-1])", stdin="abc")
    assert r.status is Status.ok and r.exit_code == 0
    assert r.stdout == b"cba\n"
    assert r.peak_mem > 0 and r.wall_s > 0


def test_runtime_error_and_exit_codes(run):
    r = run("raise ValueError('boom')")
    assert r.status is Status.runtime_error and r.exit_code == 1
    assert b"ValueError: boom" in r.stderr
    assert run("import sys; sys.exit(3)").exit_code == 3
    assert run("import os; os.kill(os.getpid(), 11)").signal == 11


def test_wall_clock(run):
    t0 = time.monotonic()
    r = run("import time\nwhile True: time.sleep(0.05)", wall_s=1.0)
    assert r.status is Status.timeout
    assert time.monotonic() - t0 < 4.0
    assert run("print('after')").stdout == b"after\n"


def test_cpu_time(run):
    # The wall limit is generous: the CPU limit (RLIMIT_CPU, enforced by the kernel) must end it first.
    r = run("while True: pass", wall_s=20.0, cpu_s=1.0)
    assert r.status is Status.timeout
    assert "CPU time limit" in r.reason and r.wall_s < 20.0, r


def test_memory(run):
    r = run("x = bytearray(1 << 30)\nx[::4096] = b'1' * len(x[::4096])\nprint('survived')", memory_mb=64)
    assert r.status is Status.memory_limit, r
    assert b"survived" not in r.stdout
    assert run("print(len(bytearray(32 << 20)))", memory_mb=128).stdout == b"33554432\n"


def test_tmpfs_files_count_against_memory(run):
    prog = "f = open('/tmp/big', 'wb')\nfor _ in range(200): f.write(b'x' * (1 << 20))\nf.close()\nprint('ok')"
    r = run(prog, memory_mb=64, max_file_bytes=1 << 30)
    assert r.status in (Status.memory_limit, Status.runtime_error), r
    assert b"ok" not in r.stdout


def test_processes_fork_bomb(run, backend):
    prog = (
        "import os, time\n"
        "n = 0\n"
        "for _ in range(200):\n"
        "    try:\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(30); os._exit(0)\n"
        "        n += 1\n"
        "    except OSError:\n"
        "        break\n"
        "print(n)\n"
    )
    r = run(prog, max_processes=16)
    assert r.status is Status.ok, r
    assert 0 < int(r.stdout) < 16  # the pids cgroup refused the rest; the sleepers were killed at the end
    bomb = run("import os\nwhile True:\n    try: os.fork()\n    except OSError: pass", wall_s=2.0, max_processes=32)
    assert bomb.status in (Status.timeout, Status.runtime_error)
    assert run("print(1)").status is Status.ok


def test_output_size(run):
    r = run("import sys\nwhile True: sys.stdout.write('x' * 65536)", max_output_bytes=100_000)
    assert r.status is Status.output_limit and r.truncated
    assert len(r.stdout) + len(r.stderr) <= 100_001


def test_file_size(run):
    prog = ("try:\n    open('/tmp/f', 'wb').write(b'x' * (4 << 20))\n"
            "except OSError as e:\n    print('refused', e.errno)\n")
    r = run(prog, max_file_bytes=1 << 20)
    assert r.stdout == b"refused 27\n", r  # EFBIG


def test_open_files(run):
    prog = ("fs = []\ntry:\n    for _ in range(1000): fs.append(open('/dev/null'))\n"
            "except OSError as e:\n    print(len(fs), e.errno)\n")
    r = run(prog, max_open_files=32)
    n, err = r.stdout.split()
    assert int(n) < 32 and int(err) == 24, r  # EMFILE


def test_large_stdin_and_stdout_roundtrip(run):
    data = "x" * (5 << 20)
    r = run("import sys\nd = sys.stdin.read()\nprint(len(d))\nsys.stdout.write('y' * 700_000)", stdin=data)
    assert r.status is Status.ok, r
    assert r.stdout.startswith(b"5242880\n") and r.stdout.count(b"y") == 700_000 and not r.truncated
