"""Held-out evaluation: greedy pass@1, pass@k from sampled completions, lengths, and a per-task split."""
from __future__ import annotations

import pytest

from trainer.data import arithmetic_split
from trainer.engines import HFEngine
from trainer.loop import evaluate
from trainer.scoring import Scorer
from verifiers.spec import VerifierSpec


def _specs(dicts):
    return [VerifierSpec.model_validate(d) for d in dicts]


@pytest.fixture(scope="module")
def engine(models_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = models_dir / "tiny-arith"
    return HFEngine(AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path))


def test_pass_at_k_and_lengths(engine):
    import torch

    torch.manual_seed(0)
    _, held = arithmetic_split(400)
    scorer = Scorer(_specs([{"name": "math", "config": {"allow_unevaluated": False}}]))
    greedy = evaluate(engine, scorer, held[:60], 12)
    m = evaluate(engine, scorer, held[:60], 12, n_samples=8, batch=64)
    assert m["eval/accuracy"] == greedy["eval/accuracy"]  # sampling more does not change the greedy pass
    assert set(m) >= {"eval/pass@1", "eval/pass@2", "eval/pass@4", "eval/pass@8", "eval/len_mean"}
    assert 0 < m["eval/pass@1"] <= m["eval/pass@2"] <= m["eval/pass@4"] <= m["eval/pass@8"] <= 1
    assert 3 <= m["eval/len_mean"] <= 12 and 0 <= m["eval/truncated_frac"] <= 1
    assert "eval/pass@1" not in greedy


def test_mixed_held_out_sets_are_also_reported_per_task(engine):
    _, held = arithmetic_split(400)
    mixed = [{**s, "task": "add" if "+" in s["prompt"] else "sub"} for s in held[:40]]
    m = evaluate(engine, Scorer(_specs([{"name": "math"}])), mixed, 12)
    n_add = sum(s["task"] == "add" for s in mixed)
    assert m["eval/accuracy"] == pytest.approx(
        (m["eval/add/accuracy"] * n_add + m["eval/sub/accuracy"] * (40 - n_add)) / 40)
