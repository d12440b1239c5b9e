"""bench/losses.py's own arithmetic and arms: the paired s.e. it calls a loss better by, hand-computed, and
every arm a valid job on the multi-pass recipe (where the ratio leaves 1)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("bench_losses",
                                               Path(__file__).resolve().parent.parent / "bench" / "losses.py")
losses = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(losses)


def test_paired_difference_and_its_standard_error_by_hand():
    arm = [[1, 0, 1, 1], [1, 1, 0, 1]]    # two seeds x the same four problems
    base = [[0, 0, 1, 1], [1, 0, 0, 0]]
    # per problem, averaged over seeds: [.5, .5, 0, .5] -> mean .375, sd .25, se_problems .25 / 2 = .125;
    # per seed: .25 and .5 -> sd .25 / sqrt 2, se_seeds = that / sqrt 2 = .125; se = sqrt(2) x .125
    diff, se, se_p, se_s = losses.paired_diff(arm, base)
    assert diff == pytest.approx(0.375) and se_p == pytest.approx(0.125) and se_s == pytest.approx(0.125)
    assert se == pytest.approx(0.125 * 2 ** 0.5)
    # one seed: no seed spread to measure, only the problems'; an arm against itself differs by nothing
    assert losses.paired_diff(arm[:1], base[:1])[3] == 0.0
    assert losses.paired_diff(arm, arm)[:2] == (0.0, 0.0)


def test_every_arm_is_a_valid_multi_pass_job():
    from service.cli.recipes import recipe

    base = recipe("demo-math-multipass")
    for arm in [*losses.ARMS, "distill"]:
        spec = losses.spec_for(base, arm, 1, "builtin:tiny-arith")
        assert spec.algo.ppo_epochs > 1 and spec.train.seed == 1 and spec.train.eval_every == 0, arm
        assert (spec.distill is not None) == (arm == "distill"), arm
    assert losses.spec_for(base, "gspo", 0).algo.policy_loss == "gspo"
    assert losses.spec_for(base, "dr_grpo", 0).algo.advantage == "grpo_no_std"
