"""The host stays responsive and clean while jails are abused; the pool and the API behave."""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import sandbox
from sandbox import Limits, Status


def _kill_groups() -> Path:
    """Where this host's jails get the group that kills them (v2, else the v1 freezer or pids group)."""
    from sandbox import cgroups

    lay = cgroups.layout()
    return lay.v2 or lay.v1.get("freezer") or lay.v1["pids"]


def _jail_groups() -> list[Path]:
    return [p for p in _kill_groups().rglob(f"rlvr-sbx-{os.getpid()}-*")]


def _procs(g: Path) -> list[str]:
    try:
        return (g / "cgroup.procs").read_text().split()
    except OSError:  # the group went away meanwhile
        return []


def test_host_responsive_under_fork_bomb_and_cpu_hogs(backend):
    bomb = b"import os\nwhile True:\n    try: os.fork()\n    except OSError: pass\n"
    hog = b"x = bytearray(8 << 20)\nwhile True: x[0] = (x[0] + 1) % 256\n"
    jobs = [(bomb, b"", Limits(wall_s=3.0)), (hog, b"", Limits(wall_s=3.0))]
    results: list = []
    t = threading.Thread(target=lambda: results.extend(backend.run_many(jobs)))
    t.start()
    time.sleep(0.5)
    worst = 0.0
    while t.is_alive():  # the host keeps answering: small units of work stay fast
        t0 = time.monotonic()
        sum(range(20000))
        Path("/proc/self/status").read_text()
        worst = max(worst, time.monotonic() - t0)
        time.sleep(0.05)
    t.join(30)
    assert [r.status for r in results] == [Status.timeout, Status.timeout], results
    assert worst < 1.0, f"host stalled for {worst:.2f}s"
    # Nothing left behind: every jail group is back to the two processes of a warm jail (bwrap, worker).
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        crowded = {g: _procs(g) for g in _jail_groups() if len(_procs(g)) > 2}
        if not crowded:
            break
        time.sleep(0.05)
    assert crowded == {}


def test_run_many_preserves_order_and_stdin(backend):
    jobs = [(f"print({i} * int(input()))".encode(), f"{i}\n".encode(), Limits()) for i in range(20)]
    out = backend.run_many(jobs)
    assert [r.stdout for r in out] == [f"{i * i}\n".encode() for i in range(20)]


def test_module_api_and_result_json(backend):
    r = sandbox.run("print('hi')", limits=Limits(wall_s=5))
    assert r.ok and r.to_dict()["stdout"] == "hi\n" and r.to_dict()["status"] == "ok"
    rs = sandbox.run_many(["print(1)", ("print(input())", "x")])
    assert [x.stdout for x in rs] == [b"1\n", b"x\n"]
    import asyncio

    async def both():
        return await asyncio.gather(sandbox.run_async("print(4)"), sandbox.run_async("print(5)"))

    assert [x.stdout for x in asyncio.run(both())] == [b"4\n", b"5\n"]


def test_cli_prints_result_json(backend, tmp_path):
    import json
    import subprocess
    import sys

    prog = tmp_path / "p.py"
    prog.write_text("import time\ntime.sleep(5)\n")
    p = subprocess.run([sys.executable, "-m", "sandbox", "run", str(prog), "--timeout", "0.5", "--memory", "64"],
                       capture_output=True, text=True, timeout=60, cwd=Path(__file__).parents[2])
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["status"] == "timeout"


def test_recycled_jails_leave_no_cgroups():
    from sandbox.local import LocalBackend

    be = LocalBackend(workers=1, recycle_after=2)
    before = set(_jail_groups())
    for _ in range(5):
        assert be.run(b"print(1)", b"", Limits()).ok
    be.close()
    assert set(_jail_groups()) - before == set()


def test_forked_process_gets_its_own_jails(backend):
    assert sandbox.run("print(0)").ok  # this process's jails exist before the fork
    pid = os.fork()
    if pid == 0:  # e.g. a Celery prefork worker: sharing the parent's jail channels would mix answers
        code = 2
        try:
            r = sandbox.run("print(2)")
            code = 0 if r.stdout == b"2\n" else 1
            sandbox.close()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert sandbox.run("print(3)").stdout == b"3\n"


def test_groups_of_dead_hosts_are_cleaned_up(backend):
    import subprocess

    from sandbox import cgroups

    dead = subprocess.Popen(["true"])
    dead.wait()
    v2 = next(_kill_groups().rglob(f"rlvr-sbx-{os.getpid()}-*")).parent
    stale = v2 / f"rlvr-sbx-{dead.pid}-0-jail"  # as left by a host process that was SIGKILLed
    stale.mkdir()
    assert cgroups.remove_stale() >= 1
    assert not stale.exists()
    assert _jail_groups(), "the live jails of this process must stay"
