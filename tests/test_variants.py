"""Every knob of the job spec runs end to end on the tiny model, and reports what it did.

Deterministic completions (tests/scripted_engine.py): about a third right, so some groups are
all-wrong (zero variance) and the dead-group policies have something to act on.
"""
from __future__ import annotations

import json
import math

import pytest

from tests import scripted_engine
from trainer import engines
from trainer.config import JobSpec
from trainer.loop import train

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def scripted(monkeypatch):
    monkeypatch.setitem(engines.ENGINES, "hf", scripted_engine.ScriptedEngine)


def _run(tmp_path, models_dir, **patch) -> list[dict]:
    spec = {"data": {"eval_size": 8}, "rollout": {"group_size": 4, "max_new_tokens": 12},
            "optim": {"lr": 1e-3}, "train": {"steps": 3, "prompts_per_step": 8, "eval_every": 0, "threads": 1}}
    for k, v in patch.items():
        spec[k] = {**spec.get(k, {}), **v} if isinstance(v, dict) else v
    train(JobSpec.model_validate(spec), tmp_path / "run", models_dir=models_dir, log=lambda m: None)
    return [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()][1:]


@pytest.mark.parametrize("patch,keys", [
    ({"algo": {"advantage": "rloo", "overlong_mask": True, "entropy_coef": 0.01}}, ["entropy", "adv/std"]),
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
    # one health record per step covers every round: each completion scored, resampled ones included
    assert [r["verifier/math/calls"] for r in res] == [(8 + r["resampled_groups"]) * 4 for r in res]
    drop = _run(tmp_path / "drop", models_dir, algo={"zero_variance": "drop"})
    # Scripted completions depend on the prompt alone, so both runs see the same groups every step, and
    # with one pass (ratio 1) the token-mean loss is -sum(adv * len) / tokens whatever the weights: drop
    # takes the dead groups' tokens out of the denominator, so its loss is keep's / (1 - dead token frac).
    assert [r["reward/mean"] for r in drop] == [r["reward/mean"] for r in keep]
    assert any(0 < r["dead_group_token_frac"] < 1 for r in keep)
    for k, d in zip(keep, drop):
        assert d["loss"] == pytest.approx(k["loss"] / (1 - k["dead_group_token_frac"]), rel=1e-5, abs=1e-9)


@pytest.mark.parametrize("estimator,kl_in", [("k1", "reward"), ("k2", "loss"), ("k3", "loss"), ("k3", "reward")])
def test_kl_estimator_is_the_one_reported_and_penalised(tmp_path, models_dir, estimator, kl_in):
    """The reported `kl` of step 2 is exactly the chosen estimator over that step's tokens, recomputed
    here from the step-1 checkpoint (the policy that sampled step 2) and the frozen starting model; at
    step 1 the policy is the reference and the penalty is 0."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainer import algos
    from trainer.batch import forward
    from trainer.data import PromptStream
    from trainer.splits import load_splits

    spec = {"algo": {"advantage": "grpo_no_std", "kl_estimator": estimator, "kl_coef": 0.1, "kl_in": kl_in},
            "train": {"steps": 2, "checkpoint_every": 1}}
    rows = _run(tmp_path / "kl", models_dir, **spec)
    none = _run(tmp_path / "nokl", models_dir, algo={"advantage": "grpo_no_std", "kl_coef": 0.0})
    assert rows[0]["kl"] == pytest.approx(0.0, abs=1e-6) and "kl" not in none[0]
    assert rows[0]["loss"] == pytest.approx(none[0]["loss"], abs=1e-6)  # at the reference the penalty is 0
    job = JobSpec.model_validate({"data": {"eval_size": 8}, "rollout": {"group_size": 4, "max_new_tokens": 12},
                                  "train": {"prompts_per_step": 8}})
    stream = PromptStream(load_splits(job.data)[0], seed=job.train.seed)
    stream.next_batch(8)
    prompts = [p["prompt"] for p in stream.next_batch(8)]  # step 2's prompts
    ckpt = tmp_path / "kl" / "run" / "checkpoints" / "step-0000001"
    tok = AutoTokenizer.from_pretrained(ckpt)
    ro = scripted_engine.ScriptedEngine(None, tok).generate(prompts, 4, None)
    with torch.no_grad():
        logp = forward(AutoModelForCausalLM.from_pretrained(ckpt), ro, 1.0).logp
        ref = forward(AutoModelForCausalLM.from_pretrained(models_dir / "tiny-arith"), ro, 1.0).logp
    m = ro.completion_mask.float()
    want = {e: float((fn(logp, ref) * m).sum() / m.sum()) for e, fn in algos.KL_ESTIMATORS.items()}
    assert rows[1]["kl"] == pytest.approx(want[estimator], rel=1e-4)
    assert len({round(v, 6) for v in want.values()}) == 3  # the three estimators really differ here


def test_importance_weights_scale_every_per_token_term(tmp_path, models_dir, monkeypatch):
    """Sampled elsewhere (engine log-probs = the trainer's + ln 4, so every token's weight is 1/4 under
    tis_cap 2): the policy term, the entropy bonus and the KL penalty are all reweighted, so the first
    step's loss is exactly a quarter of the same step's without weights. The KL estimator is replaced by a
    constant 1 per token so that its term is not zero at the reference."""
    from trainer import algos

    monkeypatch.setitem(algos.KL_ESTIMATORS, "k3", lambda lp, ref: lp * 0 + 1.0)
    patch = {"algo": {"entropy_coef": 0.05, "kl_coef": 0.2, "tis_cap": 2.0}, "train": {"steps": 1}}
    plain = _run(tmp_path / "plain", models_dir, **patch)
    assert "tis/weight_mean" not in plain[0] and plain[0]["kl"] == pytest.approx(1.0)
    monkeypatch.setitem(engines.ENGINES, "hf", scripted_engine.ShiftedEngine)
    monkeypatch.setenv("RLVR_TEST_LOGP_SHIFT", repr(math.log(4)))
    tis = _run(tmp_path / "tis", models_dir, **patch)
    assert tis[0]["tis/weight_mean"] == pytest.approx(0.25, rel=1e-5)
    assert tis[0]["loss"] == pytest.approx(plain[0]["loss"] / 4, rel=1e-5)


def test_soft_overlong_punishment_lowers_long_completions_rewards(tmp_path, models_dir):
    """Scripted completions are 6-9 tokens (`\\boxed{n}` plus up to two spaces and EOS): with a 12-token budget and
    an 8-token buffer every token past 4 costs 1/8 of the penalty, so the reward falls by exactly the mean
    punishment the step reports."""
    plain = _run(tmp_path / "plain", models_dir, train={"steps": 1})
    soft = _run(tmp_path / "soft", models_dir, train={"steps": 1}, algo={"overlong_buffer": 8, "overlong_penalty": 0.5})
    pen = soft[0]["reward/overlong_penalty_mean"]
    assert plain[0]["reward/overlong_penalty_mean"] == 0 and -0.5 <= pen < 0
    assert soft[0]["reward/mean"] == pytest.approx(plain[0]["reward/mean"] + pen, abs=1e-6)
    assert soft[0]["accuracy"] == plain[0]["accuracy"]  # the verdicts are the verifiers', untouched


@pytest.mark.parametrize("mode", ["token_mask", "sequence_mask"])
def test_masked_importance_sampling_drops_what_is_too_far_off(tmp_path, models_dir, monkeypatch, mode):
    """Every token's ratio is 1/4 (engine log-probs = the trainer's + ln 4): below the mask modes' default lower
    bound 1 / tis_cap = 1/2 (and each sequence's product further still), so every token is dropped and the
    first step's loss is exactly 0; a sequence_truncate run keeps them, weighted by the sequence's ratio."""
    monkeypatch.setitem(engines.ENGINES, "hf", scripted_engine.ShiftedEngine)
    monkeypatch.setenv("RLVR_TEST_LOGP_SHIFT", repr(math.log(4)))
    rows = _run(tmp_path, models_dir, train={"steps": 1}, algo={"tis_cap": 2.0, "tis_mode": mode, "entropy_coef": 0.01})
    assert rows[0]["tis/masked_frac"] == 1.0 and rows[0]["loss"] == 0.0
    kept = _run(tmp_path / "t", models_dir, train={"steps": 1}, algo={"tis_cap": 2.0, "tis_mode": "sequence_truncate"})
    assert kept[0]["tis/masked_frac"] == 0.0 and 0 < kept[0]["tis/weight_mean"] < 0.25 ** 5
