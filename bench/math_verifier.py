"""Math verifier vs Hugging Face Math-Verify on the same (gold, completion) cases, in one run.

    python bench/math_verifier.py [--quick | --smoke] [--seed 0] [--mv-tests DIR] [--ours-config JSON]

Cases: the hand-built table of tests/data/math_cases.py (shared with the tests, pathological rows
included) plus generated "ordinary" completions (chain of thought ending in \\boxed{}, "####" or
"The answer is ...") over twelve answer kinds, each with right answers written another way and
near-miss wrong ones. Throughput is measured on the ordinary cases only; accuracy, false positives
and worst latency on everything. Math-Verify runs in the main thread (its signal.alarm timeout only
works there) with its default parse/verify settings; gold answers are parsed once for both.
Needs ``pip install math-verify==0.9.0``.

``--mv-tests DIR``: Math-Verify's own test suite (the ``tests/`` folder of a checkout of
github.com/huggingface/Math-Verify, or the checkout itself), read at run time and never copied here.
Its parametrized rows (gold, prediction, expected label) are scored by ours (one config for all
rows, ``--ours-config``), by Math-Verify through the same one-config adapter as above, and by
Math-Verify as its own test functions call it (per-test extraction targets, precision, strict).
Every disagreement with a label is listed; rows whose label belongs to a non-default option of
Math-Verify (``strict=False``, ``allow_set_relation_comp=True``, ``precision`` other than 6) are
marked. The last line is key=value pairs for scripts.

``--smoke`` (CI, tests/test_bench_smoke.py): one generated case of each kind and every 40th table row,
both checkers, the same report: checks the script runs end to end (seconds); not a measurement.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import random
import sys
import time
from fractions import Fraction
from math import gcd
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PREFIXES = [
    "Let's think step by step. First we set up the equation and simplify both sides carefully.\n",
    "We start by noting the constraints. Substituting and collecting terms gives the result below.\n",
    "<think>Hmm, maybe it is 7? No, recompute: the sum of the parts is different.</think>\nWorking it out:\n",
]


def _wrap(rng: random.Random, answer: str) -> str:
    prefix = rng.choice(PREFIXES) + "After simplifying, we obtain the value we need.\n"
    style = rng.randrange(4)
    if style == 0:
        return prefix + f"Therefore, the answer is $\\boxed{{{answer}}}$."
    if style == 1:
        return prefix + f"So the final answer is $\\boxed{{{answer}}}$. I hope it is correct."
    if style == 2:
        return prefix + f"The final answer is ${answer}$."
    return prefix + f"Hence $\\boxed{{{answer}}}$"


def _frac(f: Fraction) -> str:
    s = "-" if f < 0 else ""
    f = abs(f)
    return f"{s}{f.numerator}" if f.denominator == 1 else f"{s}\\frac{{{f.numerator}}}{{{f.denominator}}}"


def generate(rng: random.Random, n_per_kind: int) -> list[tuple[str, str, str, bool]]:
    """(kind, gold, completion, is_correct) for ordinary answers, half right and half near misses."""
    out = []

    def add(kind, gold, right, wrong):
        out.append((kind, gold, _wrap(rng, right), True))
        out.append((kind, gold, _wrap(rng, wrong), False))

    for _ in range(n_per_kind):
        n = rng.randrange(1, 10**6)
        add("integer", str(n), rng.choice([f"{n:,}", str(n), f"\\${n}", f"{n} \\text{{ dollars}}", f"{n}.0"]),
            rng.choice([str(n + 1), str(n - 1), f"{n * 10:,}", str(-n)]))
        gsm = f"She has {n} - 5 + 5 = {n} left.\n#### {n}"
        out.append(("gsm8k", str(n), gsm, True))
        out.append(("gsm8k", str(n), gsm.replace(f"#### {n}", f"#### {n + 2}"), False))
        a, b = rng.randrange(1, 50), rng.randrange(2, 50)
        if gcd(a, b) != 1:
            b += 1
        f = Fraction(a, b)
        k = rng.randrange(2, 5)
        dec = str(float(f)) if 1000 % f.denominator == 0 or 10**6 % f.denominator == 0 else None
        add("fraction", _frac(f),
            rng.choice([f"\\dfrac{{{f.numerator}}}{{{f.denominator}}}", f"{f.numerator}/{f.denominator}",
                                              f"\\frac{{{k * f.numerator}}}{{{k * f.denominator}}}", dec or _frac(f)]),
            rng.choice([_frac(1 / f) if f != 1 else "2", _frac(f + 1),
                        f"{float(f):.3f}" if dec is None else _frac(f * 2)]))
        c, r = rng.randrange(2, 9), rng.choice([2, 3, 5, 6, 7, 10])
        add("radical", f"{c}\\sqrt{{{r}}}",
            rng.choice([f"\\sqrt{{{c * c * r}}}", f"{c} \\sqrt {r}", f"\\sqrt{{{r}}} \\cdot {c}"]),
            rng.choice([f"{c}\\sqrt{{{r + 1}}}", f"{c + 1}\\sqrt{{{r}}}", f"\\sqrt{{{c * r}}}"]))
        p, q = rng.randrange(1, 7), rng.randrange(2, 9)
        add("pi", f"\\frac{{{p}\\pi}}{{{q}}}",
            rng.choice([f"\\frac{{{p}}}{{{q}}}\\pi", f"{p}\\pi/{q}", f"\\frac{{{p*2}\\pi}}{{{q*2}}}"]),
            rng.choice([f"{float(Fraction(p, q)) * 3.14159:.4f}", f"\\frac{{{p}\\pi}}{{{q + 1}}}",
                        f"\\frac{{{p}}}{{{q}}}"]))
        r1, r2 = rng.randrange(-9, 10), rng.randrange(-9, 10)
        poly = f"x^2 {-(r1 + r2):+d}x {r1 * r2:+d}"
        add("polynomial", poly, f"(x {-r1:+d})(x {-r2:+d})", f"(x {r1:+d})(x {-r2:+d})" if r1 else f"(x+1)(x {-r2:+d})")
        add("point", f"({r1}, {r2})", rng.choice([f"\\left({r1},{r2}\\right)", f"({r1},{r2})"]),
            f"({r2}, {r1})" if r1 != r2 else f"({r1}, {r2 + 1})")
        s1, s2 = sorted({r1, r2 + 20})
        add("roots", f"{s1}, {s2}", rng.choice([f"{s2}, {s1}", f"x = {s1} \\text{{ or }} x = {s2}", f"{s1}, {s2}"]),
            rng.choice([f"{s1}", f"{s1}, {s2 + 1}", f"{s1} \\text{{ or }} {s2} \\text{{ or }} {s2 + 1}"]))
        lo, hi = sorted((r1, r2 + 20))
        add("interval", f"[{lo}, {hi})", rng.choice([f"{lo} \\le x < {hi}", f"\\left[{lo}, {hi}\\right)"]),
            rng.choice([f"({lo}, {hi})", f"[{lo}, {hi}]", f"{lo} < x < {hi}"]))
        pc = rng.randrange(1, 100)
        add("percent", f"{pc}\\%", rng.choice([f"{pc}", f"{pc}\\%", f"{pc} \\%"]),
            rng.choice([f"{pc + 1}\\%", f"{pc * 10}"]))
        add("degrees", f"{pc}^\\circ", rng.choice([f"{pc}", f"{pc}^{{\\circ}}", f"{pc} \\text{{ degrees}}"]),
            f"{pc + 5}^\\circ")
        ca, cb = rng.randrange(1, 9), rng.randrange(1, 9)
        add("complex", f"{ca}+{cb}i", rng.choice([f"{cb}i+{ca}", f"{ca} + {cb} i"]), f"{ca}-{cb}i")
        d = Fraction(rng.randrange(1, 10**4), 100)
        add("decimal", f"{float(d):g}", rng.choice([_frac(d), f"{float(d):.2f}"]),
            rng.choice([f"{float(d) + 0.01:.2f}", f"{float(d):.2f}".rstrip("0")[:-1] or "0"]))
    return out


def generate_hard(rng: random.Random, n_per_kind: int) -> list[tuple[str, str, str, bool]]:
    """Harder pairs: equal values in distant forms, and near misses that rounding or loose matching
    would accept (repeating decimals, big integers off by one, swapped openness, transposes)."""
    out = []

    def add(kind, gold, right, wrong):
        out.append((kind, gold, _wrap(rng, right), True))
        out.append((kind, gold, _wrap(rng, wrong), False))

    for _ in range(n_per_kind):
        q = rng.choice([3, 7, 9, 11, 13])
        p = rng.randrange(1, q)
        while gcd(p, q) != 1:
            p = rng.randrange(1, q)
        digits = str(Fraction(p, q) * 10 ** 12 // 1).zfill(12)
        add("repeating", _frac(Fraction(p, q)),
            f"0.\\overline{{{digits[:6] if q in (7, 13) else digits[:2] if q == 11 else digits[:1]}}}",
            f"0.{digits[:8]}")
        big = rng.randrange(10**25, 10**30)
        add("big-integer", str(big), f"{big:,}".replace(",", "{,}"), str(big + rng.choice([-1, 1])))
        a, b = rng.randrange(1, 9), rng.randrange(1, 9)
        add("expansion", f"x^2 + {a + b}x + {a * b}", f"(x+{a})(x+{b})", f"(x+{a})(x-{b})")
        k = rng.choice([3, 4, 6])
        val = {3: ("\\frac{\\sqrt{3}}{2}", "\\frac{1}{2}"), 4: ("\\frac{\\sqrt{2}}{2}", "\\frac{1}{2}"),
               6: ("\\frac{1}{2}", "\\frac{\\sqrt{3}}{2}")}[k]
        other = "\\tan" if k == 4 else "\\cos"  # cos(pi/4) = sin(pi/4): not a near miss
        add("trig", val[0], f"\\sin\\left(\\frac{{\\pi}}{{{k}}}\\right)",
            f"{other}\\left(\\frac{{\\pi}}{{{k}}}\\right)")
        roots = rng.sample(range(-12, 13), 3)
        perm = roots[:]
        rng.shuffle(perm)
        add("root-set", ", ".join(map(str, roots)), ", ".join(map(str, perm)),
            ", ".join(map(str, perm[:2] + [perm[2] + 1])))
        lo, mid, hi = sorted(rng.sample(range(-20, 20), 3))
        add("union", f"(-\\infty, {lo}] \\cup ({mid}, {hi})", f"({mid}, {hi}) \\cup (-\\infty, {lo}]",
            f"(-\\infty, {lo}) \\cup ({mid}, {hi})")
        m, c = rng.randrange(1, 6), rng.randrange(-9, 10)
        add("line", f"y = {m}x {c:+d}", f"{m}x - y {c:+d} = 0", f"{m}x + y {c:+d} = 0")
        e = [rng.randrange(-9, 10) for _ in range(4)]
        mat = "\\begin{{pmatrix}} {} & {} \\\\ {} & {} \\end{{pmatrix}}"
        add("matrix", mat.format(*e), mat.format(*e).replace("pmatrix", "bmatrix"),
            mat.format(e[0], e[2], e[1], e[3]) if e[1] != e[2] else mat.format(e[0], e[1], e[2], e[3] + 1))
        ca, cb, cc, cd = (rng.randrange(1, 6) for _ in range(4))
        prod = complex(ca, cb) * complex(cc, cd)
        add("complex-product", f"{int(prod.real)} {int(prod.imag):+d}i", f"({ca}+{cb}i)({cc}+{cd}i)",
            f"({ca}+{cb}i)({cc}-{cd}i)")
        mant, ex = rng.randrange(11, 99), rng.randrange(3, 12)
        add("scientific", f"{mant / 10} \\times 10^{{{ex}}}", str(mant * 10 ** (ex - 1)), str(mant * 10 ** ex))
        n = rng.randrange(2, 50)
        add("sqrt-close", f"\\sqrt{{{n * n + 1}}}", f"\\sqrt{{{n * n + 1}}}", f"{n + 0.5 / n:.6f}")
    return out


def load_table():
    spec = importlib.util.spec_from_file_location("math_cases", ROOT / "tests" / "data" / "math_cases.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return [(cat, gold, mod.completion_for(cat, pred), exp == "correct") for cat, gold, pred, exp in mod.CASES]


class MvRow(NamedTuple):
    test: str  # module.function of their test
    gold: str
    pred: str
    expected: bool
    params: dict  # the row as their parametrize names it (for their own test function)
    call: Any  # their test function
    option: str  # the non-default Math-Verify option the label depends on, or ""


def _non_default(params: dict) -> str:
    if params.get("strict") is False:
        return "strict=False"
    if params.get("allow_set_relation_comp") is True:
        return "allow_set_relation_comp=True"
    if params.get("precision") not in (None, 6):
        return f"precision={params['precision']}"
    return ""


def load_mv_tests(folder: Path) -> list[MvRow]:
    """Math-Verify's parametrized test rows that have a gold, a prediction and a label, read from
    its test modules at run time (they need ``math_verify`` and ``pytest`` importable). Their
    labels follow Math-Verify's conventions, so this set favours it the way our table favours us."""
    import types

    if (folder / "tests").is_dir():
        folder = folder / "tests"
    pkg = types.ModuleType("tests")  # their modules import each other as tests.test_all
    pkg.__path__ = [str(folder)]
    saved = {k: v for k, v in sys.modules.items() if k == "tests" or k.startswith("tests.")}
    for key in saved:
        del sys.modules[key]
    sys.modules["tests"] = pkg
    rows = []
    try:
        for path in sorted(folder.glob("test_*.py")):
            spec = importlib.util.spec_from_file_location(f"tests.{path.stem}", path)
            mod = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = mod
            spec.loader.exec_module(mod)
            for name, fn in vars(mod).items():
                for mark in getattr(fn, "pytestmark", []) if name.startswith("test_") else []:
                    if mark.name != "parametrize" or not isinstance(mark.args[0], str):
                        continue
                    names = [a.strip() for a in mark.args[0].split(",")]
                    for values in mark.args[1]:
                        row = dict(zip(names, getattr(values, "values", values)))
                        expected = row.get("expected", row.get("result"))
                        if "gold" in row and "pred" in row and expected is not None:
                            rows.append(MvRow(f"{path.stem}.{name}", row["gold"].strip(), row["pred"],
                                              bool(expected), row, fn, _non_default(row)))
    finally:
        for key in [k for k in sys.modules if k == "tests" or k.startswith("tests.")]:
            del sys.modules[key]
        sys.modules.update(saved)
    return rows


class MvOwnTests:
    """Math-Verify as its own test functions call it: a row agrees when its test passes."""

    name = "math-verify (its own test calls)"

    def __init__(self):
        import logging

        logging.getLogger("math_verify").setLevel(logging.CRITICAL)

    def agrees(self, row: MvRow) -> bool:
        try:
            row.call(**row.params)
        except AssertionError:
            return False
        except Exception:  # a test that raises fails too
            return False
        return True


class Ours:
    name = "ours"

    def __init__(self, config: dict | None = None):
        from verifiers.math import MathVerifier

        self.v = MathVerifier(config or {})
        self.v.warm_up()  # a running service warms up once; the budget holds from then on
        self.v.verify("\\boxed{\\sqrt{2}}", "\\sqrt{2}")

    def __call__(self, gold: str, completion: str) -> bool:
        return self.v.verify(completion, gold).score == 1.0

    def parse_phase_s(self, gold: str, completion: str) -> float:
        """Seconds of the part of a check that runs in the caller (extraction, parsing, exact
        comparison), the gold's parse included (its cache cleared)."""
        from verifiers.math.verifier import _parse_gold

        _parse_gold.cache_clear()
        t0 = time.perf_counter()
        self.v._prepare(completion, gold)
        return time.perf_counter() - t0


class MathVerify:
    name = "math-verify"

    def __init__(self):
        import logging

        from math_verify import parse, verify

        logging.getLogger("math_verify").setLevel(logging.CRITICAL)  # it logs every timeout with the input

        self.parse, self.verify_fn, self.gold_cache = parse, verify, {}
        self("1", "\\boxed{1}")

    def __call__(self, gold: str, completion: str) -> bool:
        if gold not in self.gold_cache:
            self.gold_cache[gold] = self.parse(f"${gold}$") or self.parse(gold)
        try:
            return bool(self.verify_fn(self.gold_cache[gold], self.parse(completion)))
        except Exception:  # Math-Verify raising counts as "not correct", as it would in a reward loop
            return False


def run(checker, cases):
    said, latencies = [], []
    for _kind, gold, completion, _truth in cases:
        t0 = time.perf_counter()
        said.append(checker(gold, completion))
        latencies.append(time.perf_counter() - t0)
    return said, latencies


def score_mv_rows(rows: list[MvRow], ours: Ours, mv: "MathVerify", show_all: bool) -> dict:
    """Agreement with Math-Verify's labels on its own rows, for ours and for Math-Verify both ways."""
    out = {}
    own = MvOwnTests()
    for label, judge in (("ours", ours), ("math-verify", mv)):
        said, lat = [], []
        for r in rows:
            t0 = time.perf_counter()
            said.append(judge(r.gold, r.pred))
            lat.append(time.perf_counter() - t0)
        bad = [(r, s_) for r, s_ in zip(rows, said) if s_ != r.expected]
        out[label] = dict(agree=1 - len(bad) / len(rows), fp=sum(s_ for _r, s_ in bad), cps=len(rows) / sum(lat),
                          worst=max(lat), bad=bad)
    t0 = time.perf_counter()
    own_bad = [r for r in rows if not own.agrees(r)]
    own_s = time.perf_counter() - t0
    out["own"] = dict(agree=1 - len(own_bad) / len(rows), bad=own_bad, s=own_s)
    print(f"\n== Math-Verify's own test rows: {len(rows)} (gold, prediction, label) rows from "
          f"{len({r.test for r in rows})} parametrized tests; {sum(bool(r.option) for r in rows)} labelled under a "
          f"non-default Math-Verify option")
    for label in ("ours", "math-verify"):
        o = out[label]
        print(f"   {label:<38} agreement {o['agree']:.4f} ({len(rows) - len(o['bad'])}/{len(rows)})  false positives "
              f"{o['fp']}  checks/s {o['cps']:.1f}  worst {o['worst']:.3f}s")
    print(f"   {own.name:<38} agreement {out['own']['agree']:.4f} ({len(rows) - len(own_bad)}/{len(rows)})")
    for label in ("ours", "math-verify"):
        print(f"\n   disagreements, {label} (said / label):")
        for r, s_ in out[label]["bad"] if show_all or label == "ours" else out[label]["bad"][:15]:
            tag = f" [label under {r.option}]" if r.option else ""
            print(f"     {'FP' if s_ else 'FN'} {r.test.split('.')[-1]}{tag} gold={r.gold[-60:]!r} "
                  f"pred={r.pred[-80:]!r}")
    print(f"\n   disagreements, {own.name}:")
    for r in own_bad:
        print(f"     {r.test.split('.')[-1]} gold={r.gold[-60:]!r} pred={r.pred[-80:]!r} label={int(r.expected)}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer generated cases (< 5 min on 2 cores)")
    ap.add_argument("--smoke", action="store_true", help="a few cases of each kind: checks the script runs "
                    "(seconds; not a measurement)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--show", type=int, default=15, help="print up to this many disagreements with the labels")
    ap.add_argument("--mv-tests", type=Path, help="Math-Verify's tests/ folder (or its checkout): score its own rows")
    ap.add_argument("--ours-config", type=json.loads, default={},
                    help='our MathConfig as JSON, e.g. \'{"float_rounding": 2}\'')
    args = ap.parse_args()

    rng = random.Random(args.seed)
    ordinary = generate(rng, 1 if args.smoke else 15 if args.quick else 60)
    hard = generate_hard(rng, 1 if args.smoke else 15 if args.quick else 50)
    table = load_table()[::40] if args.smoke else load_table()
    cases = table + hard + ordinary
    print(f"cases: {len(table)} table (tests/data/math_cases.py) + {len(hard)} generated hard + "
          f"{len(ordinary)} generated ordinary = {len(cases)}")

    mv_rows = load_mv_tests(args.mv_tests) if args.mv_tests else []
    ours, mv = Ours(args.ours_config), MathVerify()
    if args.ours_config:
        print(f"ours with config {args.ours_config}")
    results = {}
    for checker in (ours, mv):
        said, lat = run(checker, cases)
        ord_said, ord_lat = run(checker, ordinary)  # second, timed pass on ordinary answers only
        truth = [c[3] for c in cases]
        acc = sum(s == t for s, t in zip(said, truth)) / len(cases)
        fp = [c for c, s in zip(cases, said) if s and not c[3]]
        fn = [c for c, s in zip(cases, said) if not s and c[3]]
        cps = len(ordinary) / sum(ord_lat)
        worst = max(lat + ord_lat)
        by_kind = {}
        for (kind, *_rest), t in zip(ordinary, ord_lat):
            by_kind.setdefault(kind, []).append(t)
        results[checker.name] = dict(acc=acc, fp=len(fp), fn=len(fn), cps=cps, worst=worst,
                                     kinds={k: len(v) / sum(v) for k, v in by_kind.items()})
        print(f"\n== {checker.name}: accuracy {acc:.4f}  false positives {len(fp)}  false negatives {len(fn)}  "
              f"ordinary checks/s {cps:.1f}  worst latency {worst:.3f}s  p50 "
              f"{sorted(ord_lat)[len(ord_lat) // 2] * 1e3:.2f}ms")
        for kind, gold, completion, truth_ in (fp + fn)[: args.show]:
            tail = completion[-70:].replace("\n", " ")
            print(f"   {'FP' if not truth_ else 'FN'} [{kind}] gold={gold[:40]!r} ...{tail!r}")
    parse_worst = max(ours.parse_phase_s(g, c) for _k, g, c, _t in cases + [("", r.gold, r.pred, 0) for r in mv_rows])
    print(f"\nours, parse phase alone (extraction + parsing + exact comparison, gold parse included): "
          f"worst {parse_worst * 1e3:.1f} ms")

    o, m = results["ours"], results["math-verify"]
    ratio = o["cps"] / m["cps"]
    print("\nordinary checks/s by answer kind (ours / math-verify):")
    print("   " + "  ".join(f"{k} {o['kinds'][k]:.0f}/{m['kinds'][k]:.0f}" for k in o["kinds"]))
    print(f"\nspeed ratio (ordinary answers) {ratio:.1f}x; accuracy {o['acc']:.4f} vs {m['acc']:.4f}; "
          f"false positives {o['fp']} vs {m['fp']}; worst latency {o['worst']:.3f}s vs {m['worst']:.3f}s")
    tail = ""
    if mv_rows:
        mvr = score_mv_rows(mv_rows, ours, mv, show_all=True)
        tail = (f" mv_rows={len(mv_rows)} mv_agree_ours={mvr['ours']['agree']:.4f} "
                f"mv_agree_mv={mvr['math-verify']['agree']:.4f} mv_agree_mv_own_calls={mvr['own']['agree']:.4f} "
                f"mv_fp_ours={mvr['ours']['fp']} mv_fp_mv={mvr['math-verify']['fp']} "
                f"mv_rows_cps_ours={mvr['ours']['cps']:.1f} mv_rows_cps_mv={mvr['math-verify']['cps']:.1f} "
                f"mv_rows_worst_ours_s={mvr['ours']['worst']:.3f}")
    print(f"speed_ratio={ratio:.2f} accuracy_ours={o['acc']:.4f} accuracy_mv={m['acc']:.4f} fp_ours={o['fp']} "
          f"fp_mv={m['fp']} cps_ours={o['cps']:.1f} cps_mv={m['cps']:.1f} worst_ours_s={o['worst']:.3f} "
          f"worst_mv_s={m['worst']:.3f} parse_worst_ours_s={parse_worst:.4f} cases={len(cases)}{tail}")


if __name__ == "__main__":
    main()
