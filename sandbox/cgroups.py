"""Per-jail control groups: v1 ``memory`` (+memsw) and ``pids`` for limits, v1 ``cpu`` to keep the host
responsive, and a v2 group whose ``cgroup.kill`` ends the whole tree (setsid daemons and double forks
included).

Groups are made under this process's own group of each hierarchy (read from /proc/self/cgroup), never at
the root, because the machine may already account this session in a parent group. Only root can make
them; the jailed processes cannot see or write /sys/fs/cgroup.
"""
from __future__ import annotations

import itertools
import os
import time
from pathlib import Path

from .types import SandboxUnavailable

ROOT = Path("/sys/fs/cgroup")
_counter = itertools.count()


def _own_paths() -> dict[str, str]:
    """controller name ("memory", "pids", "cpu", "" for v2) -> this process's group path."""
    out: dict[str, str] = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, ctrls, path = line.split(":", 2)
        for c in ctrls.split(",") if ctrls else [""]:
            out[c] = path
    return out


def _v2_root() -> Path | None:
    for cand in (ROOT / "unified", ROOT):
        if (cand / "cgroup.procs").exists() and (cand / "cgroup.controllers").exists():
            return cand
    return None


def probe() -> None:
    """Raise :class:`SandboxUnavailable` saying which feature is missing; return quietly if all are there."""
    if os.geteuid() != 0:
        raise SandboxUnavailable("cgroups: the local backend must run as root to create control groups")
    own = _own_paths()
    for ctrl in ("memory", "pids"):
        d = ROOT / ctrl
        if ctrl not in own or not (d / "cgroup.procs").exists():
            raise SandboxUnavailable(f"cgroups: v1 '{ctrl}' controller is not mounted at {d}")
    test = CgroupSet("probe")  # raises SandboxUnavailable if we may not create groups
    try:
        if not (test.v2 / "cgroup.kill").exists():
            raise SandboxUnavailable("cgroups: this kernel has no cgroup.kill (Linux >= 5.14 needed)")
        if not (test.memory / "memory.limit_in_bytes").exists():
            raise SandboxUnavailable("cgroups: the v1 memory controller has no memory.limit_in_bytes")
    finally:
        test.remove()


def remove_stale() -> int:
    """Kill and remove the groups of host processes that died without closing their jails (SIGKILLed
    trainers, crashed workers). Returns how many groups went."""
    own = _own_paths()
    v2 = _v2_root()
    parents = [p for p in (v2 / own.get("", "/").lstrip("/") if v2 else None,
                           ROOT / "memory" / own.get("memory", "/").lstrip("/"),
                           ROOT / "pids" / own.get("pids", "/").lstrip("/"),
                           ROOT / "cpu" / own.get("cpu", "/").lstrip("/")) if p is not None and p.is_dir()]
    gone = 0
    for parent in parents:  # v2 first: its cgroup.kill empties the group everywhere
        for d in parent.glob("rlvr-sbx-*"):
            try:
                pid = int(d.name.split("-")[2])
                os.kill(pid, 0)
                continue  # its owner is alive
            except ProcessLookupError:
                pass
            except (ValueError, IndexError, PermissionError):
                continue
            if (d / "cgroup.kill").exists():
                try:
                    _write(d / "cgroup.kill", "1")
                except OSError:
                    pass
            for _ in range(50):
                try:
                    d.rmdir()
                    gone += 1
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.01)
    return gone


class CgroupSet:
    """One jail's groups. ``join_self()`` (called in the child between fork and exec) moves a process in."""

    def __init__(self, tag: str, cpu_shares: int = 1024) -> None:
        own = _own_paths()
        name = f"rlvr-sbx-{os.getpid()}-{next(_counter)}-{tag}"
        self.memory = ROOT / "memory" / own["memory"].lstrip("/") / name
        self.pids = ROOT / "pids" / own["pids"].lstrip("/") / name
        cpu = own.get("cpu")
        self.cpu = ROOT / "cpu" / cpu.lstrip("/") / name if cpu is not None and (ROOT / "cpu").is_dir() else None
        v2 = _v2_root()
        if v2 is None:
            raise SandboxUnavailable("cgroups: no cgroup v2 hierarchy (needed for cgroup.kill)")
        self.v2 = v2 / own.get("", "/").lstrip("/") / name
        self._made: list[Path] = []
        try:
            for d in (self.memory, self.pids, self.cpu, self.v2):
                if d is not None:
                    d.mkdir()
                    self._made.append(d)
            if self.cpu is not None and cpu_shares != 1024:
                # A lower weight than a normal group (1024) favours the host's own work under load.
                _write(self.cpu / "cpu.shares", str(cpu_shares))
        except OSError as e:
            self.remove()
            raise SandboxUnavailable(f"cgroups: cannot create {name}: {e}") from e
        self._procs_files = [str(d / "cgroup.procs") for d in self._made]
        self._pids = -1
        self._mem_limit = int(_read(self.memory / "memory.limit_in_bytes") or 0)  # "unlimited" is huge

    # -- limits ---------------------------------------------------------------------------------------
    def set_memory(self, limit_bytes: int) -> None:
        if limit_bytes == self._mem_limit:
            return
        mem, memsw = self.memory / "memory.limit_in_bytes", self.memory / "memory.memsw.limit_in_bytes"
        # memsw must stay >= the memory limit at every step, so the order depends on the direction.
        if limit_bytes > self._mem_limit:
            if memsw.exists():
                _write(memsw, str(limit_bytes))
            _write(mem, str(limit_bytes))
        else:
            _write(mem, str(limit_bytes))
            if memsw.exists():
                _write(memsw, str(limit_bytes))
        self._mem_limit = limit_bytes

    def set_pids(self, n: int) -> None:
        if n != self._pids:
            _write(self.pids / "pids.max", str(n))
            self._pids = n

    # -- readings -------------------------------------------------------------------------------------
    def oom_kills(self) -> int:
        for line in _read(self.memory / "memory.oom_control").splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
        return int(_read(self.memory / "memory.failcnt") or 0)  # older kernels: best available signal

    def tasks(self) -> int:
        return int(_read(self.pids / "pids.current") or 0)

    # -- lifecycle ------------------------------------------------------------------------------------
    def join_self(self) -> None:
        """Move the calling process into every group. Async-signal-safe enough for a preexec_fn."""
        for p in self._procs_files:
            fd = os.open(p, os.O_WRONLY)
            try:
                os.write(fd, b"0")
            finally:
                os.close(fd)

    def kill(self, timeout: float = 5.0) -> bool:
        """SIGKILL every process in the tree; True once the v2 group is empty (waits at most ``timeout``)."""
        try:
            _write(self.v2 / "cgroup.kill", "1")
        except OSError:
            return False
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if "populated 0" in _read(self.v2 / "cgroup.events"):
                return True
            time.sleep(0.002)
        return False

    def remove(self) -> None:
        for d in reversed(self._made):
            for _ in range(50):  # rmdir fails with EBUSY until the last killed task is reaped
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.01)
        self._made = []


def _write(path: Path, value: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""
