"""The math verifier's documented options for decimals, on the exact path (rationals, this process)
and on the sympy path (irrationals, the worker), which must apply the same rules."""
from __future__ import annotations

import pytest

from verifiers import get_verifier
from verifiers.base import Status
from verifiers.math import MathVerifier


@pytest.fixture(scope="module")
def default():
    v = MathVerifier()
    v.warm_up()
    return v


def _status(v, pred: str, gold: str) -> Status:
    return v.verify(f"so the answer is $\\boxed{{{pred}}}$.", gold).status


@pytest.mark.parametrize("gold,pred", [
    (r"\frac{1}{3}", "0.33"), (r"\frac{1}{3}", "0.333"), (r"(\frac{3}{5},\frac{8}{3}]", "(0.6,2.6667]"),
    (r"\begin{pmatrix}\frac{1}{3}\\ \frac{1}{5}\end{pmatrix}", r"\begin{pmatrix}0.33\\0.2\end{pmatrix}"),
    (r"\sqrt{2}", "1.41"), (r"\pi", "3.14"),
])
def test_decimals_are_exact_by_default_and_float_rounding_opts_into_rounding(default, gold, pred):
    assert _status(default, pred, gold) is Status.wrong
    lenient = get_verifier("math", {"float_rounding": 2})
    assert _status(lenient, pred, gold) is Status.correct
    finer = get_verifier("math", {"float_rounding": 5})  # more places than the answer gives: still wrong
    assert _status(finer, pred, gold) is Status.wrong


def test_float_rounding_still_rejects_a_different_value():
    lenient = get_verifier("math", {"float_rounding": 2})
    for gold, pred in ((r"\frac{1}{3}", "0.34"), (r"\sqrt{2}", "1.42"), (r"\pi", "3.15"), ("0.5", "0.51")):
        assert _status(lenient, pred, gold) is Status.wrong, (gold, pred)


@pytest.mark.parametrize("gold,pred", [
    (r"\frac{1}{12}", "0.0833333333333333"), (r"\frac{1}{12}", "0.08333333333333333"),  # truncated, rounded
    (r"\sqrt{17}", "4.123105625617661"), ("4.123105625617661", r"\sqrt{17}"), (r"\frac{2}{3}", "0.666666666667"),
    (r"\frac{2}{3}", "0.666666666666"),
])
def test_a_printed_float_equals_the_value_it_prints(default, gold, pred):
    assert _status(default, pred, gold) is Status.correct
    off = get_verifier("math", {"machine_digits": 0})
    assert _status(off, pred, gold) is Status.wrong


@pytest.mark.parametrize("gold,pred", [
    (r"\frac{1}{12}", "0.0833333333333343"), (r"\sqrt{17}", "4.123105625617671"), ("0.1", "0.1000000000001"),
    (r"\frac{2}{3}", "0.666666666668"), (r"\frac{1}{3}", "0.3333333333"),  # 10 digits: a rounding a person chose
])
def test_a_long_decimal_that_is_off_in_its_digits_is_wrong(default, gold, pred):
    assert _status(default, pred, gold) is Status.wrong


def test_options_are_validated():
    for bad in ({"float_rounding": -1}, {"machine_digits": -1}, {"budget_s": 0}, {"budget_s": 61}):
        with pytest.raises(ValueError):
            MathVerifier(bad)
