"""Shared fixtures: the local backend (skipped with the reason when this machine cannot run it)."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

import sandbox
from sandbox import Limits, Result
from sandbox.types import SandboxUnavailable


@pytest.fixture(scope="session")
def backend():
    try:
        from sandbox import local
        local.probe()
    except SandboxUnavailable as e:
        pytest.skip(f"local sandbox unavailable on this machine: {e}")
    return sandbox.get_backend("local")


@pytest.fixture
def run(backend):
    """run(program, stdin="", **limits) -> Result on the shared local backend."""

    def _run(program: str, stdin: str = "", **limits) -> Result:
        return backend.run(program.encode(), stdin.encode(), Limits(**limits))

    return _run


@pytest.fixture
def wait_gone():
    """wait_gone(marker) -> host PIDs still running with ``marker`` in their command line after ~3 s."""

    def _wait(marker: str, timeout: float = 3.0) -> list[int]:
        deadline = time.monotonic() + timeout
        while (left := host_processes_with(marker)) and time.monotonic() < deadline:
            time.sleep(0.05)
        return left

    return _wait


def host_processes_with(marker: str) -> list[int]:
    """PIDs of host processes whose command line contains ``marker`` (excluding ourselves)."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            if marker.encode() in (d / "cmdline").read_bytes():
                found.append(int(d.name))
        except OSError:
            continue
    return found
