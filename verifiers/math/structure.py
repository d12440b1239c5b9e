"""Answer shapes and how they match, independent of how two scalars are compared.

``compare(gold, pred, eq)`` walks both ASTs: sets and bare lists are unordered, tuples, intervals and
matrices are ordered (interval openness matters), ``\\pm`` expands to two values, ``x = 5`` and
``x \\in S`` reduce to their value, inequalities and intervals are interchangeable, and a list of
values against a single-valued gold is a hedge (wrong). Scalars and equations go to ``eq``:
``exact.ExactEq`` (fractions only, raises ``NeedSympy`` otherwise) or the sympy one in the
worker, so the same rules run on both paths. Also here: ratios (``7:32``, proportional ones are
equal), matrix arithmetic folded into one matrix, ``|x|`` and ``f(x)`` as the subject of an
inequality, a value the prediction repeats in a list (``(3,17), (3,17)``), and the two readings of a
lone ``1,5`` (``amb``). The exact comparator and the decimal rules both sides share are in exact.py.
"""
from __future__ import annotations

import string
from fractions import Fraction

from .exact import INF as _INF, NeedSympy, exact_value, substitute

_NEG_INF = ("neg", _INF)
_INTERVALISH = ("rel", "union", "reals", "tuple", "seq")
MAX_ITEMS = 64  # matching is quadratic; more items than this is not an answer


def _is_var(node) -> bool:
    return node[0] == "sym" and node[1] not in ("e", "i")


def _has_var(node) -> bool:
    if node and node[0] == "sym":
        return _is_var(node)
    return isinstance(node, tuple) and any(isinstance(c, tuple) and _has_var(c) for c in node)


def _contains(node, target) -> bool:
    if node == target:
        return True
    return isinstance(node, tuple) and any(isinstance(c, tuple) and _contains(c, target) for c in node)


_HEADS = set("fghpqrsy") | set(string.ascii_uppercase)  # f(x), W(n): a function applied to a variable


def _is_name(node) -> bool:
    """x, x_1, AB, |AB|, NO/BO, A:B: something the answer names rather than computes."""
    if node[0] in ("mul", "div"):
        return all(_is_name(c) for c in node[1:])
    if node[0] == "ratio":
        return all(_is_name(c) for c in node[1])
    if node[0] == "func" and node[1] == "abs":
        return _is_name(node[2])
    return _is_var(node)


def _is_head(node) -> bool:
    """f(x), p(x, y): a function's name applied to variables, the left side of a definition."""
    if node[0] != "mul" or node[1][0] != "sym" or node[1][1] not in _HEADS:
        return False
    arg = node[2]
    return _is_var(arg) or arg[0] == "tuple" and all(_is_var(a) for a in arg[1])


def strip_assignment(node):
    """x = 5 -> 5, f(x) = x^2 -> x^2, x = 2 + 3 = 5 -> 5, x \\approx 3.1 -> 3.1, x \\in S -> S;
    lists of those element-wise; anything else unchanged."""
    if node[0] == "seq":
        return ("seq", node[1], tuple(strip_assignment(x) for x in node[2]))
    if node[0] != "rel":
        return node
    ops, exprs = node[1], node[2]
    if "~" in ops:  # keep what stands before the first approximation: pi ~ 3.14 is pi
        k = ops.index("~")
        ops, exprs = ops[:k], exprs[:k + 1]
        if not ops:
            return node[2][k + 1] if _is_var(exprs[0]) else exprs[0]
    if all(op == "=" for op in ops) and (len(ops) > 1 and (
            _is_var(exprs[0]) or _is_head(exprs[0]) or not _has_var(exprs[-1])) or not _has_var(node)):
        return exprs[-1]  # x = 2 + 3 = 5, a = b = 0, and a worked line 3 + 4 = 7 answers 7
    if len(ops) == 1:
        (op,), (lhs, rhs) = ops, exprs
        if op in ("=", "in") and (_is_var(lhs) and not _contains(rhs, lhs) or op == "=" and _is_head(lhs)):
            return rhs
        if op == "=" and _is_name(lhs) and not _has_var(rhs):  # AB = 4, |AB| = 1
            return rhs
        if op == "=" and _is_var(rhs) and not _contains(lhs, rhs):
            return lhs
        if op == "=" and rhs[0] in ("seq", "tuple", "matrix"):  # (x, y) = (1, 2)
            return rhs
    return ("rel", ops, exprs)


def expand_pm(node):
    """a \\pm b anywhere in a value -> ("seq", "set", (a+b, a-b)); inside lists too."""
    if node[0] == "seq":
        items = []
        for x in node[2]:
            x = expand_pm(x)
            items.extend(x[2] if x[0] == "seq" and x[1] == "set" and node[1] != "set" else (x,))
        return ("seq", node[1], tuple(items))
    if node[0] in _SCALAR:
        variants = _pm_variants(node)
        if len(variants) > 1:
            return ("seq", "set", tuple(dict.fromkeys(variants)))
    return node


_SCALAR = {"num", "sym", "const", "neg", "add", "sub", "mul", "div", "pow", "func", "log", "root", "binom", "pm",
           "sum", "prod"}


def _pm_variants(node, budget: int = 8) -> list:
    """Each way of reading every \\pm as + or -; few, since real answers have one or two."""
    if node[0] == "pm":
        a_s, b_s = _pm_variants(node[1], budget), _pm_variants(node[2], budget)
        out = [(op, a, b) for a in a_s for b in b_s for op in ("add", "sub")]
        return out[:budget]
    if node[0] in ("num", "sym", "const"):
        return [node]
    out = [()]
    for child in node[1:]:
        options = _pm_variants(child, budget) if isinstance(child, tuple) and child and child[0] in _SCALAR else [child]
        out = [prev + (c,) for prev in out for c in options][:budget]
    return [(node[0],) + o for o in out]


def intervals(node):
    """Inequality / interval / union / reals -> tuple of (lo, hi, open_lo, open_hi), else None."""
    kind = node[0]
    if kind == "reals":
        return ((_NEG_INF, _INF, True, True),)
    if kind == "tuple" and len(node[1]) == 2:
        return ((node[1][0], node[1][1], node[2] == "(", node[3] == ")"),)
    if kind == "seq" and node[1] == "set" and all(x[0] in _SCALAR for x in node[2]):
        return tuple((x, x, False, False) for x in node[2])  # {-1} as the closed interval [-1, -1]
    if kind == "union" or kind == "seq" and node[1] in ("or", "list") and any(x[0] == "rel" for x in node[2]):
        parts = [intervals(x) for x in (node[1] if kind == "union" else node[2])]
        return None if any(p is None for p in parts) else tuple(i for p in parts for i in p)
    if kind == "rel" and all(op in ("<", "<=", ">", ">=", "!=") for op in node[1]):
        return _inequality(node[1], node[2])
    return None


def _is_subject(node) -> bool:
    """What an inequality constrains: x, or f(x) (0 < f(x) < 1 is the range (0, 1))."""
    return _is_var(node) or _is_head(node)


def _inequality(ops, exprs):
    absolute = [k for k, x in enumerate(exprs) if x[0] == "func" and x[1] == "abs" and _is_subject(x[2])]
    if len(absolute) == 1 and not any(_is_subject(x) for x in exprs):
        return _abs_inequality(ops, exprs, absolute[0])
    negated = [k for k, x in enumerate(exprs) if x[0] == "neg" and _is_subject(x[1])]
    if len(negated) == 1 and not any(_is_subject(x) for x in exprs):  # -x > -1  is  x < 1
        flip = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "!=": "!="}
        ops = tuple(flip[op] for op in ops)
        exprs = tuple(x[1] if k == negated[0] else ("neg", x) for k, x in enumerate(exprs))
    var = [k for k, x in enumerate(exprs) if _is_subject(x)]
    if len(var) != 1 or any(_contains(x, exprs[var[0]]) for k, x in enumerate(exprs) if k != var[0]):
        return None
    k = var[0]
    if len(ops) == 1:
        op = ops[0]
        if op == "!=":
            c = exprs[1 - k]
            return ((_NEG_INF, c, True, True), (c, _INF, True, True))
        if k == 0:  # x < c  ->  flip to c > x form
            op = {"<": ">", "<=": ">=", ">": "<", ">=": "<="}[op]
        c = exprs[1 - k]
        if op in ("<", "<="):  # c < x
            return ((c, _INF, op == "<", True),)
        return ((_NEG_INF, c, True, op == ">"),)
    if len(ops) == 2 and k == 1:
        a, b = exprs[0], exprs[2]
        if all(op in ("<", "<=") for op in ops):
            return ((a, b, ops[0] == "<", ops[1] == "<"),)
        if all(op in (">", ">=") for op in ops):
            return ((b, a, ops[1] == ">", ops[0] == ">"),)
    return None


def _abs_inequality(ops, exprs, k):
    """1 <= |z| <= 3/2  ->  [-3/2, -1] U [1, 3/2];  |x| < 2  ->  (-2, 2). Rational bounds only."""
    t = ("sym", "_t")
    parts = _inequality(ops, exprs[:k] + (t,) + exprs[k + 1:])
    if parts is None:
        return None
    out = []
    for lo, hi, open_lo, open_hi in parts:
        try:
            lo_v, hi_v = exact_value(lo), exact_value(hi)
        except NeedSympy:
            return None
        if hi_v < 0 or hi_v == 0 and open_hi:
            continue  # |x| is never negative
        if lo_v < 0 or lo_v == 0 and not open_lo:  # the two halves meet at 0
            out.append((("neg", hi) if hi != _INF else _NEG_INF, hi, open_hi, open_hi))
        else:
            out += [(("neg", hi) if hi != _INF else _NEG_INF, ("neg", lo), open_hi, open_lo),
                    (lo, hi, open_lo, open_hi)]
    return tuple(out) or None


def _match_unordered(gs, ps, same) -> bool:
    if len(gs) != len(ps) and len(set(gs)) == len(gs):  # a value the prediction repeats counts once
        ps = tuple(dict.fromkeys(ps))
    if len(gs) != len(ps):
        return False
    left = list(ps)
    for g in gs:  # greedy is exact here: equality of values is transitive
        for j, p in enumerate(left):
            if same(g, p):
                del left[j]
                break
        else:
            return False
    return True


def compare(gold, pred, eq) -> tuple[bool, str]:
    """(equal, reason) for two answer ASTs; ``eq`` has .scalar(a, b) and .equation(a, b)."""
    if gold == pred:  # identical structure: equal whatever the shape (and no sympy needed)
        return True, ""
    g, p = strip_assignment(gold), strip_assignment(pred)
    if _has_matrix(g) or _has_matrix(p):
        g, p = fold_matrix(g), fold_matrix(p)
    ok = _same(expand_pm(g), expand_pm(p), eq)
    if not ok and gold[0] == "rel" and pred[0] == "rel" and gold[1] == ("=",) == pred[1]:
        ok = eq.equation(gold, pred)  # y = 2x + 3  vs  2x - y + 3 = 0
    return ok, "" if ok else "different answer"


def _pairwise(xs, ys, eq) -> bool:
    return len(xs) == len(ys) and all(_same(a, b, eq) for a, b in zip(xs, ys))


def _same(g, p, eq) -> bool:
    """Do two answer ASTs (node shapes in latex.py's docstring) mean the same value? First the shapes
    that decide alone (text, the two readings of ``1,5``, ratios, big operators, oversized lists, interval
    sets), then each container shape against the other side, then scalars by value (``eq``)."""
    match g, p:
        case (("text", *_), _) | (_, ("text", *_)):
            return g == p
        case ("amb", decimal, as_list), ("amb", p_decimal, p_list):  # 1,5: the reading that fits the other side
            return _same(decimal, p_decimal, eq) or _same(as_list, p_list, eq)
        case ("amb", *readings), _:
            return any(_same(r, p, eq) for r in readings)
        case _, ("amb", *readings):
            return any(_same(g, r, eq) for r in readings)
        case (("ratio", *_), _) | (_, ("ratio", *_)):
            return _same_ratio(g, p, eq)
        case (("sum" | "prod") as kind, *_), (p_kind, *_) if kind == p_kind and _same_big_operator(g, p, eq):
            return True  # else by value below (sympy finds closed forms: sum of k^2 from 0 or from 1)
        case ("seq", _, items), _ if len(items) > MAX_ITEMS:
            return False
        case _, ("seq", _, items) if len(items) > MAX_ITEMS:
            return False
    if not (g[0] == "tuple" and p[0] == "tuple"):  # tuples vs tuples compare bracket by bracket below
        gi = intervals(g) if g[0] in _INTERVALISH else None
        pi = intervals(p) if gi is not None and p[0] in _INTERVALISH else None
        if gi is not None and pi is not None:
            return _match_unordered(gi, pi, lambda a, b: _same_interval(a, b, eq))
    match g, p:
        case ("seq", kind, items), ("seq", p_kind, p_items):
            if kind == p_kind == "list" and _pairwise(items, p_items, eq):
                return True
            return _match_unordered(items, p_items, lambda a, b: _same(a, b, eq))
        case ("seq", "list", items), ("tuple", p_items, "(", _):  # 1, 2 vs (1, 2)
            return _pairwise(items, p_items, eq)
        case ("seq", _, items), _:
            return len(items) == 1 and _same(items[0], p, eq)
        case ("tuple", items, "(", _), ("seq", "list", p_items):  # (1, 2) vs 1, 2
            return _pairwise(items, p_items, eq)
        case _, ("seq", _, p_items):  # several values for one gold value: a hedge unless they all agree
            return len(p_items) >= 1 and all(_same(g, x, eq) for x in p_items)
        case ("tuple", items, opener, closer), ("tuple", p_items, p_opener, p_closer):
            return (opener, closer) == (p_opener, p_closer) and _pairwise(items, p_items, eq)
        case ("tuple", *_), ("matrix", *_):
            return _same(p, g, eq)
        case ("tuple", *_), _:
            return False
        case ("matrix", rows), ("matrix", p_rows):
            return len(rows) == len(p_rows) and all(_pairwise(a, b, eq) for a, b in zip(rows, p_rows))
        case ("matrix", rows), ("tuple", p_items, "(" | "[", _) if len(rows) == 1 or all(len(r) == 1 for r in rows):
            return _pairwise([x for r in rows for x in r], p_items, eq)  # a row or column vector as a tuple
        case ("matrix", *_), _:
            return False
        case ("rel", ops, exprs), ("rel", p_ops, p_exprs):
            return ops == p_ops and _pairwise(exprs, p_exprs, eq)
        case ((("rel" | "union" | "reals"), *_), _) | (_, (("rel" | "union" | "reals" | "tuple" | "matrix"), *_)):
            return False
    return eq.scalar(g, p)


def _is_zero(node) -> bool:
    return node[0] == "num" and Fraction(node[1]) == 0


def _same_ratio(g, p, eq) -> bool:
    """7:32 = 14:64 = 7/32; 12:00 is a time and equals only 12:00 (no division by a zero term)."""
    if g[0] == p[0] == "ratio":
        a, b = g[1], p[1]
        if len(a) != len(b):
            return False
        if all(_same(x, y, eq) for x, y in zip(a, b)):
            return True
        if any(_is_zero(x) for x in a + b) or any(x[0] not in _SCALAR for x in a + b):
            return False
        return all(eq.scalar(("div", x, a[0]), ("div", y, b[0])) for x, y in zip(a[1:], b[1:]))
    r, other = (g, p) if g[0] == "ratio" else (p, g)
    items = r[1]
    if len(items) != 2 or _is_zero(items[1]) or other[0] not in _SCALAR or any(x[0] not in _SCALAR for x in items):
        return False
    return eq.scalar(("div", items[0], items[1]), other) if r is g else eq.scalar(other, ("div", items[0], items[1]))


def _same_big_operator(g, p, eq) -> bool:
    """\\sum_{k=0}^{n} a_k  vs  \\sum_{j=0}^{n} a_j: same limits and the same body after renaming."""
    body = p[4] if p[1] == g[1] else substitute(p[4], p[1], ("sym", g[1]))
    return eq.scalar(g[2], p[2]) and eq.scalar(g[3], p[3]) and (body == g[4] or eq.scalar(g[4], body))


_MAX_MATRIX = 6  # rows or columns of a matrix in arithmetic that is folded
_MAX_MATRIX_OPS = 2  # matrix operations folded per answer: each product multiplies the entries' size


def _has_matrix(node) -> bool:
    return node[0] == "matrix" or node[0] in ("add", "sub", "mul", "neg") and any(
        isinstance(c, tuple) and _has_matrix(c) for c in node[1:])


def fold_matrix(node):
    """Arithmetic on matrices -> one matrix whose entries are arithmetic ASTs: A + B, A - B, A B,
    c A, -A (at most two such operations, 6 x 6 at most; anything else is left as it is)."""
    try:
        return _fold(node, [_MAX_MATRIX_OPS])
    except _TooBig:
        return node


class _TooBig(Exception):
    pass


def _fold(node, ops_left):
    kind = node[0]
    if kind == "neg":
        m = _fold(node[1], ops_left)
        return ("matrix", tuple(tuple(("neg", x) for x in r) for r in m[1])) if m[0] == "matrix" else node
    if kind not in ("add", "sub", "mul"):
        return node
    a, b = _fold(node[1], ops_left), _fold(node[2], ops_left)
    am, bm = a[0] == "matrix", b[0] == "matrix"
    if not (am or bm):
        return node
    ops_left[0] -= 1
    if ops_left[0] < 0 or any(max(len(m[1]), len(m[1][0])) > _MAX_MATRIX for m in (a, b) if m[0] == "matrix"):
        raise _TooBig
    if am and bm:
        ra, rb = a[1], b[1]
        if kind in ("add", "sub") and len(ra) == len(rb) and len(ra[0]) == len(rb[0]):
            return ("matrix", tuple(tuple((kind, x, y) for x, y in zip(r, q)) for r, q in zip(ra, rb)))
        if kind == "mul" and len(ra[0]) == len(rb):
            rows = []
            for r in ra:
                row = []
                for j in range(len(rb[0])):
                    entry = ("mul", r[0], rb[0][j])
                    for t in range(1, len(rb)):
                        entry = ("add", entry, ("mul", r[t], rb[t][j]))
                    row.append(entry)
                rows.append(tuple(row))
            return ("matrix", tuple(rows))
        return node
    if kind == "mul":
        m, c = (a, b) if am else (b, a)
        if c[0] in _SCALAR and not _has_matrix(c):
            return ("matrix", tuple(tuple(("mul", c, x) for x in r) for r in m[1]))
    return node


def _same_interval(a, b, eq) -> bool:
    return a[2:] == b[2:] and eq.scalar(a[0], b[0]) and eq.scalar(a[1], b[1])
