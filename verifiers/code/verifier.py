"""The ``code`` verifier: run a completion's program in the sandbox, judge it where it cannot reach.

Reference schema (a dict, or the same as a JSON string; extra keys such as ``task_id`` are ignored):

* stdin/stdout tests: ``{"tests": [{"stdin": "1 2\\n", "stdout": "3\\n"}, ...]}``. The program passes a
  test when it exits 0 within the limits and its stdout equals the expected one up to trailing
  whitespace on each line and trailing blank lines.
* function tests (HumanEval): ``{"test": "def check(candidate):\\n    assert candidate(1) == 2",
  "entry_point": "f", "prompt": "<optional code the completion continues>"}``. ``prompt`` and ``test`` are
  as untrusted as the completion: ``check`` runs in the jail too, in a process of its own that the
  candidate cannot reach, against plain results (see ``functional.py``); one jail run per verdict.

Programs run on the jail's Python (by default the one running rlvr) with its standard library only
(no numpy in the jail).

Statuses: correct (all pass, score 1), wrong (score 0, or the passed fraction for stdin/stdout tests
with ``partial_credit``), unparseable (no code or a syntax error), timeout, error (sandbox failure or a
broken reference: never a silent 0-as-wrong).
"""
from __future__ import annotations

import ast
import contextvars
import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal, Sequence

from pydantic import BaseModel, ConfigDict, Field, ValidationError

import sandbox
from sandbox import Limits, Result, Status as RunStatus

from ..base import BaseVerifier, Status, Verdict, VerifierConfig
from . import functional
from .extract import assemble, extract_code


class StdioTest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    stdin: str = ""
    stdout: str


MAX_TESTS = 1024  # stdin/stdout tests per reference: each is a jail run of every completion judged


class StdioReference(BaseModel):
    model_config = ConfigDict(extra="ignore")
    tests: list[StdioTest] = Field(min_length=1, max_length=MAX_TESTS)


class FunctionReference(BaseModel):
    model_config = ConfigDict(extra="ignore")
    test: str
    entry_point: str = Field(pattern=r"^[A-Za-z_]\w*$")
    prompt: str = ""


def parse_reference(reference: Any) -> StdioReference | FunctionReference:
    if isinstance(reference, (str, bytes)):
        try:
            reference = json.loads(reference)
        except RecursionError:  # a JSON string nested past the decoder's recursion: a ValueError like the rest
            raise ValueError("reference JSON is nested too deeply") from None
    if not isinstance(reference, dict):
        raise ValueError(f"reference must be a dict or JSON object, not {type(reference).__name__}")
    if "tests" in reference:
        return StdioReference.model_validate(reference)
    if "test" in reference:
        return FunctionReference.model_validate(reference)
    raise ValueError("reference needs 'tests' (stdin/stdout pairs) or 'test' + 'entry_point' (check function)")


def _norm(out: str) -> str:
    return "\n".join(line.rstrip() for line in out.strip("\n").splitlines()).rstrip()


class CodeVerifier(BaseVerifier):
    name = "code"
    version = "1"
    description = "Runs the completion's Python program in the sandbox; stdin/stdout or HumanEval tests."
    batches = True  # verify_batch is its own (the scorer reads per-call times from verdicts)

    class Config(VerifierConfig):
        backend: Literal["local", "docker"] = "local"
        # every bound is a cost someone else's dry run or job could otherwise push on the pool
        timeout_s: float = Field(10.0, gt=0, le=60, description="Wall clock of one sandbox run: per stdin/stdout "
                                 "test, and for function tests the whole check (candidate calls included).")
        memory_mb: int = Field(256, ge=16, le=4096, description="Memory of one run (the jail's cgroup limit).")
        max_output_bytes: int = Field(1 << 20, ge=1024, le=16 << 20, description="stdout + stderr of one run.")
        partial_credit: bool = False
        max_rounds: int = Field(8, ge=1, le=64, description="Accepted for older specs and ignored: a function-test "
                                "verdict is one jail run since the judge runs in the jail.")

    config: Config

    def _limits(self) -> Limits:
        c = self.config
        return Limits(wall_s=c.timeout_s, memory_mb=c.memory_mb, max_output_bytes=c.max_output_bytes)

    def verify(self, completion: str, reference: Any) -> Verdict:
        try:
            ref = parse_reference(reference)
        except (ValueError, ValidationError) as e:
            return Verdict(0.0, Status.error, f"bad reference: {str(e)[:300]}")
        entry = ref.entry_point if isinstance(ref, FunctionReference) else None
        code = extract_code(completion or "", entry)
        if not code.strip():
            return Verdict(0.0, Status.unparseable, "no code found in the completion")
        if isinstance(ref, FunctionReference):
            code = assemble(code, ref.prompt, ref.entry_point)
        try:
            ast.parse(code)  # parsing runs nothing; a syntax error is reported without a jail run
        except SyntaxError as e:
            return Verdict(0.0, Status.unparseable, f"syntax error: {e.msg} (line {e.lineno})")
        except (RecursionError, MemoryError, ValueError) as e:  # the completion's doing, not an infrastructure error
            return Verdict(0.0, Status.unparseable, f"the program cannot be parsed ({type(e).__name__})")
        if isinstance(ref, StdioReference):
            return self._stdio(code, ref)
        return self._function(code, ref)

    def sandbox_seconds(self, reference: Any) -> float:
        """stdin/stdout tests: one run of up to ``timeout_s`` per test; function tests: one run."""
        try:
            ref = parse_reference(reference)
        except (ValueError, ValidationError):
            return 0.0  # a bad reference runs nothing
        return sandbox.run_cost(self.config.timeout_s) * (len(ref.tests) if isinstance(ref, StdioReference) else 1)

    def verify_batch(self, completions: Sequence[str], references: Sequence[Any]) -> list[Verdict]:
        if len(completions) != len(references):
            raise ValueError(f"{len(completions)} completions but {len(references)} references")
        if not completions:
            return []
        # Each verify blocks on the sandbox pool; a few threads per jail keep every jail busy. Each runs in
        # a copy of the caller's context, so the caller's sandbox lane and budget hold in those threads too.
        ctxs = [contextvars.copy_context() for _ in completions]
        with ThreadPoolExecutor(min(len(completions), 4 * _pool_size(self.config.backend))) as ex:
            return list(ex.map(lambda ctx, c, r: ctx.run(self.verify, c, r), ctxs, completions, references))

    # -- stdin/stdout ---------------------------------------------------------------------------------
    def _stdio(self, code: str, ref: StdioReference) -> Verdict:
        results = sandbox.run_many([(code, t.stdin) for t in ref.tests], self._limits(), self.config.backend)
        errors = [r for r in results if r.status is RunStatus.sandbox_error]
        if errors:
            return Verdict(0.0, Status.error, f"sandbox error: {errors[0].reason}", {"sandbox_errors": len(errors)})
        passed = [r.status is RunStatus.ok and _norm(r.stdout.decode("utf-8", "replace")) == _norm(t.stdout)
                  for r, t in zip(results, ref.tests)]
        n, k = len(passed), sum(passed)
        details: dict[str, Any] = {"mode": "stdio", "passed": k, "total": n}
        if k == n:
            return Verdict(1.0, Status.correct, f"{n}/{n} tests passed", details)
        i = passed.index(False)
        first: Result = results[i]
        details["first_failure"] = {"test": i, "run_status": first.status.value, "reason": first.reason,
                                    "stderr_tail": first.stderr[-300:].decode("utf-8", "replace")}
        status = Status.timeout if first.status is RunStatus.timeout else Status.wrong
        why = first.reason if first.status is not RunStatus.ok else "wrong output"
        score = k / n if self.config.partial_credit else 0.0
        return Verdict(score, status, f"test {i} failed: {why}; {k}/{n} passed", details)

    # -- function tests (HumanEval) -------------------------------------------------------------------
    def _function(self, code: str, ref: FunctionReference) -> Verdict:
        try:
            functional.check_parses(ref.test, ref.prompt)
        except functional.ReferenceBroken as e:
            return Verdict(0.0, Status.error, f"bad reference: {e}")
        stdin = functional.judge_input(code, ref.prompt, ref.test, ref.entry_point, self.config.timeout_s)
        res = sandbox.run(functional.JUDGE, stdin, self._limits(), self.config.backend)
        return functional.verdict_of(res, self.config.timeout_s)


def _pool_size(backend: str) -> int:
    try:
        return sandbox.get_backend(backend).size
    except sandbox.SandboxError:
        return 1
