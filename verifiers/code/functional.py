"""HumanEval-style tests judged outside the jail.

The dataset's ``check(candidate)`` is trusted code; the candidate is not. So ``check`` runs HERE, in the
trusted process, against a proxy ``candidate`` whose answers are plain values recorded in the jail:

1. Run ``check`` with the proxy. A call whose result is not known yet returns a :class:`Pending`
   placeholder and the run continues speculatively: its ``assert`` statements (rewritten into calls of
   :func:`_Judge.check_assert`) no longer stop it, so one pass collects the arguments of every call
   whose arguments do not depend on earlier results.
2. Run the collected calls in one jail run (``_harness.py``): each result comes back as a typed value.
3. Run ``check`` again with those results. A pass where every call had a recorded result is the
   verdict; a call with a new argument list (arguments that depended on results) repeats 2-3.

What the candidate controls is only the list of returned plain values: it cannot print a verdict,
choose the exit code, return an object that equals everything, touch ``check``'s frames, or read the
tests (they never leave this process). Limitation: in-place changes to arguments are not observed.
"""
from __future__ import annotations

import ast
import inspect
import json
import random
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .values import MAX_DEPTH, Opaque, OpaqueValueUsed, decode, encode

# The jail gets only what it runs: the codec's two functions (decode never meets an opaque marker there)
# and the harness, without docstrings or comments: compiling it is part of every run's cost.
HARNESS = ast.unparse(ast.parse(
    "import base64\nimport math\nMAX_DEPTH = %d\nOpaque = str\n" % MAX_DEPTH
    + inspect.getsource(encode) + inspect.getsource(decode)
    + Path(__file__).with_name("_harness.py").read_text()))
_random_lock = threading.Lock()


class NeedResults(BaseException):
    """Speculation cannot go on: results must come from the jail first."""


class CandidateFailed(BaseException):
    """The candidate crashed, timed out or gave a malformed answer on this call (not catchable by check)."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind


class CheckTimeout(BaseException):
    """``check`` ran past its budget here (a returned value can drive its loops: 10**18 iterations...)."""


class ReferenceBroken(Exception):
    """The test code itself is unusable (our data problem, not the candidate's)."""


class Pending:
    """The not-yet-known result of a call during speculation: compares equal, is truthy, and any other
    use stops speculation."""

    def __eq__(self, other: object) -> bool:
        return True

    def __ne__(self, other: object) -> bool:
        return False

    def __bool__(self) -> bool:
        return True

    __hash__ = None  # type: ignore[assignment]

    def __getattr__(self, name: str) -> Any:
        raise NeedResults(name)


class _AssertRewriter(ast.NodeTransformer):
    """``assert t, m`` -> ``__rlvr_assert__(lambda: t, lambda: m)`` so speculation can step over it."""

    def visit_Assert(self, node: ast.Assert) -> ast.AST:
        self.generic_visit(node)
        noargs = ast.arguments(posonlyargs=[], args=[], vararg=None, kwonlyargs=[], kw_defaults=[],
                               kwarg=None, defaults=[])
        msg = ast.Lambda(args=noargs, body=node.msg) if node.msg else ast.Constant(None)
        call = ast.Call(func=ast.Name("__rlvr_assert__", ast.Load()),
                        args=[ast.Lambda(args=noargs, body=node.test), msg], keywords=[])
        return ast.copy_location(ast.Expr(call), node)


def compile_check(test_src: str) -> Any:
    try:
        tree = _AssertRewriter().visit(ast.parse(test_src))
        return compile(ast.fix_missing_locations(tree), "<check>", "exec")
    except SyntaxError as e:
        raise ReferenceBroken(f"test code does not parse: {e}") from e


def _key(args: tuple, kwargs: dict) -> str:
    enc = encode([list(args), kwargs])
    text = json.dumps(enc, sort_keys=True)
    if '"o"' in text and _has_opaque(enc):
        if any(isinstance(a, Opaque) for a in (*args, *kwargs.values())):
            raise OpaqueValueUsed("a non-plain result was passed back to the candidate")
        raise NeedResults("argument is not a plain value")
    return text


def _has_opaque(j: Any) -> bool:
    if isinstance(j, dict):
        return "o" in j or any(_has_opaque(v) for v in j.values())
    if isinstance(j, list):
        return any(_has_opaque(v) for v in j)
    return False


@dataclass(frozen=True)
class Died:
    """The call the jail run stopped at (timeout, memory_limit, crashed...): recorded by the judge."""

    kind: str
    detail: str


@dataclass
class _Judge:
    known: list[tuple[str, Any]]           # (call key, encoded answer line) from the last jail run
    calls: list[str] = field(default_factory=list)
    speculative: bool = False

    def candidate(self, *args: Any, **kwargs: Any) -> Any:
        try:
            key = _key(args, kwargs)
        except NeedResults:
            if self.speculative:
                raise
            raise ReferenceBroken("check passed a non-plain argument to the candidate") from None
        i = len(self.calls)
        self.calls.append(key)
        if i < len(self.known) and self.known[i][0] == key:
            return self._answer(self.known[i][1])
        self.speculative = True
        return Pending()

    @staticmethod
    def _answer(line: Any) -> Any:
        if isinstance(line, Died):  # made here, never parsed from the jail's output
            raise CandidateFailed(line.kind, line.detail)
        if isinstance(line, dict) and len(line) == 1:
            if "ok" in line:
                try:
                    return decode(line["ok"])
                except (ValueError, TypeError, OverflowError, OpaqueValueUsed) as e:
                    raise CandidateFailed("malformed", f"unreadable result: {e}") from None
            if "exc" in line and isinstance(line["exc"], str):
                raise CandidateFailed("exception", f"candidate raised {line['exc'][:100]}")
        raise CandidateFailed("malformed", f"unexpected answer {str(line)[:100]}")

    def check_assert(self, test: Callable[[], Any], msg: Any) -> None:
        try:
            ok = bool(test())
        except (NeedResults, CandidateFailed, OpaqueValueUsed):
            raise
        except Exception:
            if self.speculative:
                return  # the failure may be due to a Pending value: keep collecting calls
            raise
        if not ok and not self.speculative:
            raise AssertionError(msg() if callable(msg) else "assertion failed")


@dataclass
class Outcome:
    passed: bool | None           # None: results needed for ``calls``
    calls: list[str]
    reason: str = ""
    failure_kind: str = ""        # "timeout", "exception", "malformed", "assertion", ...


def _deadline_tracer(budget_s: float) -> Callable[..., Any]:
    """A trace function that raises :class:`CheckTimeout` once ``budget_s`` has passed (checked on each
    traced line; no signals, so it works off the main thread)."""
    deadline = time.monotonic() + budget_s

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        if time.monotonic() > deadline:
            raise CheckTimeout(f"check ran past {budget_s}s in the judge")
        return tracer

    return tracer


def run_check(code_obj: Any, prompt: str, entry_point: str, known: list[tuple[str, Any]],
              budget_s: float = 10.0) -> Outcome:
    """One pass of ``check`` in this (trusted) process against the recorded answers ``known``."""
    judge = _Judge(known)
    ns: dict[str, Any] = {"__name__": "__check__", "__rlvr_assert__": judge.check_assert}
    with _random_lock:  # unseeded random in a check must draw the same arguments on every pass
        state = random.getstate()
        random.seed(1234)
        try:
            if prompt:
                try:
                    exec(compile(prompt, "<prompt>", "exec"), ns)
                except Exception as e:
                    raise ReferenceBroken(f"prompt code failed: {type(e).__name__}: {e}") from e
            # Some checks call the function by its name (HumanEval/33): that is the candidate too.
            ns[entry_point] = judge.candidate
            exec(code_obj, ns)
            check = ns.get("check")
            if not callable(check):
                raise ReferenceBroken("test code defines no check(candidate)")
            old_trace = sys.gettrace()
            sys.settrace(_deadline_tracer(budget_s))
            try:
                check(judge.candidate)
            finally:
                sys.settrace(old_trace)
            error: BaseException | None = None
        except ReferenceBroken:
            raise
        except BaseException as e:  # noqa: BLE001 - the verdict on this pass
            if isinstance(e, KeyboardInterrupt):
                raise
            error = e  # incl. MemoryError: a returned value can make check allocate without bound
        finally:
            random.setstate(state)
    if judge.speculative:
        return Outcome(None, judge.calls)
    if error is None:
        return Outcome(True, judge.calls)
    if isinstance(error, CheckTimeout):
        return Outcome(False, judge.calls, str(error), "timeout")
    kind = error.kind if isinstance(error, CandidateFailed) else (
        "assertion" if isinstance(error, AssertionError) else "opaque" if isinstance(error, OpaqueValueUsed)
        else "check_error")
    return Outcome(False, judge.calls, f"{type(error).__name__}: {str(error)[:300]}", kind)


def harness_input(code: str, entry_point: str, calls: list[str]) -> str:
    return json.dumps({"code": code, "entry_point": entry_point,
                       "calls": [json.loads(k) for k in calls]})


def parse_answers(stdout: bytes, n_calls: int) -> tuple[list[Any], str]:
    """Answer lines from the jail -> (answers, load error or ""); never trusts more than n_calls lines."""
    answers: list[Any] = []
    for raw in stdout.splitlines()[: n_calls + 1]:
        try:
            line = json.loads(raw)
        except ValueError:
            return answers, "" if answers else "unreadable harness output"
        if isinstance(line, dict) and set(line) == {"load_error"}:
            return [], str(line["load_error"])[:500]
        answers.append(line)
    return answers[:n_calls], ""


__all__ = ["Died", "HARNESS", "Outcome", "run_check", "compile_check", "harness_input", "parse_answers",
           "ReferenceBroken", "Opaque"]
