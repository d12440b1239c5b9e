"""The sandbox on hosts unlike ours: another interpreter, other cgroup layouts, no cgroups at all.

Interpreters run live (this host's own Python lives outside /usr/bin, under a 0700 /root, so it is staged;
Debian's /usr/bin/python3.11 is bound in place). Cgroup layouts are fake mount trees in a temp dir: the
detection must pick the right files for each, and a host without usable cgroups must say why, once.
"""
from __future__ import annotations

import errno
import os
import stat
import sys
from pathlib import Path

import pytest

import sandbox
from sandbox import Limits, Status, cgroups, interpreter, local
from sandbox.types import SandboxUnavailable

PROBE = ("import sys, os, json, decimal, sqlite3, hashlib\n"
         "print(sys.executable)\n"
         "try:\n    import pip\n    print('pip importable')\nexcept ImportError:\n    print('no pip')\n"
         "print(sorted(os.listdir('/')))\n")


def _backend_with(monkeypatch, python: str):
    monkeypatch.setattr(local, "PYTHON", python)
    return local.LocalBackend(workers=1)


@pytest.mark.parametrize("python", [sys.executable, "/usr/bin/python3.11"])
def test_jail_runs_on_the_configured_interpreter(backend, monkeypatch, python):
    if not os.path.exists(python):
        pytest.skip(f"{python} is not on this host")
    exe = os.path.realpath(python)
    be = _backend_with(monkeypatch, python)
    try:
        r = be.run(PROBE.encode(), b"", Limits(wall_s=10))
    finally:
        be.close()
    assert r.status is Status.ok, r
    lines = r.stdout.decode().splitlines()
    assert lines[0] == exe  # the interpreter asked for, at its own path
    assert lines[1] == "no pip"  # its site-packages is not in the jail: stdlib only
    assert set(eval(lines[2])) <= {"bin", "dev", "lib", "lib64", "proc", "tmp", "usr", *exe.split("/")[1:2]}


def test_interpreter_outside_usr_bin_sees_only_its_own_files(backend, monkeypatch):
    exe = os.path.realpath(sys.executable)
    if exe.startswith("/usr/bin/"):
        pytest.skip("this host's Python is Debian's: no second prefix to check")
    py = interpreter.resolve(sys.executable, tuple(f"/usr/{p}" for p in local.USR_PARTS))
    assert any(dest == exe for _, dest in py.binds)
    prefix = Path(exe).parent.parent
    siblings = [str(p) for p in prefix.iterdir() if p.name not in ("lib", "bin")] + [str(prefix / "bin")]
    prog = (f"import os\nfor p in {siblings!r}:\n    print(p, sorted(os.listdir(p)) if os.path.isdir(p) "
            f"else 'absent')\n")
    be = _backend_with(monkeypatch, sys.executable)
    try:
        r = be.run(prog.encode(), b"", Limits(wall_s=10))
    finally:
        be.close()
    assert r.status is Status.ok, r
    for line in r.stdout.decode().splitlines():  # include/, share/, bin/'s other tools: not there
        path, _, seen = line.partition(" ")
        assert seen in ("absent", f"[{Path(exe).name!r}]"), line


def test_an_unreachable_interpreter_is_staged_safely(tmp_path, monkeypatch):
    exe = os.path.realpath(sys.executable)
    if interpreter.reachable_by_others(exe):
        pytest.skip("this host's Python is world-reachable: nothing to stage")
    with pytest.raises(SandboxUnavailable, match="not walkable by other users"):  # pytest's tmp is 0700
        monkeypatch.setenv(interpreter.STAGE_ENV, str(tmp_path / "stage"))
        interpreter.resolve.cache_clear()
        interpreter.resolve(exe, ())
    import shutil
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="rlvr-stage-"))
    base.chmod(0o755)
    monkeypatch.setenv(interpreter.STAGE_ENV, str(base / "stage"))
    interpreter.resolve.cache_clear()
    try:
        py = interpreter.resolve(exe, ())
        assert py.staged and Path(py.staged).parent == base / "stage"
        for src, dest in py.binds:
            assert src.startswith(py.staged) and interpreter.reachable_by_others(src), src
        assert not any(Path(py.staged).rglob("site-packages"))
        st = os.stat(py.staged)
        assert st.st_uid == os.geteuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        os.chmod(py.staged, 0o777)  # a stage someone else could write to is refused, not used
        interpreter.resolve.cache_clear()
        with pytest.raises(SandboxUnavailable, match="writable by others"):
            interpreter.resolve(exe, ())
    finally:
        interpreter.resolve.cache_clear()
        shutil.rmtree(base, ignore_errors=True)


def test_a_missing_interpreter_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(local, "PYTHON", "/nonexistent/python3.11")
    with pytest.raises(SandboxUnavailable, match="/nonexistent/python3.11 not found"):
        local.probe()


# ------------------------------------------------------------------------------ cgroup layouts
def _fake(root: Path, proc: dict[str, str], v1: tuple[str, ...] = (), v2: str | None = None,
          controllers: str = "", subtree: str = "") -> Path:
    """A fake /sys/fs/cgroup at ``root`` and a /proc/self/cgroup beside it; returns that file."""
    lines = []
    for i, c in enumerate(v1, 1):
        d = root / c / proc.get(c, "/").lstrip("/")
        d.mkdir(parents=True, exist_ok=True)
        (root / c / "cgroup.procs").write_text("")
        lines.append(f"{i}:{c}:{proc.get(c, '/')}")
    if v2 is not None:
        mount = root / v2 if v2 else root
        own = mount / proc.get("", "/").lstrip("/")
        own.mkdir(parents=True, exist_ok=True)
        for f, text in (("cgroup.procs", ""), ("cgroup.controllers", controllers)):
            (mount / f).write_text(text)
            (own / f).write_text(text)
        (own / "cgroup.subtree_control").write_text(subtree)
        lines.append(f"0::{proc.get('', '/')}")
    f = root.parent / "proc-self-cgroup"
    f.write_text("\n".join(lines) + "\n")
    return f


@pytest.fixture
def writes(monkeypatch):
    """Record cgroup control-file writes (a fake tree has no kernel behind it)."""
    seen: dict[str, str] = {}

    def fake_write(path: Path, value: str) -> None:
        if path.name == "cgroup.subtree_control":
            raise OSError(errno.EBUSY, "Device or resource busy")  # a group with processes cannot delegate
        seen[str(path)] = value

    monkeypatch.setattr(cgroups, "_write", fake_write)
    return seen


def test_hybrid_layout_limits_in_v1_and_kills_through_v2(tmp_path, writes):
    root = tmp_path / "cg"
    proc = _fake(root, {"memory": "/svc", "pids": "/svc", "cpu": "/", "": "/svc"},
                 v1=("memory", "pids", "cpu"), v2="unified", controllers="")
    lay = cgroups.detect(root, proc)
    assert lay.mode == "hybrid" and lay.v1["memory"] == root / "memory" / "svc"
    cg = cgroups.CgroupSet("t", cpu_shares=512, layout=lay)
    assert cg.memory.parent == root / "memory" / "svc" and cg.v2.parent == root / "unified" / "svc"
    cg.set_memory(64 << 20)
    cg.set_pids(32)
    assert writes[str(cg.memory / "memory.limit_in_bytes")] == str(64 << 20)
    assert writes[str(cg.pids / "pids.max")] == "32"
    assert writes[str(cg.cpu / "cpu.shares")] == "512"
    (cg.v2 / "cgroup.kill").write_text("")  # the kernel makes this file in every v2 group
    cg.kill(timeout=0.05)
    assert writes[str(cg.v2 / "cgroup.kill")] == "1"


def test_v2_only_layout_with_delegated_controllers(tmp_path, writes):
    root = tmp_path / "cg"
    proc = _fake(root, {"": "/system.slice/rlvr.service"}, v2="", controllers="cpu memory pids",
                 subtree="cpu memory pids")
    lay = cgroups.detect(root, proc)
    assert lay.mode == "v2" and lay.v1 == {} and {"memory", "pids"} <= lay.v2_controllers
    cg = cgroups.CgroupSet("t", cpu_shares=512, layout=lay)
    assert cg.memory is None and cg.v2.parent == root / "system.slice" / "rlvr.service"
    (cg.v2 / "memory.swap.max").write_text("max")
    cg.set_memory(64 << 20)
    cg.set_pids(32)
    assert writes[str(cg.v2 / "memory.max")] == str(64 << 20)
    assert writes[str(cg.v2 / "memory.swap.max")] == "0"  # no swap to escape the limit through
    assert writes[str(cg.v2 / "pids.max")] == "32"
    assert writes[str(cg.v2 / "cpu.weight")] == "50"
    (cg.v2 / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    (cg.v2 / "pids.current").write_text("2\n")
    assert cg.oom_kills() == 1 and cg.tasks() == 2


def test_v2_only_without_delegation_says_why(tmp_path, writes):
    root = tmp_path / "cg"
    proc = _fake(root, {"": "/user.slice"}, v2="", controllers="cpu memory pids", subtree="")
    with pytest.raises(SandboxUnavailable, match=r"v2 only.*memory\+pids.*could not be enabled.*Delegate"):
        cgroups.detect(root, proc)
    proc = _fake(tmp_path / "cg2", {"": "/"}, v2="", controllers="cpu", subtree="")
    with pytest.raises(SandboxUnavailable, match="not available to this group"):
        cgroups.detect(tmp_path / "cg2", proc)


def test_v1_only_layout_kills_through_the_freezer(tmp_path, writes):
    root = tmp_path / "cg"
    proc = _fake(root, {"memory": "/", "pids": "/", "freezer": "/"}, v1=("memory", "pids", "freezer"))
    lay = cgroups.detect(root, proc)
    assert lay.mode == "v1" and lay.v2 is None
    cg = cgroups.CgroupSet("t", layout=lay)
    assert cg.freezer is not None and cg.v2 is None
    (cg.freezer / "cgroup.procs").write_text("")  # empty: nothing left to kill
    assert cg.kill(timeout=0.5)
    assert writes[str(cg.freezer / "freezer.state")] == "THAWED"  # frozen, emptied, thawed


def test_no_cgroups_is_reported_once_with_the_reason(tmp_path, monkeypatch):
    root = tmp_path / "cg"
    root.mkdir()
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text("")
    with pytest.raises(SandboxUnavailable, match="neither v1 memory\\+pids controllers nor a cgroup v2"):
        cgroups.detect(root, proc)
    # the backend probes once per process: every later run is a sandbox_error with the same reason
    monkeypatch.setattr(cgroups, "ROOT", root)
    monkeypatch.setattr(cgroups, "PROC_CGROUP", proc)
    monkeypatch.setattr(cgroups, "_layout", None)
    monkeypatch.setattr(sandbox, "_backends", {})
    calls = []
    real = cgroups.detect
    monkeypatch.setattr(cgroups, "detect", lambda *a: calls.append(1) or real(root, proc))
    results = [sandbox.run("print(1)") for _ in range(3)]
    assert [r.status for r in results] == [Status.sandbox_error] * 3
    assert all("neither v1 memory+pids" in r.reason for r in results)
    assert len(calls) == 1
