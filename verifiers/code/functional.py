"""HumanEval-style tests, judged inside the jail, apart from the candidate.

The reference's ``prompt`` and ``test`` are code from a request or a dataset, so they are as untrusted
as the candidate: none of it runs in this process. One jail run (:data:`JUDGE`, ``_judge.py``) judges
one completion with two processes that share only a socket: the candidate's, forked before the tests
are read, which loads the completion and answers each call with a typed plain value (``values.py``);
and the judge's, which runs ``check(candidate)`` against a proxy whose every call is one round trip to
the candidate, and alone holds the run's stdout, where it writes the verdict. This process decides
the Verdict from that one line and from what the sandbox itself measured (:func:`verdict_of`).

What the candidate controls is only the plain values it returns: it cannot print a verdict (its
stdout is the jail's stderr), choose the judge's exit code, return an object that equals everything
(it arrives as an opaque marker whose every use fails), read ``check``'s frames or the tests (another
process, never in its memory), or take the judge's memory (not dumpable; ptrace, process_vm_* and
pidfd_getfd are denied). Killing or starving the judge ends the run without a verdict: a failure.
The judge's time is the run's: the whole check, candidate calls included, has ``timeout_s`` of wall
clock, enforced from outside the jail. Limitation: in-place changes to arguments are not observed.
"""
from __future__ import annotations

import ast
import inspect
import json
from pathlib import Path
from typing import Any

from sandbox import Harness, Result, Status as Run

from ..base import Status, Verdict
from . import values


def _without_docstrings(src: str) -> str:
    tree = ast.parse(src)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(body, list) and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return ast.unparse(tree)


# The jail gets only what it runs: the codec and the judge, without docstrings or comments: compiling
# it is part of every run's cost.
JUDGE = Harness(_without_docstrings(inspect.getsource(values) + Path(__file__).with_name("_judge.py").read_text()))
MAX_CALLS = 10_000  # calls one check may make (HumanEval's largest makes 105; each costs a round trip)


class ReferenceBroken(Exception):
    """The test code itself is unusable (our data problem, not the candidate's)."""


def check_parses(test_src: str, prompt: str) -> None:
    """Parse (never run) the reference here, so a broken one costs no jail run."""
    for what, src in (("test", test_src), ("prompt", prompt)):
        try:
            ast.parse(src)
        except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
            msg = e.msg if isinstance(e, SyntaxError) else type(e).__name__
            raise ReferenceBroken(f"{what} code does not parse: {msg}") from None


def judge_budget_s(timeout_s: float) -> float:
    """The judge's own deadline for the candidate's answers: a little under the run's wall clock, so a
    candidate that hangs is reported as such, not as a judge that ran out of time."""
    return max(timeout_s - min(0.5, 0.2 * timeout_s), timeout_s / 2)


def judge_input(code: str, prompt: str, test: str, entry_point: str, timeout_s: float) -> bytes:
    return json.dumps({"code": code, "prompt": prompt, "test": test, "entry_point": entry_point,
                       "budget_s": judge_budget_s(timeout_s), "max_calls": MAX_CALLS}).encode()


_VERDICT_KEYS = {"passed": bool, "kind": str, "reason": str, "calls": int}


def _verdict_line(stdout: bytes) -> dict[str, Any] | None:
    """The judge's one line, checked field by field (the candidate cannot write it; the test code can,
    and gets only what a malformed line gets)."""
    try:
        line = json.loads(stdout)
    except (ValueError, RecursionError):
        return None
    if type(line) is not dict:
        return None
    if set(line) == {"reference_error"} and type(line["reference_error"]) is str:
        return line
    if set(line) != set(_VERDICT_KEYS) or any(type(line[k]) is not t for k, t in _VERDICT_KEYS.items()):
        return None
    return line


def verdict_of(res: Result, timeout_s: float) -> Verdict:
    """The Verdict of one judge run: the judge's line, and the limits the sandbox saw hit."""
    details: dict[str, Any] = {"mode": "function", "jail_runs": 1}
    if res.status is Run.sandbox_error:
        return Verdict(0.0, Status.error, f"sandbox error: {res.reason}", details)
    line = _verdict_line(res.stdout)
    if line is not None and "reference_error" in line:
        return Verdict(0.0, Status.error, f"bad reference: {line['reference_error'][:500]}", details)
    if line is not None:
        details |= {"calls": line["calls"], **({"failure": line["kind"]} if line["kind"] else {})}
    if res.status is Run.ok and line is not None:
        if line["passed"]:
            return Verdict(1.0, Status.correct, f"check passed ({line['calls']} calls)", details)
        status = Status.timeout if line["kind"] == "timeout" else Status.wrong
        return Verdict(0.0, status, line["reason"][:500], details)
    why = f"; {line['reason'][:300]}" if line is not None and line["reason"] else ""
    if res.status is Run.timeout:
        who = ("" if line is not None
               else " in the judge (the check itself, or what the candidate returned, kept it busy)")
        limit = res.reason or f"timeout_s = {timeout_s:g} s"  # says so when a sandbox budget cut the run
        return Verdict(0.0, Status.timeout, f"the check ran out of time ({limit}){who}{why}",
                       {**details, "failure": details.get("failure", "timeout")})
    if res.status in (Run.memory_limit, Run.output_limit):
        return Verdict(0.0, Status.wrong, f"{res.reason}{why}", {**details, "failure": res.status.value})
    # the judge ended without a verdict: the candidate may signal it, the test code may exit: never a pass
    return Verdict(0.0, Status.wrong, f"the judge ended without a verdict ({res.reason or res.status.value}){why}",
                   {**details, "failure": "no_verdict"})


__all__ = ["JUDGE", "ReferenceBroken", "check_parses", "judge_input", "verdict_of"]
