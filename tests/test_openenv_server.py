"""Against a REAL OpenEnv server: the `openenv` package's own documented example environment (`openenv init`,
its echo template: reward min(0.1 × len(message), 1), never done), served unchanged by the package's
create_app. Needs `openenv` (0.10): importable here, or an interpreter that has it in RLVR_OPENENV_PYTHON
(its dependencies pin an older Pillow than ours, so a second venv is the usual place:
`make openenv-venv`, which `make test` runs first: .cache/openenv-venv, pinned by constraints-openenv.txt)."""
from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.test_http_env import _play
from trainer.envs import net

REPO = Path(__file__).resolve().parents[1]


def _python() -> str | None:
    if os.environ.get("RLVR_OPENENV_PYTHON"):
        return os.environ["RLVR_OPENENV_PYTHON"]
    if importlib.util.find_spec("openenv") is not None:
        return sys.executable
    venv = REPO / ".cache" / "openenv-venv" / "bin" / "python"
    return str(venv) if venv.exists() else None


PY = _python()
pytestmark = pytest.mark.skipif(PY is None, reason="openenv is not installed (see this file's docstring)")


@pytest.fixture(scope="module")
def openenv_server(tmp_path_factory):
    where = tmp_path_factory.mktemp("openenv")
    subprocess.run([PY, "-m", "openenv.cli", "init", "echo_env"], cwd=where, check=True, capture_output=True,
                   timeout=120)
    proc, url = _serve(where / "echo_env", "server.app:app")
    yield url
    proc.terminate()
    proc.wait(10)


@pytest.fixture(autouse=True)
def allow_loopback(monkeypatch, tmp_path):
    monkeypatch.setenv(net.ALLOW_ENV, "127.0.0.0/8")
    monkeypatch.setenv("RLVR_ENV_SLOTS_DIR", str(tmp_path / "slots"))


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(REPO / ".cache" / "models" / "tiny-arith")


def test_an_openenv_server_plugs_in_unchanged(tok, openenv_server):
    eps, env, _ = _play(tok, openenv_server, prompts=("say 42",), n=1)
    e, = eps
    assert not e.excluded and not env.errors
    assert [t["kind"] for t in e.turns] == ["model", "observation", "model"]  # never done: the model ended it
    assert e.turns[1]["text"].count("42") >= 1  # the echo, as the model reads it
    assert e.reward == pytest.approx(0.2)       # the template's reward: 0.1 per character of "42"


def test_its_schema_describes_the_chat_tool(tok, openenv_server):
    from trainer.config import EpisodesConfig
    from trainer.envs.http import HttpEnvironment

    env = HttpEnvironment(EpisodesConfig(env={"type": "http", "url": openenv_server}, format="chat").env, "chat")
    params = env.schema["function"]["parameters"]
    assert "message" in params["properties"] and not env.errors


def test_a_session_past_its_capacity_is_an_infra_error(tok, openenv_server):
    """The template allows one session (max_concurrent_envs=1): of two episodes at once, one is refused."""
    eps, env, _ = _play(tok, openenv_server, prompts=("say 42",), n=2)
    assert sorted(e.excluded for e in eps) == [False, True]
    assert any("CAPACITY_REACHED" in x for x in env.errors)
    assert next(e for e in eps if not e.excluded).reward == pytest.approx(0.2)


def _serve(where: Path, app: str) -> tuple[subprocess.Popen, str]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    proc = subprocess.Popen([PY, "-m", "uvicorn", app, "--host", "127.0.0.1", "--port", str(port)], cwd=where,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 60
    while True:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"the server did not start: {proc.stderr.read().decode()[-2000:]}")
        time.sleep(0.2)


def test_the_readme_environment_runs_as_written(tok, tmp_path):
    """The ~20-line server in README.md ("An environment in twenty lines"), copied out verbatim and served:
    an answer of 42 wins (reward 1, done at once), 7 does not."""
    import re

    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("## An environment in twenty lines"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    (tmp_path / "echo_env.py").write_text(code)
    proc, url = _serve(tmp_path, "echo_env:app")
    try:
        eps, env, _ = _play(tok, url, prompts=("say 42", "say 7"), n=1, action_field="message", reward="env")
    finally:
        proc.terminate()
        proc.wait(10)
    won, lost = eps
    assert not env.errors and not any(e.excluded for e in eps)
    assert won.reward == 1.0 and [t["kind"] for t in won.turns] == ["model"]
    assert lost.reward == 0.0 and "observation" in [t["kind"] for t in lost.turns]
