"""PPO and online DPO really learn too: held-out accuracy on arithmetic never trained on rises.

Same task, model, budget and measurement as tests/test_learning.py (the demo's GRPO recipe: 16
prompts × G=16 per step, lr 5e-5, 12 new tokens, 150 steps, single-threaded); only `algorithm`
changes — and online DPO, which learns from one pair per group, gets 300 (cheaper) steps. Held-out: 400 problems
from the fixed eval split, greedy decoding, the math verifier decides —
nothing the algorithm can game. Gains must reach the smallest measured across kernel paths and seeds.
"""
from __future__ import annotations

import pytest

from service.cli.recipes import learning_spec
from tests.learning import assert_learned, evals
from trainer.loop import train
from trainer.models import tiny_arith

pytestmark = [pytest.mark.slow, pytest.mark.numerics]


@pytest.mark.parametrize("algorithm", ["ppo", "ppo-critic", "dpo"])
def test_algorithm_raises_held_out_accuracy(tmp_path, models_dir, algorithm):
    spec = learning_spec(algorithm)
    assert spec.dpo is None or spec.dpo.pairs == "online"  # DPO here is online: best vs worst of a group
    result = train(spec, tmp_path / "run", models_dir=models_dir, log=lambda m: None)
    ev = evals(tmp_path / "run")
    assert sorted(ev) == ([0, 100, 200, 300] if algorithm == "dpo" else [0, 50, 100, 150])
    assert_learned(ev, tiny_arith.manifest()["held_out_accuracy"], algorithm)
    assert result.accuracy_after == ev[max(ev)]
