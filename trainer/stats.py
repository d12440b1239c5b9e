"""Standard errors researchers judge a held-out gain by: of a difference of two proportions, paired or not.

A gain is a difference of two accuracies, so its noise is that of a difference: for two evals of the SAME
problems (before and after; two trainers on one held-out set) the paired form, which only the problems that
flipped inform; for independent samples the unpaired one. Pure functions of counts: the API's comparison of two
evals and bench/learning.py share them.
"""
from __future__ import annotations

import math
from typing import Sequence


def se_proportion(p: float, n: int) -> float:
    """Binomial standard error of an accuracy p measured on n problems."""
    return math.sqrt(max(p * (1 - p), 0.0) / n) if n else float("nan")


def se_diff_unpaired(p1: float, n1: int, p2: float, n2: int) -> float:
    """s.e. of p2 - p1 for two independent samples of problems: sqrt(p1 q1 / n1 + p2 q2 / n2)."""
    return math.hypot(se_proportion(p1, n1), se_proportion(p2, n2))


def mcnemar_p(gained: int, lost: int) -> float:
    """Exact two-sided McNemar p-value: under no change each flip is a fair coin, Binomial(gained + lost, 1/2)."""
    n = gained + lost
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(gained, lost) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def paired(a: Sequence[bool], b: Sequence[bool]) -> dict[str, float]:
    """Accuracy b - a over the same problems (a[i], b[i]: problem i right at each), with its paired s.e.

    Per problem d_i = b_i - a_i in {-1, 0, 1}; the difference is mean(d) and its s.e. sd(d) / sqrt(n) (sample
    sd, n - 1), which only discordant problems feed: ``gained`` (wrong then right) and ``lost``."""
    if len(a) != len(b):
        raise ValueError(f"paired: {len(a)} outcomes against {len(b)}: not the same problems")
    n = len(a)
    gained = sum(1 for x, y in zip(a, b) if y and not x)
    lost = sum(1 for x, y in zip(a, b) if x and not y)
    both = sum(1 for x, y in zip(a, b) if x and y)
    diff = (gained - lost) / n if n else float("nan")
    var = (gained + lost - n * diff * diff) / (n - 1) if n > 1 else float("nan")
    return {"n": n, "accuracy_a": sum(map(bool, a)) / n if n else float("nan"),
            "accuracy_b": sum(map(bool, b)) / n if n else float("nan"), "diff": diff,
            "se": math.sqrt(max(var, 0.0) / n) if n > 1 else float("nan"), "both": both, "gained": gained,
            "lost": lost, "neither": n - both - gained - lost, "mcnemar_p": mcnemar_p(gained, lost)}


def mean_se(xs: Sequence[float]) -> tuple[float, float]:
    """Mean of per-seed figures and its standard error sd / sqrt(k) (nan with one seed)."""
    k = len(xs)
    m = sum(xs) / k
    if k < 2:
        return m, float("nan")
    return m, math.sqrt(sum((x - m) ** 2 for x in xs) / (k - 1) / k)


def seeds_diff(xs: Sequence[Sequence[bool]], ys: Sequence[Sequence[bool]]) -> dict[str, float]:
    """Mean accuracy of runs X minus that of runs Y, all evaluated on the same n held-out problems, with its s.e.

    ``xs[k][i]``: problem i right in X's run k (seed k); likewise ``ys`` (one run for a deterministic start).
    Two noises add: the seeds' (the runs' accuracies scatter: var_x / k_x + var_y / k_y, 0 for a side with one
    run) and the problems' (the held-out set is one sample of problems: paired over the same problems, the sd of
    d_i = mean_k x_ki - mean_k y_ki over sqrt(n)). Their sum counts part of the problem noise twice (a seed's
    accuracy carries it too): a conservative s.e., never a flattering one."""
    n = len(xs[0])
    if any(len(r) != n for r in (*xs, *ys)):
        raise ValueError("seeds_diff: every run must be scored on the same held-out problems")
    px, py = [sum(map(bool, r)) / n for r in xs], [sum(map(bool, r)) / n for r in ys]
    seed_var = sum((mean_se(p)[1] ** 2 if len(p) > 1 else 0.0) for p in (px, py))
    d = [sum(bool(r[i]) for r in xs) / len(xs) - sum(bool(r[i]) for r in ys) / len(ys) for i in range(n)]
    dm = sum(d) / n
    problem_se = math.sqrt(sum((x - dm) ** 2 for x in d) / (n - 1) / n) if n > 1 else float("nan")
    return {"diff": sum(px) / len(px) - sum(py) / len(py), "se": math.sqrt(seed_var + problem_se ** 2),
            "se_seeds": math.sqrt(seed_var), "se_problems": problem_se, "runs_x": len(xs), "runs_y": len(ys)}
