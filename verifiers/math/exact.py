"""Exact scalar equality without sympy, and the decimal rules both comparators share.

``ExactEq`` evaluates an AST over fractions (and +-oo) and raises :class:`NeedSympy` for anything
else (irrationals, symbols, huge powers), which sends the pair to the sympy worker; ``DecimalRules``
decide when a decimal that is not exactly the other side's value still counts as equal to it.
"""
from __future__ import annotations

import math
from fractions import Fraction
from typing import NamedTuple

INF = ("const", "inf")


class NeedSympy(Exception):
    """The fast path cannot decide; hand the pair to the sympy worker."""


def substitute(node, name: str, value):
    """node with the symbol ``name`` replaced by ``value`` (bound variables of sums are renamed)."""
    if node == ("sym", name):
        return value
    if not isinstance(node, tuple):
        return node
    return tuple(substitute(c, name, value) if isinstance(c, tuple) else c for c in node)


class DecimalRules(NamedTuple):
    """When a decimal that is not exactly the other side's value still counts as equal to it.

    ``machine_digits``: a decimal written with at least this many significant digits is a machine
    rendering (a float printed in full: 0.0833333333333333 for 1/12, 4.123105625617661 for sqrt(17)),
    and equals the other side when it is that value rounded or truncated to its digits (half a unit
    in its last digit, a whole one toward zero, plus double-precision slack). Shorter decimals are
    exact, so 0.333 is not 1/3. 0 turns the rule off.
    ``float_rounding``: when set, a decimal also equals the other side when both round to the same
    value at this many decimal places (Math-Verify's ``float_rounding``): with 2, 0.33 equals 1/3.
    """

    machine_digits: int = 12
    float_rounding: int | None = None

    def applies(self, a, b) -> bool:
        return bool(self.machine_digits or self.float_rounding is not None) and (
            decimal_literal(a) is not None or decimal_literal(b) is not None)

    def equal(self, a, b, va, vb, difference, rounded) -> bool:
        """``difference()`` = va - vb and ``rounded(v, places)``: from the exact or the sympy side."""
        for node, sign in ((a, 1), (b, -1)):
            lit = decimal_literal(node)
            if lit is None:
                continue
            if self.machine_digits and lit[1] >= self.machine_digits:
                d = sign * difference()  # this literal minus the other side
                slack = lit[2] / 2 + abs(lit[0]) / 2 ** 52
                if abs(d) <= slack or (d < 0 if lit[0] > 0 else d > 0) and abs(d) < lit[2] + slack:
                    return True
            if self.float_rounding is not None and rounded(va, self.float_rounding) == rounded(vb, self.float_rounding):
                return True
        return False


def decimal_literal(node):
    """(value, significant digits, one unit in the last digit) for 0.125 or -4.5, else None."""
    neg = node[0] == "neg"
    if neg:
        node = node[1]
    if node[0] != "num" or "." not in node[1]:
        return None
    digits = node[1].replace(".", "").lstrip("0")
    places = len(node[1]) - node[1].index(".") - 1
    value = Fraction(node[1])
    return (-value if neg else value), max(len(digits), 1), Fraction(1, 10 ** places)


def round_fraction(v: Fraction, places: int) -> Fraction:
    """Round half away from zero, as people round decimals."""
    scaled = abs(v) * 10 ** places
    n = int(scaled) + (1 if scaled - int(scaled) >= Fraction(1, 2) else 0)
    return Fraction(-n if v < 0 else n, 10 ** places)


class ExactEq:
    """Scalar equality on exact rationals (and +-oo) without sympy; anything else needs the worker."""

    MAX_BITS = 4096
    MAX_SUM_WORK = 20_000  # terms x body size of a finite sum evaluated here; more goes to the worker

    def __init__(self, rules: DecimalRules = DecimalRules()):
        self.rules = rules

    def scalar(self, a, b) -> bool:
        va, vb = self.value(a), self.value(b)
        if va == vb:
            return True
        if isinstance(va, float) or isinstance(vb, float) or not self.rules.applies(a, b):
            return False
        return self.rules.equal(a, b, va, vb, lambda: va - vb, round_fraction)

    def equation(self, a, b) -> bool:
        raise NeedSympy

    def value(self, node):
        kind = node[0]
        if kind == "num":
            return Fraction(node[1])
        if node == INF:
            return math.inf
        if kind == "neg":
            return -self.value(node[1])
        if kind == "sum":
            return self._sum(node)
        if kind in ("add", "sub", "mul", "div", "pow"):
            x, y = self.value(node[1]), self.value(node[2])
            if isinstance(x, float) or isinstance(y, float):
                raise NeedSympy
            if kind == "add":
                r = x + y
            elif kind == "sub":
                r = x - y
            elif kind == "mul":
                r = x * y
            elif kind == "div":
                if y == 0:
                    raise NeedSympy
                r = x / y
            else:
                if y.denominator != 1 or (x == 0 and y < 0):
                    raise NeedSympy
                size = max(abs(x.numerator), x.denominator).bit_length()
                if abs(y) * size > self.MAX_BITS:
                    raise NeedSympy  # huge powers: let the worker (and its time budget) handle them
                r = x ** int(y)
            if max(abs(r.numerator), r.denominator).bit_length() > self.MAX_BITS:
                raise NeedSympy
            return r
        raise NeedSympy

    def _sum(self, node):
        """\\sum_{k=lo}^{hi} body with integer limits, term by term, while that stays cheap."""
        _kind, var, lo, hi, body = node
        lo, hi = self.value(lo), self.value(hi)
        if isinstance(lo, float) or isinstance(hi, float) or lo.denominator != 1 or hi.denominator != 1:
            raise NeedSympy
        terms = int(hi) - int(lo) + 1
        if terms > 0 and terms * _size(body) > self.MAX_SUM_WORK:
            raise NeedSympy
        total = Fraction(0)
        for k in range(int(lo), int(hi) + 1):
            total += self.value(substitute(body, var, ("num", str(k))))
        return total


def _size(node) -> int:
    return 1 + sum(_size(c) for c in node if isinstance(c, tuple))


exact_value = ExactEq(DecimalRules(0, None)).value
