"""PPO and online DPO really learn too: held-out accuracy on arithmetic never trained on rises.

Same task, model, budget and measurement as tests/test_learning.py (the demo's GRPO recipe: 16
prompts × G=16 per step, lr 5e-5, 12 new tokens, 150 steps, single-threaded so a run is bit-for-bit
reproducible on a given machine); only `algorithm` changes. Held-out: 400 problems from the fixed
eval split, greedy decoding, the math verifier decides — nothing the algorithm can game.
"""
from __future__ import annotations

import json

import pytest

from service.demo import DEMO_SPEC
from trainer.config import JobSpec
from trainer.loop import train

pytestmark = [pytest.mark.slow, pytest.mark.numerics]


def _evals(run) -> dict[int, float]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["eval/accuracy"] for r in rows if "eval/accuracy" in r}


@pytest.mark.parametrize("algorithm", ["ppo", "ppo-critic", "dpo"])
def test_algorithm_raises_held_out_accuracy(tmp_path, models_dir, algorithm):
    extra = {"algorithm": "ppo", "ppo": {"critic": "builtin:tiny-arith"}} if algorithm == "ppo-critic" else {}
    spec = JobSpec.model_validate({**DEMO_SPEC, "algorithm": algorithm, "name": f"learn-{algorithm}", **extra})
    spec.train.threads = 1
    assert spec.dpo is None or spec.dpo.pairs == "online"  # DPO here is online: best vs worst of a group
    result = train(spec, tmp_path / "run", models_dir=models_dir, log=lambda m: None)
    evals = _evals(tmp_path / "run")
    print(f"{algorithm} held-out accuracy: {evals}")
    assert sorted(evals) == [0, 50, 100, 150]
    before, last = evals[0], evals[150]
    late = (evals[100] + last) / 2  # two evals of 400 problems each: 800 greedy answers
    assert 0.03 <= before <= 0.25, before
    assert late >= before + 0.05, evals
    assert last >= before + 0.05, evals
    assert result.accuracy_after == last
