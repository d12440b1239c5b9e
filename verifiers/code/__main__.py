"""``python -m verifiers.code SOLUTION_FILE TESTS_FILE [--entry-point NAME] [--timeout S]``.

TESTS_FILE is either a JSON reference (see ``verifier.py``) or a Python file defining
``check(candidate)`` (then ``--entry-point`` is required). Prints the Verdict as JSON; exits 0 iff the
solution passes, 1 if it does not, 2 on an error (bad tests, sandbox failure).
"""
from __future__ import annotations

import argparse
import json
import sys

from ..base import Status
from .verifier import CodeVerifier


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m verifiers.code", description=__doc__.split("\n\n")[0])
    ap.add_argument("solution", help="completion or program file (fenced blocks are extracted)")
    ap.add_argument("tests", help="JSON reference file, or a .py file defining check(candidate)")
    ap.add_argument("--entry-point", help="function name for check(candidate) tests")
    ap.add_argument("--timeout", type=float, default=10.0, help="wall clock seconds per sandbox run")
    ap.add_argument("--backend", choices=["local", "docker"], default="local")
    a = ap.parse_args(argv)
    with open(a.solution, encoding="utf-8") as f:
        completion = f.read()
    with open(a.tests, encoding="utf-8") as f:
        tests = f.read()
    reference: object
    if a.tests.endswith(".json"):
        reference = json.loads(tests)
        if a.entry_point and isinstance(reference, dict):
            reference["entry_point"] = a.entry_point
    else:
        if not a.entry_point:
            ap.error("--entry-point is required with a check(candidate) test file")
        reference = {"test": tests, "entry_point": a.entry_point}
    verdict = CodeVerifier(backend=a.backend, timeout_s=a.timeout).verify(completion, reference)
    json.dump(verdict.to_dict(), sys.stdout, indent=2)
    sys.stdout.write("\n")
    if verdict.status is Status.correct:
        return 0
    return 2 if verdict.status is Status.error else 1


if __name__ == "__main__":
    sys.exit(main())
