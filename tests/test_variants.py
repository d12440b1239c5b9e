"""Every knob of the job spec runs end to end on the tiny model, and reports what it did.

Deterministic completions (tests/scripted_engine.py): about a third right, so some groups are
all-wrong (zero variance) and the dead-group policies have something to act on.
"""
from __future__ import annotations

import json
import math

import pytest

from tests import scripted_engine
from trainer import rollout
from trainer.config import JobSpec
from trainer.loop import train

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def scripted(monkeypatch):
    monkeypatch.setitem(rollout.ENGINES, "hf", scripted_engine.ScriptedEngine)


def _run(tmp_path, models_dir, **patch) -> list[dict]:
    spec = {"data": {"eval_size": 8}, "rollout": {"group_size": 4, "max_new_tokens": 12},
            "optim": {"lr": 1e-3}, "train": {"steps": 3, "prompts_per_step": 8, "eval_every": 0, "threads": 1}}
    for k, v in patch.items():
        spec[k] = {**spec.get(k, {}), **v} if isinstance(v, dict) else v
    train(JobSpec.model_validate(spec), tmp_path / "run", models_dir=models_dir, log=lambda m: None)
    return [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()][1:]


@pytest.mark.parametrize("patch,keys", [
    ({"algo": {"advantage": "rloo", "overlong_mask": True, "entropy_coef": 0.01}}, ["entropy", "adv/std"]),
    ({"algo": {"advantage": "grpo_no_std", "kl_coef": 0.1, "kl_estimator": "k2"}}, ["kl"]),
    ({"algorithm": "ppo", "ppo": {"kl_reward_coef": 0.05, "lam": 0.95}, "algo": {"ppo_epochs": 2}},
     ["value/loss", "clip_frac"]),
    ({"algorithm": "dpo", "dpo": {"loss": "ipo", "beta": 0.5}}, ["pairs/margin", "pairs/count"]),
    ({"train": {"precision": "bf16"}}, ["loss"]),
])
def test_variant_runs_and_reports(tmp_path, models_dir, patch, keys):
    rows = _run(tmp_path, models_dir, **patch)
    assert len(rows) == 3
    for r in rows:
        assert math.isfinite(r["loss"]) and all(k in r for k in keys), (sorted(r), keys)


def test_zero_variance_policies(tmp_path, models_dir):
    keep = _run(tmp_path / "keep", models_dir)
    assert any(r["zero_std_group_frac"] > 0 for r in keep)
    assert all(r["dead_group_token_frac"] == pytest.approx(r["zero_std_group_frac"], abs=0.15) for r in keep)
    res = _run(tmp_path / "res", models_dir, algo={"zero_variance": "resample", "resample_rounds": 2})
    assert sum(r["resampled_groups"] for r in res) > 0
    assert sum(r["zero_std_group_frac_final"] for r in res) < sum(r["zero_std_group_frac"] for r in res)
    positions = [0] + [r["data_position"] for r in res]
    assert [b - a for a, b in zip(positions, positions[1:])] == [8 + r["resampled_groups"] for r in res]
    drop = _run(tmp_path / "drop", models_dir, algo={"zero_variance": "drop"})
    # same first batch, fewer tokens in the denominator: the same signal weighs more per token
    assert keep[0]["reward/mean"] == drop[0]["reward/mean"]
    if keep[0]["zero_std_group_frac"] > 0:
        assert abs(drop[0]["loss"]) > abs(keep[0]["loss"])
