"""Disk full while checkpointing: the job fails with a clear error, the previous checkpoint stays whole."""
from __future__ import annotations

import subprocess

import pytest


@pytest.fixture
def small_runs_dir(tmp_path):
    """The runs directory on a 16 MiB tmpfs: one tiny-model checkpoint (~10.5 MB) fits, two do not."""
    runs = tmp_path / "home" / "runs"
    runs.mkdir(parents=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(runs)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {r.stderr.strip()}")
    try:
        yield runs
    finally:
        subprocess.run(["umount", "-l", str(runs)], check=False)


def test_checkpoint_write_failure_fails_the_job_and_keeps_the_last_checkpoint(small_runs_dir, client, store, settings):
    from transformers import AutoModelForCausalLM

    from service.jobs.runner import execute_job

    spec = {"name": "full-disk", "rollout": {"group_size": 4, "max_new_tokens": 12}, "data": {"eval_size": 10},
            "train": {"steps": 6, "prompts_per_step": 2, "eval_every": 0, "checkpoint_every": 1, "threads": 1}}
    job = client.post("/v1/jobs", json=spec).json()["id"]
    assert execute_job(job, settings, store) == "failed"
    body = client.get(f"/v1/jobs/{job}").json()
    assert body["status"] == "failed" and body["error"]["code"] == "CheckpointError"
    assert "No space left on device" in body["error"]["message"]
    # (index.json: their accuracies)
    ckpts = sorted(p.name for p in (small_runs_dir / job / "checkpoints").iterdir() if p.is_dir())
    assert ckpts == ["step-0000001"], ckpts  # no half-written temp dir left where resume would look
    AutoModelForCausalLM.from_pretrained(small_runs_dir / job / "checkpoints" / "step-0000001")  # intact
    import torch

    state = torch.load(small_runs_dir / job / "checkpoints" / "step-0000001" / "trainer_state.pt", weights_only=False)
    assert state["step"] == 1
