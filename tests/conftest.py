"""Shared fixtures. The tiny model is built once per machine into a cache every test reuses."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
MODELS = Path(os.environ.get("RLVR_TEST_MODELS", REPO / ".cache" / "models"))


# Tests that assert on the wall clock (a timeout within a bound, a lease, a revocation, a budget), race
# processes, or share a server's state (Redis, PostgreSQL): `make test` runs them one at a time, with the
# machine to themselves. Everything else runs two at a time (Makefile). A new test of that kind goes here.
SERIAL = ("tests/faults/", "tests/integration/", "tests/sandbox/", "tests/test_ray.py", "tests/test_async.py",
          "tests/test_fair_share.py", "tests/test_lifecycle.py", "tests/test_sse.py", "tests/test_observability.py",
          "tests/test_tinker_api.py", "tests/test_code_judge.py", "tests/test_keys.py", "tests/test_math_verifier.py",
          "tests/test_verifier_api.py", "tests/test_http_env.py", "tests/test_openenv_server.py",
          "tests/test_postgres.py", "tests/test_download_stream.py", "tests/test_code_verifier.py",
          "tests/test_reference_code_jailed.py", "tests/test_plugins.py", "tests/test_cli.py")
# ...except these, under a serial folder but neither timed nor sharing a server: the Tinker example is a
# fixed-step learning test (150 steps, no clock) against a server of its own (free port, own home, embedded
# broker), the same server the learning-spread bench's smoke run starts two-wide. Alone it was 2.5 of the
# serial pass's 14 minutes (Zen 4), the other core idle. The hostile-input tests (schemathesis fuzzing
# included) call an in-process app with a home of its own, and `rlvr demo --json` starts its API and worker
# on a free port and home of its own: 165 and 28 s of the serial pass's 15 minutes (Intel, AMX).
NOT_SERIAL = ("tests/integration/test_tinker_grpo_example.py", "tests/faults/test_hostile_input.py",
              "tests/integration/test_demo.py")


def pytest_collection_modifyitems(config, items):
    for item in items:
        path = Path(str(item.fspath)).relative_to(REPO).as_posix()
        if (path.startswith(SERIAL) and not path.startswith(NOT_SERIAL)) or item.get_closest_marker("redis") \
                or item.get_closest_marker("postgres"):
            item.add_marker(pytest.mark.serial)
    # Run two-wide (Makefile), the minutes-long tests go first: xdist deals the first tests out one at a time
    # (Makefile: --maxschedchunk 1), so the two workers share them. A run one test at a time keeps file order.
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(scope="session")
def models_dir() -> Path:
    from trainer.models.tiny_arith import ensure_tiny_model

    ensure_tiny_model(MODELS)
    return MODELS


@pytest.fixture(scope="session")
def tiny_model(models_dir) -> Path:
    return models_dir / "tiny-arith"


@pytest.fixture
def fake_vllm(monkeypatch):
    """tests/fake_vllm's ``vllm`` importable for one test (and its records reset), then gone again: other
    tests see whether the real vLLM is installed, as before."""
    import importlib

    def purge():
        for name in [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]:
            del sys.modules[name]

    real = {m: mod for m, mod in sys.modules.items() if m == "vllm" or m.startswith("vllm.")}
    purge()
    monkeypatch.syspath_prepend(str(REPO / "tests" / "fake_vllm"))
    importlib.invalidate_caches()
    vllm = importlib.import_module("vllm")
    assert vllm.__version__.endswith("-fake"), vllm.__file__
    vllm.reset()
    yield vllm
    purge()
    sys.modules.update(real)


@pytest.fixture
def settings(tmp_path, models_dir):
    from service.settings import Settings

    return Settings(home=tmp_path / "home", models=models_dir)


@pytest.fixture
def store(settings):
    from service.store.jobs import Store

    return Store(settings.db_url)


@pytest.fixture
def client(settings, store):
    from fastapi.testclient import TestClient

    from service.app import create_app

    with TestClient(create_app(settings, store)) as c:
        yield c


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(args: list[str], env: dict, log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", *args], env={**os.environ, **env}, cwd=REPO,
                            stdout=open(log, "wb"), stderr=subprocess.STDOUT, start_new_session=True)


def stop(proc: subprocess.Popen) -> None:
    import signal

    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=15)


def wait_for(predicate, timeout: float, what: str, interval: float = 0.25):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


@pytest.fixture
def pg_url():
    """A fresh PostgreSQL database on the local server (dropped afterwards)."""
    import uuid

    import psycopg

    name = f"rlvr_test_{uuid.uuid4().hex[:10]}"
    admin = psycopg.connect(host="127.0.0.1", port=5432, user="postgres", dbname="postgres", connect_timeout=5,
                            autocommit=True)
    with admin.cursor() as c:
        c.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    finally:
        with admin.cursor() as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


def shared_prompt_rollout(seed: int, vocab: int):
    """2 prompts (one left-padded) x 3 rows each, one completion ending early: the shared-prompt forward
    (trainer/batch.py) runs each weight twice, once for the prompts and once for the completions."""
    import torch

    from trainer.rollout import Rollout

    g = torch.Generator().manual_seed(seed)
    P, T, G = 6, 5, 3
    p_ids, p_mask = torch.randint(1, vocab, (2, P), generator=g), torch.ones(2, P, dtype=torch.long)
    p_ids[1, :2], p_mask[1, :2] = 0, 0
    c_mask = torch.ones(2 * G, T, dtype=torch.long)
    c_mask[0, 3:] = 0
    return Rollout(p_ids.repeat_interleave(G, 0), p_mask.repeat_interleave(G, 0),
                   torch.randint(1, vocab, (2 * G, T), generator=g), c_mask, [""] * (2 * G),
                   torch.zeros(2 * G, dtype=torch.bool))
