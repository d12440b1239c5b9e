"""Offline DPO on fixed (chosen, rejected) pairs: the policy learns to prefer the chosen answers.

Pairs are built from the arithmetic TRAIN split: chosen = the right answer in the model's format,
rejected = a wrong one. After a few dozen updates the implicit reward margin on fresh pairs of the
stream must be positive and the loss below log 2 (its value for a policy equal to the reference).
"""
from __future__ import annotations

import json
import math

import pytest

from trainer.config import JobSpec
from trainer.data import DatasetError, arithmetic_split
from trainer.loop import train
from trainer.preference import load_pairs

pytestmark = pytest.mark.slow


def _pairs_file(path, n=400):
    train_set, _ = arithmetic_split(200)
    with path.open("w") as f:
        for s in train_set[:n]:
            right = int(s["reference"])
            f.write(json.dumps({"prompt": s["prompt"], "chosen": f"\\boxed{{{right}}}",
                                "rejected": f"\\boxed{{{right + 1 + right % 3}}}"}) + "\n")
    return path


def test_offline_dpo_learns_the_preference(tmp_path, models_dir):
    pairs = _pairs_file(tmp_path / "pairs.jsonl")
    spec = JobSpec.model_validate({
        "algorithm": "dpo", "dpo": {"pairs": str(pairs), "beta": 0.1},
        "data": {"eval_size": 50}, "rollout": {"max_new_tokens": 12},
        "optim": {"lr": 2e-4}, "train": {"steps": 40, "prompts_per_step": 16, "eval_every": 0, "threads": 1},
    })
    result = train(spec, tmp_path / "run", models_dir=models_dir, log=lambda m: None)
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["step"] > 0]
    assert result.status == "succeeded" and len(steps) == 40
    assert steps[0]["loss"] == pytest.approx(math.log(2), abs=1e-3)  # policy == reference at step 1
    late = steps[-10:]
    assert sum(r["pairs/margin"] for r in late) / 10 > 0.1
    assert sum(r["loss"] for r in late) / 10 < math.log(2) - 0.05
    assert steps[-1]["data_position"] == 40 * 16  # every pair once, in stream order


def test_pairs_file_errors_name_the_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "1+1", "chosen": "2"}\n')
    with pytest.raises(DatasetError, match="bad.jsonl:1"):
        load_pairs(bad)
