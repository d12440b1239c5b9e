"""The dashboard in a real headless browser (Debian chromium) for a job that is running right now."""
from __future__ import annotations

import re
import shutil
import subprocess
import threading

import httpx
import pytest

from tests.conftest import free_port, spawn, stop, wait_for

pytestmark = pytest.mark.slow
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(CHROMIUM is None, reason="Debian chromium is not installed (make test installs it as root)")
def test_dashboard_charts_render_points_for_a_running_job(tmp_path, models_dir):
    from service.jobs.runner import execute_job
    from service.settings import Settings
    from service.store.jobs import Store

    port = free_port()
    home = tmp_path / "home"
    env = {"RLVR_HOME": str(home), "RLVR_MODELS": str(models_dir)}
    api = spawn(["service.cli", "serve", "--port", str(port)], env, tmp_path / "api.log")
    http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10)
    worker = None
    try:
        wait_for(lambda: _healthy(http), 60, "the API")
        spec = {"name": "browser", "rollout": {"group_size": 4, "max_new_tokens": 12}, "data": {"eval_size": 10},
                "train": {"steps": 500, "prompts_per_step": 2, "eval_every": 2, "checkpoint_every": 3, "threads": 1}}
        job_id = http.post("/v1/jobs", json=spec).json()["id"]
        settings = Settings(home=home, models=models_dir)
        worker = threading.Thread(target=execute_job, args=(job_id, settings, Store(settings.db_url)), daemon=True)
        worker.start()  # this thread plays the worker; the page is served by the real API process
        wait_for(lambda: http.get(f"/v1/jobs/{job_id}").json()["progress"]["step"] >= 4, 120, "4 steps")
        session_id = _a_training_session(Store(settings.db_url))
        dom = subprocess.run(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-quic", "--no-first-run", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'chrome'}", "--virtual-time-budget=10000", "--dump-dom",
             f"http://127.0.0.1:{port}/dashboard?job={job_id}&session={session_id}&eval=0"],
            capture_output=True, text=True, timeout=90).stdout
        points = dict(re.findall(r'data-key="([^"]+)" data-points="(\d+)"', dom))
        assert int(points["reward/mean"]) >= 3, points
        assert int(points["eval/accuracy"]) >= 2, points
        assert int(points["time/step_s"]) >= 3, points
        assert dom.count('class="pt"') >= 8  # the SVG really drew the points
        assert re.search(rf'data-id="{job_id}".*?class="status running"', dom, re.S)
        assert "step-0000003" in dom  # checkpoints panel
        assert re.search(r'class="v-(correct|wrong|unparseable)"', dom)  # a rollout with its verdict
        # held-out evals: each stored eval a row, and the first against the latest, problem by problem
        evals = http.get(f"/v1/jobs/{job_id}/evals").json()
        assert len(re.findall(r'data-eval-step="\d+"', dom)) >= 2 and len(evals) >= 2, evals
        n = re.search(r'id="ev-summary" data-n="(\d+)" data-gained="(\d+)" data-lost="(\d+)"', dom)
        assert n and int(n.group(1)) == 10, dom[-3000:]
        flips = re.findall(r'class="flip" data-direction="(gained|lost)"', dom)  # each flipped problem listed
        assert (flips.count("gained"), flips.count("lost")) == (int(n.group(2)), int(n.group(3))), flips
        page = dom.split("<script>")[0]  # what was rendered, not the page's own code
        assert re.search(r'<table id="ev-table" data-step="0">', page) and page.count('<tr class="ev-rec">') == 10, \
            page[page.find('id="ev-records"'):][:600]  # ?eval=0: that eval's problems
        # the training sessions panel: the session, its model's steps and last loss, and its loss curve
        assert re.search(rf'class="job sess sel" data-id="{session_id}".*?<td>3</td><td>0.500</td>', dom, re.S)
        assert 'data-key="loss" data-points="3"' in dom
    finally:
        try:
            http.post(f"/v1/jobs/{job_id}/cancel")
        except Exception:
            pass
        if worker is not None:
            worker.join(timeout=60)
        http.close()
        stop(api)


def _healthy(http) -> bool:
    try:
        return http.get("/healthz").status_code == 200
    except httpx.HTTPError:
        return False


def _a_training_session(store) -> str:
    """A Tinker-compatible session with one model and three optimiser steps, as its worker records them."""
    from service.store.tables import TinkerMetric, TinkerModel
    from service.tinker.sessions import Sessions

    ss = Sessions(store)
    sid = ss.create("default", "0.38.0", "browser", {})
    ss.add_model(sid, "model-browser", "default", "builtin:tiny-arith", 0, {})
    with store.Session.begin() as s:
        for step, loss in ((1, 2.0), (2, 1.0), (3, 0.5)):
            s.add(TinkerMetric(model_id="model-browser", step=step, data={"loss": loss}))
        s.get(TinkerModel, "model-browser").steps = 3
    return sid


@pytest.mark.skipif(CHROMIUM is None, reason="Debian chromium is not installed (make test installs it as root)")
def test_the_rollout_browser_shows_an_episode_turn_by_turn(tmp_path, models_dir, monkeypatch):
    """An episode's stored rollout (a real scripted-tool training step's, trainer/episodes.py): tool output
    tokens marked apart from the model's, and each call's outcome and time."""
    from service.settings import Settings
    from service.store.jobs import Store
    from tests import scripted_tools
    from trainer import engines
    from trainer.config import JobSpec
    from trainer.loop import train

    monkeypatch.setitem(engines.ENGINES, "hf", scripted_tools.ScriptedToolEngine)
    spec = JobSpec.model_validate({"data": {"eval_size": 2}, "rollout": {"group_size": 4, "max_new_tokens": 48},
                                   "episodes": {"max_episode_tokens": 200, "eval_tools_off": False},
                                   "train": {"steps": 1, "prompts_per_step": 2, "eval_every": 0, "threads": 1}})
    groups = []
    train(spec, tmp_path / "run", models_dir=models_dir, on_rollouts=lambda step, g: groups.extend(g),
          log=lambda m: None)
    assert any(c["tool_calls"] for g in groups for c in g["completions"])
    port = free_port()
    home = tmp_path / "home"
    api = spawn(["service.cli", "serve", "--port", str(port)], {"RLVR_HOME": str(home), "RLVR_MODELS": str(models_dir)},
                tmp_path / "api.log")
    http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10)
    try:
        wait_for(lambda: _healthy(http), 60, "the API")
        job_id = http.post("/v1/jobs", json=spec.model_dump(mode="json")).json()["id"]
        Store(Settings(home=home, models=models_dir).db_url).put_rollouts(job_id, 1, groups)
        dom = subprocess.run(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-quic", "--no-first-run", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'chrome'}", "--virtual-time-budget=10000", "--dump-dom",
             f"http://127.0.0.1:{port}/dashboard?job={job_id}&step=1"],
            capture_output=True, text=True, timeout=90).stdout
        dom = re.sub(r"<script.*?</script>", "", dom, flags=re.S)  # what the page rendered, not its source
        observed = sum(c["trained"].count(0) for g in groups[:2] for c in g["completions"])
        assert observed > 0 and dom.count('<span class="tok obs"') == observed
        assert re.search(r'class="turn o-ok" data-outcome="ok">call 1: ok · 0\.\d+ s', dom)
        assert re.search(r"\d turns · \d tool calls · ended by answer", dom)
    finally:
        http.close()
        stop(api)
