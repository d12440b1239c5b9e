"""Per-jail control groups, on whichever cgroup layout the host has.

A jail needs three things from cgroups: a memory limit (tmpfs files and swap included) and a task limit
that the jailed program cannot raise, and a way to kill the whole tree it started (setsid daemons and
double forks included). Hosts differ in how they offer them, so :func:`detect` reads the layout once:

- ``hybrid`` (cgroup v1 controllers plus a controller-less v2 hierarchy, as on our dev VMs): limits in
  v1 ``memory`` (+memsw) and ``pids``, CPU weight in v1 ``cpu``, ``cgroup.kill`` in the v2 group;
- ``v2`` (unified only, e.g. systemd with ``Delegate=yes``, rootless containers): one v2 group per jail with
  ``memory.max``, ``memory.swap.max = 0``, ``pids.max``, ``cpu.weight`` and ``cgroup.kill``; the memory
  and pids controllers must be enabled for our group's children (``cgroup.subtree_control``) — we try to
  enable them, and say so when the host does not allow it;
- ``v1`` (legacy only): v1 ``memory`` and ``pids``; the tree is killed through the v1 ``freezer`` (freeze,
  SIGKILL every task, thaw: nothing can fork in between) or, without a freezer, by killing the group's
  tasks until it is empty (``pids.max`` bounds how many can appear meanwhile).
Anything else (no cgroups, or not root) raises :class:`SandboxUnavailable` with the reason: the backend
reports it once at start-up (``rlvr doctor``) and every run then returns ``sandbox_error`` saying why.

Groups are made under this process's own group of each hierarchy (read from /proc/self/cgroup), never at
the root, because the machine may already account this session in a parent group. The jailed processes
cannot see or write /sys/fs/cgroup. ``Layout`` takes its root and /proc file as arguments, so tests can
point it at a fake mount layout.
"""
from __future__ import annotations

import itertools
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from .types import SandboxUnavailable

ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")
V2_NEEDS = ("memory", "pids")  # controllers a v2-only host must delegate to us
_counter = itertools.count()


@dataclass
class Layout:
    """Where this process's groups are, per hierarchy."""
    mode: str                                          # "hybrid" | "v2" | "v1"
    v1: dict[str, Path] = field(default_factory=dict)  # controller -> this process's v1 group directory
    v2: Path | None = None                             # this process's v2 group directory
    v2_controllers: frozenset[str] = frozenset()       # enabled for children of v2 (subtree_control)

    def describe(self) -> str:
        parts = [f"cgroup {self.mode}"]
        if self.v1:
            parts.append("v1 " + ",".join(sorted(self.v1)))
        if self.v2 is not None:
            parts.append("v2 " + (",".join(sorted(self.v2_controllers)) or "no controllers"))
        return "; ".join(parts)

    @property
    def limits_in_v1(self) -> bool:
        return "memory" in self.v1 and "pids" in self.v1


def _own_paths(proc_cgroup: Path) -> dict[str, str]:
    """controller name ("memory", "pids", "cpu", "" for v2) -> this process's group path."""
    out: dict[str, str] = {}
    for line in proc_cgroup.read_text().splitlines():
        _, ctrls, path = line.split(":", 2)
        for c in ctrls.split(",") if ctrls else [""]:
            out[c] = path
    return out


def _v2_mount(root: Path) -> Path | None:
    for cand in (root / "unified", root):
        if (cand / "cgroup.procs").exists() and (cand / "cgroup.controllers").exists():
            return cand
    return None


def detect(root: Path = ROOT, proc_cgroup: Path = PROC_CGROUP) -> Layout:
    """This host's layout, or :class:`SandboxUnavailable` saying what is missing."""
    try:
        own = _own_paths(proc_cgroup)
    except OSError as e:
        raise SandboxUnavailable(f"cgroups: cannot read {proc_cgroup}: {e}") from None
    v1 = {}
    for ctrl in ("memory", "pids", "cpu", "freezer"):
        d = root / ctrl
        if ctrl in own and (d / "cgroup.procs").exists():
            v1[ctrl] = d / own[ctrl].lstrip("/")
    mount = _v2_mount(root)
    v2 = mount / own.get("", "/").lstrip("/") if mount is not None and "" in own else None
    enabled: frozenset[str] = frozenset()
    if v2 is not None:
        enabled = frozenset(_read(v2 / "cgroup.subtree_control").split())
    if "memory" in v1 and "pids" in v1:
        return Layout("hybrid" if v2 is not None else "v1", v1, v2, enabled)
    if v2 is None:
        raise SandboxUnavailable("cgroups: neither v1 memory+pids controllers nor a cgroup v2 hierarchy is "
                                 f"mounted under {root}: the sandbox cannot limit memory and tasks")
    missing = [c for c in V2_NEEDS if c not in enabled]
    if missing:
        available = set(_read(v2 / "cgroup.controllers").split())
        try:  # ask for them; the kernel refuses if our group has processes of its own or lacks them
            _write(v2 / "cgroup.subtree_control", " ".join(f"+{c}" for c in missing if c in available)
                   + (" +cpu" if "cpu" in available else ""))
        except OSError:
            pass
        enabled = frozenset(_read(v2 / "cgroup.subtree_control").split())
        still = [c for c in V2_NEEDS if c not in enabled]
        if still:
            why = ("not available to this group (cgroup.controllers: "
                   f"{' '.join(sorted(available)) or 'none'})" if not set(still) <= available else
                   "available but could not be enabled for child groups (a group with processes of its own "
                   "cannot delegate: run the service in a leaf of a delegated subtree, e.g. systemd Delegate=yes)")
            raise SandboxUnavailable(f"cgroups: v2 only, and the {'+'.join(still)} controller(s) are {why} "
                                     f"at {v2}")
    return Layout("v2", {}, v2, enabled)


_layout: Layout | None = None


def layout() -> Layout:
    """The host's layout, detected once per process."""
    global _layout
    if _layout is None:
        _layout = detect()
    return _layout


def probe(lay: Layout | None = None) -> Layout:
    """Raise :class:`SandboxUnavailable` saying which feature is missing; else return the layout in use."""
    if os.geteuid() != 0:
        raise SandboxUnavailable("cgroups: the local backend must run as root to create control groups")
    lay = lay or layout()
    test = CgroupSet("probe", layout=lay)  # raises SandboxUnavailable if we may not create groups
    try:
        if lay.mode == "v2" and not (test.v2 / "cgroup.kill").exists():
            raise SandboxUnavailable("cgroups: this kernel has no cgroup.kill (Linux >= 5.14 needed)")
        test.memory_usage()
    except OSError as e:
        raise SandboxUnavailable(f"cgroups: cannot read the memory usage of a new group: {e}") from None
    finally:
        test.remove()
    return lay


def _parents(lay: Layout) -> list[Path]:
    return [p for p in (lay.v2, *lay.v1.values()) if p is not None and p.is_dir()]


def remove_stale(lay: Layout | None = None) -> int:
    """Kill and remove the groups of host processes that died without closing their jails (SIGKILLed
    trainers, crashed workers). Returns how many groups went."""
    lay = lay or layout()
    gone = 0
    for parent in _parents(lay):  # v2 first: its cgroup.kill empties the group everywhere
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
            else:
                _kill_tasks(d, deadline=time.monotonic() + 2)
            gone += _rmdir(d)
    return gone


class CgroupSet:
    """One jail's groups. ``join_self()`` (called in the child between fork and exec) moves a process in."""

    def __init__(self, tag: str, cpu_shares: int = 1024, layout: Layout | None = None) -> None:
        lay = layout or globals()["layout"]()
        self.layout = lay
        name = f"rlvr-sbx-{os.getpid()}-{next(_counter)}-{tag}"
        self.v2 = lay.v2 / name if lay.v2 is not None else None
        in_v1 = lay.limits_in_v1
        self.memory = lay.v1["memory"] / name if in_v1 else None
        self.pids = lay.v1["pids"] / name if in_v1 else None
        self.cpu = lay.v1["cpu"] / name if in_v1 and "cpu" in lay.v1 else None
        # v1 without v2: the freezer makes killing the tree race-free
        self.freezer = lay.v1["freezer"] / name if in_v1 and self.v2 is None and "freezer" in lay.v1 else None
        self._made: list[Path] = []
        try:
            for d in (self.v2, self.memory, self.pids, self.cpu, self.freezer):
                if d is not None:
                    d.mkdir()
                    self._made.append(d)
            if cpu_shares != 1024:  # a lower weight than a normal group favours the host's own work under load
                if self.cpu is not None:
                    _write(self.cpu / "cpu.shares", str(cpu_shares))
                elif not in_v1 and self.v2 is not None and "cpu" in lay.v2_controllers:
                    _write(self.v2 / "cpu.weight", str(max(1, min(10_000, cpu_shares * 100 // 1024))))
        except OSError as e:
            self.remove()
            raise SandboxUnavailable(f"cgroups: cannot create {name} ({lay.describe()}): {e}") from e
        self._procs_files = [str(d / "cgroup.procs") for d in self._made]
        self._pids = -1
        self._mem_limit = -1

    # -- limits ---------------------------------------------------------------------------------------
    def set_memory(self, limit_bytes: int) -> None:
        """Memory including tmpfs pages, with no swap to escape to."""
        if limit_bytes == self._mem_limit:
            return
        if self.memory is not None:
            mem, memsw = self.memory / "memory.limit_in_bytes", self.memory / "memory.memsw.limit_in_bytes"
            # memsw must stay >= the memory limit at every step, so the order depends on the direction
            current = self._mem_limit if self._mem_limit >= 0 else int(_read(mem) or 0)
            order = [memsw, mem] if limit_bytes > current else [mem, memsw]
            for f in order:
                if f is mem or f.exists():  # memsw exists only where swap accounting is on
                    _write(f, str(limit_bytes))
        else:
            _write(self.v2 / "memory.max", str(limit_bytes))
            if (self.v2 / "memory.swap.max").exists():
                _write(self.v2 / "memory.swap.max", "0")
        self._mem_limit = limit_bytes

    def set_pids(self, n: int) -> None:
        if n != self._pids:
            _write((self.pids or self.v2) / "pids.max", str(n))
            self._pids = n

    # -- readings -------------------------------------------------------------------------------------
    def oom_kills(self) -> int:
        if self.memory is not None:
            for line in _read(self.memory / "memory.oom_control").splitlines():
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
            return int(_read(self.memory / "memory.failcnt") or 0)  # older kernels: best available signal
        for line in _read(self.v2 / "memory.events").splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
        return 0

    def tasks(self) -> int:
        return int(_read((self.pids or self.v2) / "pids.current") or 0)

    def memory_usage(self) -> int:
        if self.memory is not None:
            return int((self.memory / "memory.usage_in_bytes").read_text())
        return int((self.v2 / "memory.current").read_text())

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
        """SIGKILL every process in the tree; True once the group is empty (waits at most ``timeout``)."""
        deadline = time.monotonic() + timeout
        if self.v2 is not None and (self.v2 / "cgroup.kill").exists():
            try:
                _write(self.v2 / "cgroup.kill", "1")
            except OSError:
                return False
            while time.monotonic() < deadline:
                if "populated 0" in _read(self.v2 / "cgroup.events"):
                    return True
                time.sleep(0.002)
            return False
        group = self.freezer or self.pids or self.v2
        if group is None:
            return False
        if self.freezer is not None:
            try:
                _write(self.freezer / "freezer.state", "FROZEN")
            except OSError:
                pass
        try:
            return _kill_tasks(group, deadline)
        finally:
            if self.freezer is not None:  # killed tasks die only once thawed
                try:
                    _write(self.freezer / "freezer.state", "THAWED")
                except OSError:
                    pass

    def remove(self) -> None:
        for d in reversed(self._made):
            _rmdir(d)
        self._made = []


def _kill_tasks(group: Path, deadline: float) -> bool:
    """SIGKILL every task listed in ``group`` until it stays empty (for hierarchies without cgroup.kill)."""
    while time.monotonic() < deadline:
        pids = [int(p) for p in _read(group / "cgroup.procs").split() if p.isdigit()]
        if not pids:
            return True
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.002)
    return False


def _rmdir(d: Path) -> int:
    for _ in range(50):  # rmdir fails with EBUSY until the last killed task is reaped
        try:
            d.rmdir()
            return 1
        except FileNotFoundError:
            return 0
        except OSError:
            time.sleep(0.01)
    return 0


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
