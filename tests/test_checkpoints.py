"""Checkpoints at scale: pruning to the newest N (keeping the final and the best-eval one), downloads
that stream instead of building the archive in memory, and resuming on another GPU layout."""
from __future__ import annotations

import json

import pytest

from trainer import checkpoint


def _fake(root, step: int, acc):
    d = root / f"step-{step:07d}"
    d.mkdir(parents=True)
    (d / checkpoint.STATE_FILE).write_bytes(b"x")
    checkpoint.record(root, d.name, acc)


def test_prune_keeps_the_newest_the_final_and_the_best(tmp_path):
    for step, acc in [(1, 0.1), (2, 0.5), (3, None), (4, 0.2), (5, None)]:
        _fake(tmp_path, step, acc)
    gone = checkpoint.prune(tmp_path, keep_last=2)
    assert gone == ["step-0000001", "step-0000003"]
    left = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("step-"))
    assert left == ["step-0000002", "step-0000004", "step-0000005"]  # best eval (0.5) + newest two
    assert json.loads((tmp_path / checkpoint.INDEX).read_text()) == {"step-0000002": 0.5, "step-0000004": 0.2,
                                                                       "step-0000005": None}


@pytest.mark.slow
def test_a_job_with_keep_last_prunes_as_it_goes(tmp_path, models_dir):
    from trainer.config import JobSpec
    from trainer.loop import train

    spec = JobSpec.model_validate({"data": {"eval_size": 8}, "rollout": {"group_size": 4, "max_new_tokens": 8},
                                   "train": {"steps": 5, "prompts_per_step": 4, "eval_every": 2,
                                             "checkpoint_every": 1, "keep_last": 1, "threads": 1}})
    pruned = []
    train(spec, tmp_path / "run", models_dir=models_dir, log=lambda m: None,
          on_step=lambda s, m: pruned.extend(m.get("checkpoints_pruned", [])))
    left = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir() if p.name.startswith("step-"))
    assert "step-0000005" in left and len(left) <= 2  # the final one, and the best eval if it is another
    assert sorted(pruned + left) == [f"step-{i:07d}" for i in range(1, 6)]  # each pruned one was reported
    index = json.loads((tmp_path / "run" / "checkpoints" / checkpoint.INDEX).read_text())
    assert set(index) == set(left)


def test_a_resume_loads_onto_the_cpu_and_restores_the_gpus_this_host_has(tmp_path, monkeypatch):
    """Defect 7: trainer_state.pt was loaded without map_location (a state saved on cuda:0 lands on
    cuda:0 in every rank, and cannot load where there is no GPU), and the saved CUDA RNG states were
    restored one per saved GPU: a job saved by a worker seeing 8 GPUs failed to resume on one seeing 1
    ("invalid device ordinal"). Mocked here: 8 saved states, 1 GPU visible."""
    import random

    import torch

    ckpt = tmp_path / "step-0000001"
    ckpt.mkdir()
    saved = [torch.full((16,), i, dtype=torch.uint8) for i in range(8)]
    torch.save({"rng_by_rank": [{"torch": torch.get_rng_state(), "python": random.getstate(), "cuda": saved}],
                "step": 1}, ckpt / checkpoint.STATE_FILE)
    restored: dict[int, torch.Tensor] = {}

    def set_rng_state(state, device="cuda"):
        index = device if isinstance(device, int) else (torch.device(device).index or 0)
        if index >= 1:
            raise RuntimeError("CUDA error: invalid device ordinal")
        restored[index] = state

    loaded_to = []
    real_load = torch.load
    monkeypatch.setattr(torch, "load", lambda *a, **kw: loaded_to.append(kw.get("map_location")) or real_load(*a, **kw))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_rng_state", set_rng_state)
    monkeypatch.setattr(torch.cuda.random, "set_rng_state", set_rng_state)  # what set_rng_state_all calls
    assert checkpoint.load_state(ckpt)["step"] == 1
    assert loaded_to == ["cpu"]
    assert list(restored) == [0] and torch.equal(restored[0], saved[0])
