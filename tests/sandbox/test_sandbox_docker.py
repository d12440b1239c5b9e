"""Docker backend: the command it builds and how it reads exit codes; live only where an engine exists."""
from __future__ import annotations

import pytest

import sandbox
from sandbox import Limits, Status
from sandbox.docker import DockerBackend, docker_command, interpret
from sandbox.types import SandboxUnavailable


def test_docker_command_isolation_flags():
    cmd = docker_command("c1", "/tmp/prog", Limits(memory_mb=128, max_processes=16, cpu_s=2.5,
                                                  max_file_bytes=1000, max_open_files=20))
    s = " ".join(cmd)
    for flag in ("--network none", "--read-only", "--user 65534:65534", "--cap-drop ALL",
                 "--security-opt no-new-privileges", "--pids-limit 16", "--memory 128m",
                 "--memory-swap 128m", "--ulimit cpu=3:4", "--ulimit fsize=1000", "--ulimit nofile=20:20",
                 "-v /tmp/prog:/sandbox:ro", "--name c1"):
        assert flag in s, flag
    assert cmd[-3:] == ["python3", "-I", "/sandbox/main.py"]
    assert "--privileged" not in s and "-e" not in cmd  # no caller environment is passed


def test_docker_exit_code_mapping():
    lim = Limits(max_output_bytes=10)
    assert interpret(0, b"1\n", b"", lim, 0.1).status is Status.ok
    assert interpret(1, b"", b"Traceback", lim, 0.1).status is Status.runtime_error
    assert interpret(137, b"", b"", lim, 0.1).status is Status.memory_limit
    assert interpret(152, b"", b"", lim, 0.1).status is Status.timeout
    assert interpret(125, b"", b"no such image", lim, 0.1).status is Status.sandbox_error
    big = interpret(0, b"x" * 50, b"", lim, 0.1)
    assert big.status is Status.output_limit and big.truncated and len(big.stdout) == 10


def test_docker_unavailable_is_sandbox_error_not_a_pass():
    try:
        DockerBackend()
    except SandboxUnavailable as e:
        r = sandbox.run("print(1)", backend="docker")
        assert r.status is Status.sandbox_error and "docker" in r.reason.lower()
        assert str(e)
    else:
        pytest.skip("a Docker engine is reachable: the unavailable path cannot be exercised here")


def test_docker_live():
    try:
        be = DockerBackend()
    except SandboxUnavailable as e:
        pytest.skip(f"no Docker engine on this machine: {e}")
    r = be.run(b"import socket\ntry:\n    socket.create_connection(('1.1.1.1', 53), timeout=2)\n"
               b"    print('net')\nexcept OSError:\n    print('nonet')\n", b"", Limits(wall_s=60))
    assert r.status is Status.ok and r.stdout == b"nonet\n", r
