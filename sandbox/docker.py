"""Backend ``docker``: one throwaway container per program, for deployments that have a Docker engine.

Isolation comes from the engine: ``--network none --read-only --user 65534:65534 --cap-drop ALL
--security-opt no-new-privileges --pids-limit --memory/--memory-swap`` plus ulimits for CPU, file size and
open files, a size-capped tmpfs /tmp and the program mounted read-only. The wall clock is enforced here by
``docker kill``. There is no warm pool (a container start costs ~0.5 s), so use it where isolation per
container matters more than throughput. Programs run with the image's ``python3 -I``.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

from .types import Limits, Result, SandboxUnavailable, Status, sandbox_error

DEFAULT_IMAGE = "python:3.11-slim"


def docker_command(name: str, program_dir: str, limits: Limits, image: str = DEFAULT_IMAGE,
                   docker: str = "docker") -> list[str]:
    """The ``docker run`` argv for one program (``program_dir`` holds ``main.py``)."""
    mem = f"{limits.memory_mb}m"
    cpu = max(1, int(-(-limits.cpu // 1)))
    return [
        docker, "run", "--rm", "-i", "--name", name,
        "--network", "none", "--read-only", "--user", "65534:65534", "--cap-drop", "ALL",
        "--security-opt", "no-new-privileges", "--ipc", "none",
        "--pids-limit", str(limits.max_processes),
        "--memory", mem, "--memory-swap", mem, "--cpus", "1",
        "--ulimit", f"cpu={cpu}:{cpu + 1}", "--ulimit", f"fsize={limits.max_file_bytes}",
        "--ulimit", f"nofile={limits.max_open_files}:{limits.max_open_files}", "--ulimit", "core=0",
        "--tmpfs", "/tmp:rw,nosuid,nodev,size=64m", "--workdir", "/tmp",
        "-v", f"{program_dir}:/sandbox:ro",
        image, "python3", "-I", "/sandbox/main.py",
    ]


class DockerBackend:
    name = "docker"

    def __init__(self, image: str = DEFAULT_IMAGE, workers: int | None = None, docker: str = "docker") -> None:
        self.image, self.docker = image, shutil.which(docker) or docker
        self.size = workers or os.cpu_count() or 1
        self.check()

    def check(self) -> None:
        if not shutil.which(self.docker):
            raise SandboxUnavailable("docker backend: no docker CLI on PATH")
        try:
            p = subprocess.run([self.docker, "info", "--format", "{{.ServerVersion}}"], capture_output=True,
                               timeout=10)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise SandboxUnavailable(f"docker backend: docker info failed: {e}") from e
        if p.returncode != 0:
            msg = (p.stderr or p.stdout).decode(errors="replace").strip().splitlines()
            raise SandboxUnavailable(f"docker backend: no Docker engine reachable ({msg[-1] if msg else '?'})")

    def run(self, program: bytes, stdin: bytes, limits: Limits) -> Result:
        name = f"rlvr-sbx-{uuid.uuid4().hex[:12]}"
        with tempfile.TemporaryDirectory(prefix="rlvr-docker-") as d:
            os.chmod(d, 0o755)
            with open(os.path.join(d, "main.py"), "wb") as f:
                f.write(program)
            os.chmod(os.path.join(d, "main.py"), 0o644)
            cmd = docker_command(name, d, limits, self.image, self.docker)
            t0 = time.monotonic()
            try:
                p = subprocess.run(cmd, input=stdin, capture_output=True, timeout=limits.wall_s + 1.0)
            except subprocess.TimeoutExpired:
                self._kill(name)
                return Result(Status.timeout, wall_s=time.monotonic() - t0, reason=f"wall clock {limits.wall_s}s")
            except OSError as e:
                return sandbox_error(f"docker run failed: {e}")
        return interpret(p.returncode, p.stdout, p.stderr, limits, time.monotonic() - t0)

    def _kill(self, name: str) -> None:
        subprocess.run([self.docker, "rm", "-f", name], capture_output=True, timeout=30)

    def run_many(self, jobs: Sequence[tuple[bytes, bytes, Limits]]) -> list[Result]:
        with ThreadPoolExecutor(self.size) as ex:
            return list(ex.map(lambda j: self.run(*j), jobs))

    def close(self) -> None:
        pass


def interpret(code: int, out: bytes, err: bytes, limits: Limits, wall: float) -> Result:
    """Map ``docker run``'s exit code to a Result (125-127: docker itself failed; 128+n: signal n)."""
    truncated = len(out) + len(err) > limits.max_output_bytes
    if truncated:
        out = out[: limits.max_output_bytes]
        err = err[: max(0, limits.max_output_bytes - len(out))]
    common = dict(stdout=out, stderr=err, truncated=truncated, wall_s=wall)
    if code in (125, 126, 127):
        return Result(Status.sandbox_error, exit_code=code, reason="docker could not run the container", **common)
    if truncated:
        return Result(Status.output_limit, exit_code=code, reason="output limit", **common)
    if code == 137:  # SIGKILL: the memory cgroup (or the hard CPU ulimit) killed it
        return Result(Status.memory_limit, signal=9, reason="killed (OOM or limit)", **common)
    if code == 152:  # SIGXCPU
        return Result(Status.timeout, signal=24, reason=f"CPU time limit {limits.cpu}s", **common)
    if code > 128:
        return Result(Status.runtime_error, signal=code - 128, reason=f"signal {code - 128}", **common)
    return Result(Status.ok if code == 0 else Status.runtime_error, exit_code=code,
                  reason="" if code == 0 else f"exit code {code}", **common)
