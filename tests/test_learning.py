"""GRPO really learns: held-out accuracy on arithmetic problems never trained on rises clearly.

Runs the demo's own job spec through the trainer (no service), single-threaded so the run is
bit-for-bit reproducible on a given machine. Held-out: 400 problems from the fixed eval split,
disjoint from every train prompt; greedy decoding; the math verifier decides.
"""
from __future__ import annotations

import json

import pytest

from service.demo import DEMO_SPEC
from trainer.config import JobSpec
from trainer.data import arithmetic_split
from trainer.loop import train

pytestmark = [pytest.mark.slow, pytest.mark.numerics]


def test_eval_split_is_disjoint_from_training():
    train_set, held = arithmetic_split(400)
    assert len(held) == 400
    assert not {s["prompt"] for s in train_set} & {s["prompt"] for s in held}


def test_grpo_raises_held_out_accuracy(tmp_path, models_dir):
    spec = JobSpec.model_validate(DEMO_SPEC)
    spec.train.threads = 1
    result = train(spec, tmp_path / "run", models_dir=models_dir, log=lambda m: None)
    evals = {}
    for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if "eval/accuracy" in rec:
            evals[rec["step"]] = rec["eval/accuracy"]
    steps = spec.train.steps
    assert sorted(evals) == [0, 50, 100, 150]
    before = evals[0]
    late = (evals[100] + evals[steps]) / 2  # two evals of 400 problems each: 800 greedy answers
    print(f"held-out accuracy: {evals}")
    assert 0.03 <= before <= 0.25, f"warm-up should leave accuracy low but non-zero, got {before}"
    assert late >= before + 0.06, evals
    assert evals[steps] >= before + 0.06, evals
    assert result.accuracy_before == before and result.accuracy_after == evals[steps]
