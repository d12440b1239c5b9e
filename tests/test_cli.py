"""`rlvr train` runs a job in-process from a YAML spec: metrics.jsonl and an HF checkpoint appear."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from tests.conftest import REPO
from trainer.config import JobSpec


@pytest.mark.parametrize("example", sorted((REPO / "examples" / "jobs").glob("*.yaml")), ids=lambda p: p.stem)
def test_example_job_specs_are_valid(example):
    JobSpec.model_validate(yaml.safe_load(example.read_text()))


def test_rlvr_train_runs_locally(tmp_path, models_dir):
    env = {**os.environ, "RLVR_HOME": str(tmp_path / "home"), "RLVR_MODELS": str(models_dir)}
    spec = yaml.safe_load((REPO / "examples" / "jobs" / "demo-math.yaml").read_text())
    spec["data"]["eval_size"] = 20
    spec["train"].update({"threads": 1, "checkpoint_every": 2})
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(spec))
    out = subprocess.run([sys.executable, "-m", "service.cli", "train", str(tmp_path / "job.yaml"), "--steps", "2",
                          "--run-dir", str(tmp_path / "run")], env=env, cwd=REPO, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["status"] == "succeeded" and result["step"] == 2
    steps = [json.loads(line)["step"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1, 2]
    ckpt = tmp_path / "run" / "checkpoints" / "step-0000002"
    assert (ckpt / "model.safetensors").is_file() and (ckpt / "tokenizer.json").is_file()


def test_rlvr_train_rejects_a_bad_spec(tmp_path):
    (tmp_path / "bad.yaml").write_text("rollout: {group_size: 1}\n")
    out = subprocess.run([sys.executable, "-m", "service.cli", "train", str(tmp_path / "bad.yaml")], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "group_size" in out.stderr


def test_rlvr_doctor_reports_this_host_as_json(tmp_path):
    import torch

    env = {**os.environ, "RLVR_HOME": str(tmp_path / "home"), "RLVR_BROKER_URL": "redis://127.0.0.1:1/0",
           "RLVR_DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite'}"}
    out = subprocess.run([sys.executable, "-m", "service.cli", "doctor", "--json"], env=env, cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert r["device"] == ("cuda:0" if torch.cuda.is_available() else "cpu")
    assert r["engine"] in ("hf", "vllm")
    assert set(r["sandbox"]) >= {"ok", "reason"} and isinstance(r["sandbox"]["ok"], bool)
    assert r["sandbox"]["ok"] or r["sandbox"]["reason"]  # never "broken" without saying why
    assert r["database"]["ok"] is True
    # nothing listens on port 1: the broker is reported unreachable, with the reason, not a crash
    assert r["broker"]["ok"] is False and r["broker"]["reason"]


def test_rlvr_doctor_exits_nonzero_when_something_is_missing(tmp_path):
    env = {**os.environ, "RLVR_HOME": str(tmp_path / "home"), "RLVR_BROKER_URL": "redis://127.0.0.1:1/0"}
    out = subprocess.run([sys.executable, "-m", "service.cli", "doctor"], env=env, cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "broker" in out.stdout and "unavailable" in out.stdout


def test_recipes_are_the_example_files_and_load_by_name():
    """`rlvr demo`, the learning tests and the benches read examples/jobs/ (written once): the package's
    recipes folder is that folder, and every recipe is a valid job."""
    from service.cli.recipes import DEMO, REAL, RECIPES, recipe

    assert RECIPES.resolve() == (REPO / "examples" / "jobs").resolve()
    for name in [*DEMO.values(), *REAL.values()]:
        spec = recipe(name)
        assert spec == yaml.safe_load((REPO / "examples" / "jobs" / f"{name}.yaml").read_text())
        JobSpec.model_validate(spec)
    spec = recipe("demo-math")
    spec["train"]["steps"] = 1
    assert recipe("demo-math")["train"]["steps"] == 150  # callers get their own copy
    with pytest.raises(ValueError, match="unknown recipe 'nope'; known: .*demo-math"):
        recipe("nope")
