"""The standard errors a gain is judged by (trainer/stats.py), on counts worked out by hand."""
from __future__ import annotations

import math

import pytest

from trainer.stats import mcnemar_p, mean_se, paired, se_diff_unpaired, seeds_diff


def test_unpaired_difference_of_two_proportions():
    # 0.2 and 0.5 on 400 problems each: sqrt(0.16 / 400 + 0.25 / 400) = sqrt(0.41) / 20
    assert math.isclose(se_diff_unpaired(0.2, 400, 0.5, 400), math.sqrt(0.41) / 20)


def test_paired_uses_only_the_flips():
    a = [1, 1, 0, 0, 0, 1, 0, 0]
    b = [1, 0, 1, 1, 1, 1, 0, 0]
    r = paired(a, b)  # gained 3, lost 1: diff 2/8; var (4 - 8/16) / 7 = 0.5; se sqrt(0.5 / 8) = 0.25
    assert (r["gained"], r["lost"], r["both"], r["neither"]) == (3, 1, 2, 2)
    assert r["diff"] == 0.25 and math.isclose(r["se"], 0.25)
    assert math.isclose(mcnemar_p(3, 1), 10 / 16) and mcnemar_p(0, 0) == 1.0
    assert paired(a, a)["se"] == 0.0  # nothing flipped: no noise in the difference of the same outcomes
    with pytest.raises(ValueError, match="not the same problems"):
        paired(a, b[:-1])


def test_seed_means_and_the_difference_of_runs():
    assert mean_se([0.1, 0.3]) == (0.2, pytest.approx(0.1))  # sd sqrt(0.02) / sqrt(2)
    assert math.isnan(mean_se([0.4])[1])
    start = [[0, 0, 0, 0]]
    after = [[1, 1, 0, 0], [1, 0, 0, 0]]  # accuracies 0.5, 0.25: mean 0.375, seed var 0.03125 / 2
    r = seeds_diff(after, start)
    assert r["diff"] == 0.375
    # per problem d = (1, 0.5, 0, 0): mean 0.375, sample var (0.390625 + 0.015625 + 2 * 0.140625) / 3
    problem_var = (0.625 ** 2 + 0.125 ** 2 + 2 * 0.375 ** 2) / 3 / 4
    assert math.isclose(r["se"], math.sqrt(0.03125 / 2 + problem_var))
    assert math.isclose(r["se_seeds"], math.sqrt(0.03125 / 2)) and r["runs_y"] == 1
    with pytest.raises(ValueError, match="same held-out problems"):
        seeds_diff(after, [[0, 0, 0]])
