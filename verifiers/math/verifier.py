"""MathVerifier: does a completion reach the reference's mathematical answer?

Pipeline: extract the final answer (extract.py) -> normalise and parse both sides to a tuple AST
(normalize.py, latex.py; the gold once per process, cached) -> compare shapes (structure.py) with
exact fractions in this process -> only if that cannot decide, sympy in a killable worker process
(worker.py, symbolic.py) under ``timeout_s``. Ordinary numeric answers never leave this process
and never import sympy.

    >>> MathVerifier().verify("so the total is \\\\boxed{19}", "19").status
    <Status.correct: 'correct'>
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from typing import Any, NamedTuple, Sequence

from pydantic import Field

from ..base import BaseVerifier, Status, Verdict, VerifierConfig
from .extract import extract_answer
from .latex import ParseError
from .normalize import MAX_ANSWER_CHARS, parse_answer, text_key
from .structure import ExactEq, NeedSympy, compare
from .worker import get_pool


class MathConfig(VerifierConfig):
    timeout_s: float = Field(0.75, gt=0, le=60, description="hard budget for the sympy part of one check")
    workers: int = Field(2, ge=1, le=32, description="sympy worker processes in this process's shared pool "
                         "(the first verifier built sizes it); the second one is a warm spare after a kill")
    startup_timeout_s: float = Field(30.0, gt=0, description="wait for a free or starting worker")
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


@lru_cache(maxsize=16384)
def _parse_gold(reference: str) -> _Gold:
    raw = reference
    if "\\boxed" in raw or "\\fbox" in raw or "####" in raw or len(raw) > 300:  # a whole solution as gold
        raw = extract_answer(raw)[0] or raw
    try:
        return _Gold(parse_answer(raw), text_key(raw))
    except (ParseError, RecursionError):
        return _Gold(None, text_key(raw))


class _Pending(NamedTuple):
    gold: Any
    pred: Any
    details: dict


_EXACT = ExactEq()


class MathVerifier(BaseVerifier):
    name = "math"
    version = "1.0"
    description = "Final answer (boxed / 'answer is' / last statement) equals the reference, exactly or by sympy."
    Config = MathConfig

    def verify(self, completion: str, reference: Any) -> Verdict:
        step = self._guarded(self._prepare, completion, reference)
        return step if isinstance(step, Verdict) else self._guarded(self._symbolic, step)

    def verify_batch(self, completions: Sequence[str], references: Sequence[Any]) -> list[Verdict]:
        """Fast checks in this thread; the symbolic rest spread over the worker processes."""
        if len(completions) != len(references):
            raise ValueError(f"{len(completions)} completions but {len(references)} references")
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

    def _prepare(self, completion: Any, reference: Any) -> Verdict | _Pending:
        """Everything that needs no sympy: a final Verdict, or the pair left for the worker."""
        gold = _parse_gold(str(reference).strip())
        answer, how = extract_answer(str(completion))
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
        try:
            ok, reason = compare(gold.ast, pred, _EXACT)
        except NeedSympy:
            return _Pending(gold.ast, pred, details)
        return Verdict(1.0 if ok else 0.0, Status.correct if ok else Status.wrong, reason, details)

    def _symbolic(self, step: _Pending) -> Verdict:
        cfg = self.config
        status, reason = get_pool(cfg.workers).check(step.gold, step.pred, cfg.timeout_s, cfg.startup_timeout_s)
        return Verdict(1.0 if status == "correct" else 0.0, Status(status), reason, step.details)

    def warm_up(self) -> None:
        """Start a sympy worker now so that the first symbolic check does not wait for it."""
        get_pool(self.config.workers).warm()
