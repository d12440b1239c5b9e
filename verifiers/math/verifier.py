"""MathVerifier: does a completion reach the reference's mathematical answer?

Pipeline: extract the final answer (extract.py) -> normalise and parse both sides to a tuple AST
(normalize.py, latex.py; the gold once per process, cached) -> compare shapes (structure.py) with
exact fractions in this process -> only if that cannot decide, sympy in a killable worker process
(worker.py, symbolic.py). One check is bounded end to end by ``budget_s`` (default 1 s): the
parse phase is linear in inputs capped in size (50k characters of completion, 1000 of answer), and
what it spent is taken off the sympy deadline. Ordinary numeric answers never leave this process
and never import sympy.

    >>> MathVerifier().verify("so the total is \\\\boxed{19}", "19").status
    <Status.correct: 'correct'>
"""
from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from functools import lru_cache
from typing import Any, NamedTuple, Sequence

from pydantic import Field

from ..base import BaseVerifier, Status, Verdict, VerifierConfig
from .exact import DecimalRules, ExactEq, NeedSympy
from .extract import extract_answer, restore_escapes
from .latex import ParseError
from .normalize import MAX_ANSWER_CHARS, parse_answer, text_key
from .structure import compare
from .worker import get_pool

_RETURN_RESERVE_S = 0.02  # of the budget, kept for what follows the sympy deadline (a kill is backgrounded)


class MathConfig(VerifierConfig):
    budget_s: float = Field(1.0, gt=0, le=60, description=(
        "hard bound on one check, end to end: extraction, parsing, waiting for a free sympy worker and "
        "sympy itself; a check that cannot finish in it is `timeout`. It holds once this process's "
        "sympy pool is warm (warm_up(), or after the first symbolic check)."))
    timeout_s: float = Field(0.75, gt=0, le=60, description="cap on the sympy part of one check (inside budget_s)")
    workers: int = Field(2, ge=1, le=32, description="sympy worker processes in this process's shared pool "
                         "(it grows to the largest value any verifier asks for); the second one is a warm spare "
                         "after a kill. Size it to the threads that verify at once: a check waits for a free "
                         "worker only within budget_s")
    startup_timeout_s: float = Field(30.0, gt=0, le=600, description=(
        "how long the first symbolic check of a process (cold pool) may wait for sympy to import"))
    machine_digits: int = Field(12, ge=0, le=50, description=(
        "a decimal written with at least this many significant digits is a printed float "
        "(0.0833333333333333 for 1/12) and equals a value within one unit of its last digit; shorter "
        "decimals are exact (0.333 is not 1/3). 0 turns this off"))
    float_rounding: int | None = Field(None, ge=0, le=15, description=(
        "lenient decimals, off by default: when set, a decimal also equals a value that rounds to the same "
        "number at this many decimal places (2: 0.33 = 1/3, 2.6667 = 8/3), like Math-Verify's float_rounding"))
    allow_unevaluated: bool = Field(True, description=(
        "Accept arithmetic left for the grader to do (`\\boxed{30-15}` for gold 15), as MATH-style graders "
        "do. Turn it off for arithmetic tasks: there a policy can echo the question into the box and be "
        "graded correct (the built-in arithmetic demo does)."))


_ARITH = {"add", "sub", "mul", "div", "pow", "neg", "func"}


def _is_literal(ast: Any) -> bool:
    """A stated number: 15, -15, 0.5, 3/4, -\\frac{3}{4}."""
    if not isinstance(ast, tuple) or not ast:
        return False
    if ast[0] == "num":
        return True
    if ast[0] == "neg":
        return _is_literal(ast[1])
    return ast[0] == "div" and ast[1][0] == "num" and ast[2][0] == "num"


def _is_arithmetic(ast: Any) -> bool:
    """Only numbers combined by operators (no symbols, constants, relations or structures)."""
    if not isinstance(ast, tuple) or not ast:
        return False
    if ast[0] == "num":
        return True
    if ast[0] not in _ARITH:
        return False
    return all(_is_arithmetic(a) for a in ast[1:] if isinstance(a, tuple))


class _Gold(NamedTuple):
    ast: Any  # None when the reference is not mathematics we parse; then it is compared as text
    key: str
    items: int  # how many values it lists (a prediction may give them in as many boxes)


@lru_cache(maxsize=16384)
def _parse_gold(reference: str) -> _Gold:
    raw = restore_escapes(reference)
    if "\\boxed" in raw or "\\fbox" in raw or "####" in raw or len(raw) > 300:  # a whole solution as gold
        raw = extract_answer(raw, gold=True)[0] or raw
    try:
        ast = parse_answer(raw)
    except (ParseError, RecursionError):
        return _Gold(None, text_key(raw), 1)
    return _Gold(ast, text_key(raw), len(ast[2]) if ast[0] == "seq" else 1)


class _Pending(NamedTuple):
    gold: Any
    pred: Any
    details: dict
    spent_s: float  # of the budget, before the sympy step


_UNIT_LETTERS = set("mcksgLlh")


def _is_unit(node) -> bool:
    """m, cm, m^2, km/h as the parser sees them glued to a number: products of unit letters."""
    if node[0] == "sym":
        return node[1] in _UNIT_LETTERS
    if node[0] in ("mul", "div"):
        return _is_unit(node[1]) and _is_unit(node[2])
    return node[0] == "pow" and _is_unit(node[1]) and node[2][0] == "num"


def _strip_glued_unit(pred):
    """1000.99m^2 -> 1000.99, 5cm -> 5; only used when the reference is a plain number, where a
    letter glued to the prediction's number cannot be a variable of the answer."""
    if pred[0] != "mul":
        return pred
    factors, node = [], pred
    while node[0] == "mul" and not _is_literal(node):
        factors.append(node[2])
        node = node[1]
    if _is_literal(node) and factors and all(_is_unit(f) for f in factors):
        return node
    return pred


def _has_symbol(node) -> bool:
    if node[:1] == ("sym",):
        return True
    return any(isinstance(c, tuple) and _has_symbol(c) for c in node)


def _key(reference: Any) -> str:
    """A reference as text that two equal references share (a task's reference may be a dict)."""
    if isinstance(reference, str):
        return reference
    try:
        return json.dumps(reference, sort_keys=True, default=repr)
    except (TypeError, ValueError):  # keys json cannot sort: the pair is simply not shared
        return f"{id(reference)}:{reference!r}"


class MathVerifier(BaseVerifier):
    name = "math"
    version = "1.1"  # 1.1: Math-Verify's test rows, locale numbers, ratios, sums, 1 s budget
    description = "Final answer (boxed / 'answer is' / last statement) equals the reference, exactly or by sympy."
    batches = True  # verify_batch is its own (the scorer reads per-call times from verdicts)
    Config = MathConfig

    def verify(self, completion: str, reference: Any) -> Verdict:
        step = self._guarded(self._prepare, completion, reference)
        return step if isinstance(step, Verdict) else self._guarded(self._symbolic, step)

    def verify_batch(self, completions: Sequence[str], references: Sequence[Any]) -> list[Verdict]:
        """Fast checks in this thread; the symbolic rest spread over the worker processes. A pair seen
        earlier in the batch is checked once: a verdict is a function of (completion, reference) alone,
        and a GRPO group repeats answers (45% of a tiny-arith step's 256, more as a policy sharpens)."""
        if len(completions) != len(references):
            raise ValueError(f"{len(completions)} completions but {len(references)} references")
        first: dict[tuple[str, str], int] = {}
        owner = [first.setdefault((str(c), _key(r)), j) for j, (c, r) in enumerate(zip(completions, references))]
        uniq = sorted(first.values())
        if len(uniq) < len(owner):
            verdicts = dict(zip(uniq, self._verify_unique([completions[j] for j in uniq],
                                                          [references[j] for j in uniq])))
            return [verdicts[j] if o == j else replace(verdicts[o], details=dict(verdicts[o].details))
                    for j, o in enumerate(owner)]
        return self._verify_unique(completions, references)

    def _verify_unique(self, completions: Sequence[str], references: Sequence[Any]) -> list[Verdict]:
        steps = [self._guarded(self._prepare, c, r) for c, r in zip(completions, references)]
        pending = [k for k, step in enumerate(steps) if not isinstance(step, Verdict)]
        if len(pending) > 1 and self.config.workers > 1:
            with ThreadPoolExecutor(min(self.config.workers, len(pending))) as pool:
                done = list(pool.map(lambda k: self._guarded(self._symbolic, steps[k]), pending))
        else:
            done = [self._guarded(self._symbolic, steps[k]) for k in pending]
        for k, verdict in zip(pending, done):
            steps[k] = verdict
        return steps

    @staticmethod
    def _guarded(fn, *args):
        try:
            return fn(*args)
        except Exception as e:  # a bug here must surface as an error, never as a silent 0
            return Verdict(0.0, Status.error, f"internal error: {type(e).__name__}: {e}")

    @property
    def _rules(self) -> DecimalRules:
        return DecimalRules(self.config.machine_digits, self.config.float_rounding)

    def _prepare(self, completion: Any, reference: Any) -> Verdict | _Pending:
        """Everything that needs no sympy: a final Verdict, or the pair left for the worker."""
        t0 = time.monotonic()
        if isinstance(reference, dict) and "answer" in reference:  # a task's reference: {answer, entry...}
            reference = reference["answer"]
        gold = _parse_gold(str(reference).strip())
        answer, how = extract_answer(str(completion), want=gold.items)
        if answer is None:
            return Verdict(0.0, Status.unparseable, how)
        details = {"answer": answer[:200], "found_by": how}
        if len(answer) > MAX_ANSWER_CHARS:
            return Verdict(0.0, Status.wrong, "answer too long", details)
        try:
            pred = parse_answer(answer)
        except (ParseError, RecursionError) as e:
            pred = None
            reason = f"could not parse answer ({e})"
        if gold.ast is None:  # a reference we cannot parse (base-5 numerals, odd notation): compare text
            if text_key(answer) == gold.key:
                return Verdict(1.0, Status.correct, "same text", details)
            return Verdict(0.0, Status.wrong, "different answer", details)
        if pred is None:  # malformed LaTeX against a mathematical reference
            return Verdict(0.0, Status.wrong, reason, details)
        if (not self.config.allow_unevaluated and _is_literal(gold.ast) and not _is_literal(pred)
                and _is_arithmetic(pred)):
            return Verdict(0.0, Status.wrong, "unevaluated arithmetic: the answer must be stated", details)
        if gold.ast[0] != "text" and not _has_symbol(gold.ast):
            pred = _strip_glued_unit(pred)
        try:
            ok, reason = compare(gold.ast, pred, ExactEq(self._rules))
        except NeedSympy:
            return _Pending(gold.ast, pred, details, time.monotonic() - t0)
        return Verdict(1.0 if ok else 0.0, Status.correct if ok else Status.wrong, reason, details)

    def _symbolic(self, step: _Pending) -> Verdict:
        cfg = self.config
        remaining = cfg.budget_s - step.spent_s - _RETURN_RESERVE_S
        if remaining <= 0:
            return Verdict(0.0, Status.timeout, f"parsing alone used the {cfg.budget_s:g}s budget", step.details)
        status, reason = get_pool(cfg.workers).check(
            step.gold, step.pred, self._rules, time.monotonic() + remaining, cfg.timeout_s, cfg.startup_timeout_s)
        return Verdict(1.0 if status == "correct" else 0.0, Status(status), reason, step.details)

    def warm_up(self) -> None:
        """Start the sympy workers and wait until one is ready (at most ``startup_timeout_s``), so that
        the budget holds from the first symbolic check on."""
        get_pool(self.config.workers).warm(self.config.startup_timeout_s)
