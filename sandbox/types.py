"""The sandbox's one input shape (:class:`Limits`), one result type (:class:`Result`) and its errors."""
from __future__ import annotations

import enum
from dataclasses import asdict, dataclass
from typing import Any


class Status(str, enum.Enum):
    ok = "ok"                        # exited 0 within every limit
    runtime_error = "runtime_error"  # non-zero exit or killed by a signal we did not send for a limit
    timeout = "timeout"              # wall clock or CPU time limit hit
    memory_limit = "memory_limit"    # the memory cgroup OOM-killed it
    output_limit = "output_limit"    # stdout+stderr passed max_output_bytes
    sandbox_error = "sandbox_error"  # infrastructure failure: counted and surfaced, never scored as wrong


class SandboxError(RuntimeError):
    """The sandbox itself failed (not the program)."""


class SandboxUnavailable(SandboxError):
    """A kernel feature or tool the backend needs is missing on this machine."""


@dataclass(frozen=True)
class Limits:
    wall_s: float = 10.0
    cpu_s: float | None = None            # None: same as wall_s; RLIMIT_CPU rounds up to whole seconds
    memory_mb: int = 256                  # resident memory incl. tmpfs files (cgroup v1 memory+swap)
    max_processes: int = 32               # tasks (processes+threads) the program may have at once
    max_output_bytes: int = 1 << 20       # stdout+stderr together
    max_file_bytes: int = 16 << 20        # RLIMIT_FSIZE: largest file it may write
    max_open_files: int = 64              # RLIMIT_NOFILE

    def __post_init__(self) -> None:
        if self.wall_s <= 0 or (self.cpu_s is not None and self.cpu_s <= 0):
            raise ValueError("wall_s and cpu_s must be > 0")
        for name in ("memory_mb", "max_processes", "max_output_bytes", "max_file_bytes", "max_open_files"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")

    @property
    def cpu(self) -> float:
        return self.wall_s if self.cpu_s is None else self.cpu_s

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Result:
    status: Status
    exit_code: int | None = None   # None when killed by a signal or never started
    signal: int | None = None
    stdout: bytes = b""
    stderr: bytes = b""
    truncated: bool = False        # output was cut at max_output_bytes
    wall_s: float = 0.0
    cpu_s: float = 0.0
    peak_mem: int = 0              # bytes: max RSS of the program's main process (incl. the ~10 MB
                                   # interpreter image it is forked from)
    reason: str = ""               # why, in words, when status is not ok

    @property
    def ok(self) -> bool:
        return self.status is Status.ok

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["status"] = self.status.value
        d["stdout"] = self.stdout.decode("utf-8", "replace")
        d["stderr"] = self.stderr.decode("utf-8", "replace")
        return d


@dataclass(frozen=True)
class Harness:
    """A program of the caller's own that runs many times with different stdin (a test harness), never
    untrusted text. The local backend compiles it once per process and sends the jail its code object
    instead of its text (compiling a 10 KB harness costs a jail run ~8 ms); other backends get the text."""

    source: str


def sandbox_error(reason: str, wall_s: float = 0.0) -> Result:
    return Result(status=Status.sandbox_error, reason=reason, wall_s=wall_s)
