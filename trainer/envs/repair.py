"""Code repair from test feedback (``episodes.env.type: code_repair``, tasks builtin:code_repair[_tiny]).

The model answers with code; the answer runs against the problem's *public* tests in the jail, judged like
any code verdict (``verifiers.code``: the candidate's prints, exit code or files decide nothing); when one
fails, its message (the call, what came back, what was expected; or the error) is the next observation and
the model writes again, up to ``max_turns``. An answer that passes the public tests ends the episode. The
reward is the job's verifiers on the FINAL answer only — the hidden tests, in the jail — so a program that
prints "PASS" or breaks test collection earns nothing, and an early answer's luck counts for nothing either.
Each model turn records whether it passed the public tests (``public``), for the fix rate.
"""
from __future__ import annotations

import time

from .base import Reply

FEEDBACK = "The tests failed:\n{why}\nFix the function. Reply with the complete code in one ```python block.\n"


class CodeRepair:
    acts_on = "answer"
    judged = "final"        # the verifiers judge the last answer alone
    schema = None           # no tool for the chat template to describe
    role = "user"           # feedback comes back as a user turn

    def __init__(self, cfg):
        from verifiers.code.verifier import CodeVerifier

        self.verifier = CodeVerifier(CodeVerifier.Config(timeout_s=cfg.timeout_s, memory_mb=cfg.memory_mb))

    def open(self, episodes) -> None:
        for e in episodes:
            if not isinstance(e.reference, dict) or "public" not in e.reference:
                raise ValueError("episodes.env code_repair needs problems with public tests (reference['public']): "
                                 "use builtin:code_repair or builtin:code_repair_tiny, or add them to your data")

    def step(self, items: list[tuple[object, str]]) -> list[Reply]:
        """Each (episode, answer): its public tests' verdict as a Reply (retried once on a sandbox failure)."""
        t0 = time.perf_counter()
        refs = [e.reference["public"] for e, _ in items]
        verdicts = self.verifier.verify_batch([a for _, a in items], refs)
        again = [i for i, v in enumerate(verdicts) if v.status.value == "error"]
        if again:
            for i, v in zip(again, self.verifier.verify_batch([items[i][1] for i in again], [refs[i] for i in again])):
                verdicts[i] = v
        s = (time.perf_counter() - t0) / max(1, len(items))
        out = []
        for (_, _a), ref, v in zip(items, refs, verdicts):
            if v.status.value == "error":  # the jail (or the reference) failed: nothing to judge the answer by
                out.append(Reply("", "infra_error", True, seconds=s))
            elif v.status.value == "correct":
                out.append(Reply("", "ok", True, seconds=s))
            else:
                outcome = "timeout" if v.status.value == "timeout" else "tool_error"
                out.append(Reply(FEEDBACK.format(why=_why(v, ref)), outcome, False, seconds=s))
        return out

    def close(self, episodes) -> None:
        pass


def _why(v, ref) -> str:
    """A failed verdict as the model reads it: the judge's reason (function tests name the call, what came
    back and what was expected); for stdin/stdout tests also the failing test's input, expected output and
    the program's stderr tail (public tests: the model may see them)."""
    first = (v.details or {}).get("first_failure")
    if not first or "tests" not in ref:
        return v.reason
    t = ref["tests"][first["test"]]
    tail = f"\nstderr: {first['stderr_tail'].strip()}" if first.get("stderr_tail", "").strip() else ""
    return f"{v.reason}\ninput: {t.get('stdin', '')!r}\nexpected output: {t['stdout']!r}{tail}"
