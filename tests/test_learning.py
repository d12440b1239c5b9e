"""GRPO really learns: held-out accuracy on arithmetic problems never trained on rises clearly.

Runs the demo's own job spec through the trainer (no service), single-threaded so the run is
reproducible on a given machine, from the committed tiny model. Held-out: 400 problems from the fixed
eval split, disjoint from every train prompt; greedy decoding; the math verifier decides. The gain it must
show is the smallest measured across CPU kernel paths and seeds (tests/learning.py).
"""
from __future__ import annotations

import pytest

from service.cli.recipes import learning_spec
from tests.learning import assert_learned, evals
from trainer.data import arithmetic_split
from trainer.loop import train
from trainer.models import tiny_arith

pytestmark = [pytest.mark.slow, pytest.mark.numerics]


def test_eval_split_is_disjoint_from_training():
    train_set, held = arithmetic_split(400)
    assert len(held) == 400
    assert not {s["prompt"] for s in train_set} & {s["prompt"] for s in held}


def test_grpo_raises_held_out_accuracy(tmp_path, models_dir):
    spec = learning_spec("grpo")
    result = train(spec, tmp_path / "run", models_dir=models_dir, log=lambda m: None)
    ev = evals(tmp_path / "run")
    assert sorted(ev) == [0, 50, 100, 150]
    assert_learned(ev, tiny_arith.manifest()["held_out_accuracy"], "grpo")
    assert result.accuracy_before == ev[0] and result.accuracy_after == ev[150]
