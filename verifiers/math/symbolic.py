"""AST -> sympy and sympy equality. Imported only inside the worker process (see worker.py).

Numbers stay exact: decimals become Rationals, so 0.333 != 1/3 and 3.14 != pi, and two values that
are both rational are compared exactly (huge integers differing by one differ). Irrational constants
are compared by their difference at 50 significant digits, relative to their size, so 10^{-20} is
not 0. Expressions with variables are compared at fixed pseudo-random points (mixed signs, so
sqrt(x^2) is not x), and only if that is inconclusive by ``simplify``. ``i`` is the imaginary unit
when the gold answer involves it. Decimal tolerance follows ``structure.DecimalRules``, as on the
exact path. Sums and products are evaluated (term by term up to ``_MAX_SUM_TERMS`` terms, or in
closed form for symbolic limits); longer ones stay unevaluated.
"""
from __future__ import annotations

import cmath
from functools import lru_cache

import sympy as sp

from .exact import DecimalRules

_FUNCS = {
    "sin": sp.sin, "cos": sp.cos, "tan": sp.tan, "sec": sp.sec, "csc": sp.csc, "cot": sp.cot,
    "arcsin": sp.asin, "arccos": sp.acos, "arctan": sp.atan, "sinh": sp.sinh, "cosh": sp.cosh,
    "tanh": sp.tanh, "exp": sp.exp, "ln": sp.log, "sqrt": sp.sqrt, "abs": sp.Abs,
    "floor": sp.floor, "ceil": sp.ceiling, "factorial": sp.factorial,
}
_I = sp.Symbol("i")
_POINTS = (sp.Rational(7, 19), sp.Rational(-13, 11), sp.Rational(29, 17), sp.Rational(-5, 23))
_DIGITS = 50
_MAX_POW_BITS = 200_000  # exact powers beyond this stay unevaluated (2^(10^9) is not computed)
_MAX_SUM_TERMS = 10_000


@lru_cache(maxsize=4096)
def to_sympy(node):
    """Tuple AST -> sympy expression (cached: the gold side is converted once per worker)."""
    kind = node[0]
    if kind == "num":
        return sp.Rational(node[1])
    if kind == "sym":
        return sp.E if node[1] == "e" else sp.Symbol(node[1])
    if kind == "const":
        return sp.pi if node[1] == "pi" else sp.oo
    if kind == "neg":
        return -to_sympy(node[1])
    if kind in ("add", "sub", "mul", "div"):
        a, b = to_sympy(node[1]), to_sympy(node[2])
        return {"add": lambda: a + b, "sub": lambda: a - b, "mul": lambda: a * b,
                "div": lambda: a / b}[kind]()
    if kind == "pow":
        base, exp = to_sympy(node[1]), to_sympy(node[2])
        if base.is_Integer and exp.is_Integer and abs(int(exp)) * int(base).bit_length() > _MAX_POW_BITS:
            return sp.Pow(base, exp, evaluate=False)
        return base ** exp
    if kind == "func":
        return _FUNCS[node[1]](to_sympy(node[2]))
    if kind == "log":
        arg = to_sympy(node[2])
        return sp.log(arg) if node[1] is None else sp.log(arg, to_sympy(node[1]))
    if kind == "root":
        return sp.root(to_sympy(node[2]), to_sympy(node[1]))
    if kind == "binom":
        return sp.binomial(to_sympy(node[1]), to_sympy(node[2]))
    if kind in ("sum", "prod"):
        k, lo, hi = sp.Symbol(node[1]), to_sympy(node[2]), to_sympy(node[3])
        big = (sp.Sum if kind == "sum" else sp.Product)(to_sympy(node[4]), (k, lo, hi))
        if lo.is_Integer and hi.is_Integer and int(hi) - int(lo) >= _MAX_SUM_TERMS:
            return big
        return big.doit()  # term by term, or a closed form (sum of k up to n: n(n+1)/2)
    raise ValueError(f"not a scalar: {kind}")


def _numeric(x):
    v = sp.N(x, _DIGITS)
    if not v.is_number or v.has(sp.nan, sp.zoo):
        return None
    return complex(0) if v == 0 else v


def _close(x, y) -> bool | None:
    """Numeric equality of two constant expressions; None when it cannot be evaluated."""
    if x.has(sp.oo, -sp.oo, sp.zoo) or y.has(sp.oo, -sp.oo, sp.zoo):
        return x == y
    d = x - y  # sympy combines like terms, so 10^100 + sqrt2 vs 10^100 + sqrt2 + 1 gives -1 here
    if d.is_Rational:
        return d == 0
    dv, xv, yv = _numeric(d), _numeric(x), _numeric(y)
    if dv is None or xv is None or yv is None:
        return None
    dv, xv, yv = complex(dv), complex(xv), complex(yv)
    if not all(cmath.isfinite(v) for v in (dv, xv, yv)):
        return x == y  # beyond float range (2^(2^65536)): only identical forms can be trusted equal
    return abs(dv) <= max(abs(xv), abs(yv)) * 10 ** (-(_DIGITS - 10))


def expr_equal(a, b) -> bool:
    if a == b:
        return True
    free = sorted(a.free_symbols | b.free_symbols, key=str)
    if not free:
        if a.is_Rational and b.is_Rational:
            return False
        close = _close(a, b)
        if close is not None:
            return close
        return sp.simplify(a - b) == 0
    checked = 0
    for k in range(3):
        subs = {s: _POINTS[(k + j) % len(_POINTS)] + j for j, s in enumerate(free)}
        close = _close(a.xreplace(subs), b.xreplace(subs))
        if close is False:
            return False
        checked += close is True
    if checked >= 2:
        return True
    return sp.simplify(a - b) == 0


def _real_value(x):
    v = sp.N(x, _DIGITS)
    return v if v.is_real and v.is_finite else None


def _rounded(v, places: int):
    return sp.floor(sp.Abs(v) * 10 ** places + sp.Rational(1, 2)) * sp.sign(v)


class SympyEq:
    """The comparator ``structure.compare`` uses inside the worker."""

    def __init__(self, gold_ast, rules: DecimalRules = DecimalRules()):
        self.complex_gold = _mentions_i(gold_ast)
        self.rules = rules

    def scalar(self, g, p) -> bool:
        a, b = to_sympy(g), to_sympy(p)
        if expr_equal(a, b):
            return True
        if self.rules.applies(g, p) and not (a.free_symbols or b.free_symbols):
            va, vb = _real_value(a), _real_value(b)
            if va is not None and vb is not None and self.rules.equal(
                    g, p, va, vb, lambda: sp.N(a - b, _DIGITS), _rounded):
                return True
        # i is the imaginary unit when the gold is complex, or a constant and i is all the prediction has
        constant_gold = not a.free_symbols and b.free_symbols == {_I}
        if (self.complex_gold or constant_gold) and (a.has(_I) or b.has(_I)):
            return expr_equal(a.xreplace({_I: sp.I}), b.xreplace({_I: sp.I}))
        return False

    def equation(self, g, p) -> bool:
        """Two equations are the same when lhs - rhs differ by a nonzero constant factor."""
        (gl, gr), (pl, pr) = g[2], p[2]
        d1, d2 = to_sympy(gl) - to_sympy(gr), to_sympy(pl) - to_sympy(pr)
        if d1 == 0 or d2 == 0:
            return d1 == d2
        ratio = sp.cancel(d1 / d2)
        return bool(ratio.is_number and ratio != 0 and ratio.is_finite)


def _mentions_i(node) -> bool:
    if not node:
        return False
    if node == ("sym", "i"):
        return True
    if node[0] in ("func",) and node[1] == "sqrt" and node[2][0] == "neg":
        return True  # \sqrt{-4} is complex too
    return any(isinstance(c, tuple) and _mentions_i(c) for c in node)
