"""What a step stores of its sampled groups for the rollout browser (trainer/online.py): per completion its
length, truncation, tokens, advantage, per-token log-probs and the engine − trainer difference — recorded
from what the step computed anyway, so recording never changes the update."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from trainer import online
from trainer.config import JobSpec

SPEC = {"rollout": {"group_size": 8, "max_new_tokens": 12}, "data": {"eval_size": 4},
        "train": {"steps": 5, "prompts_per_step": 2, "eval_every": 0, "threads": 1}}


def test_stored_completions_carry_tokens_advantages_and_logprobs(tmp_path, models_dir):
    from trainer.loop import train

    stored: dict[int, list] = {}
    train(JobSpec.model_validate(SPEC), tmp_path / "run", models_dir=models_dir,
          on_rollouts=lambda step, groups: stored.setdefault(step, groups), log=lambda _m: None)
    assert sorted(stored) == [1, 2, 3, 4, 5] and all(len(g) == online.SAMPLE_GROUPS for g in stored.values())
    trained = skipped = 0
    for groups in stored.values():
        for g in groups:
            assert g["resampled"] is False  # zero_variance: keep
            comps = g["completions"]
            assert len(comps) == 8
            for c in comps:
                assert c["length"] == len(c["tokens"]) <= 12 and isinstance(c["truncated"], bool)
                assert "".join(c["tokens"]).startswith(c["text"])  # the pieces spell the completion
                assert c["truncated"] == (c["length"] == 12 and "<|end|>" not in "".join(c["tokens"]))
                assert len(c["logprobs"]) == c["length"] and all(lp <= 0 for lp in c["logprobs"])
                assert math.isfinite(c["advantage"])
            rewards = [c["reward"] for c in comps]
            if max(rewards) == min(rewards):
                assert all(c["advantage"] == 0 for c in comps)
                # a group the update skips (zero variance: no signal) runs no forward: its rows show the
                # sampler's log-probs, which are the policy's (synchronous fp32 sampling), and no gap
                assert all(c["logprobs_source"] == "engine" and "logprob_diff" not in c for c in comps)
                skipped += 1
                continue
            trained += 1
            mean = sum(rewards) / len(rewards)
            assert abs(sum(c["advantage"] for c in comps)) < 1e-4  # GRPO: a group baseline
            for c in comps:
                assert math.copysign(1, c["advantage"]) == math.copysign(1, c["reward"] - mean)
                # the trainer's log-probs of rows it trained on, and how far the engine's were from them
                assert c["logprobs_source"] == "trainer" and len(c["logprob_diff"]) == c["length"]
                assert max(map(abs, c["logprob_diff"])) < 1e-2  # same fp32 weights, same temperature
    assert trained >= 1  # P(10 groups of 8 all zero-variance) is about 1e-4 at the tiny model's accuracy
    assert skipped >= 1  # seeded: 6 of the 10 stored groups had zero variance


@pytest.mark.numerics
def test_recording_the_rollouts_does_not_change_the_update(tmp_path, models_dir, monkeypatch):
    from trainer import distributed
    from trainer.loop import setup

    def two_steps(run_dir: Path):
        spec = JobSpec.model_validate({**SPEC, "algo": {"micro_batch_size": 5}})  # rows split over micro-batches
        run = setup(spec, run_dir, models_dir, distributed.Dist(), log=lambda _m: None)
        out = [online.step(run.ctx) for _ in range(2)]
        return run.ctx.policy, out

    recorded_policy, recorded = two_steps(tmp_path / "a")
    monkeypatch.setattr(online, "SAMPLE_GROUPS", 0)  # nothing recorded
    plain_policy, plain = two_steps(tmp_path / "b")
    assert recorded[-1].samples and not plain[-1].samples
    for (name, a), (_, b) in zip(recorded_policy.named_parameters(), plain_policy.named_parameters()):
        assert torch.equal(a, b), name
    volatile = ("time/", "tokens_per_s", "latency")
    for r, p in zip(recorded, plain):
        assert {k: v for k, v in r.metrics.items() if not any(s in k for s in volatile)} == \
               {k: v for k, v in p.metrics.items() if not any(s in k for s in volatile)}
