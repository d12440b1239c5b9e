"""``reasoning_gym``: reasoning-gym's own ``score_answer`` for its tasks, so our checker can be compared
with the generator's (bench/learning.py reports both).

The answer is read from the completion the way our math verifier reads it (``\\boxed{}``, an ``<answer>``
tag, "the answer is …"), then handed to the task's scorer with the generator's entry (the reference's
``entry``: question, answer, metadata with ``source_dataset``). Needs the ``reasoning-gym`` package.
"""
from __future__ import annotations

from typing import Any

from pydantic import Field

from .base import BaseVerifier, Status, Verdict, VerifierConfig


class ReasoningGymVerifier(BaseVerifier):
    name = "reasoning_gym"
    version = "1"
    description = "reasoning-gym's score_answer for the task that generated the problem (needs reasoning-gym)."

    class Config(VerifierConfig):
        correct_at: float = Field(1.0, ge=0, le=1, description="Scores at or above this are `correct`.")

    def __init__(self, config=None, **kwargs) -> None:
        super().__init__(config, **kwargs)
        try:
            import reasoning_gym  # noqa: F401
        except ImportError as e:
            raise ImportError("the reasoning_gym verifier needs the `reasoning-gym` package") from e
        self._fns: dict[str, Any] = {}

    def _fn(self, source: str):
        if source not in self._fns:
            from reasoning_gym import get_score_answer_fn

            self._fns[source] = get_score_answer_fn(source)
        return self._fns[source]

    def verify(self, completion: str, reference: Any) -> Verdict:
        from .math.extract import extract_answer

        try:
            entry = reference["entry"]
            fn = self._fn(entry["metadata"]["source_dataset"])
        except (TypeError, KeyError, ValueError) as e:
            return Verdict(0.0, Status.error, f"bad reference (needs a reasoning-gym entry): {e!r}")
        answer, _how = extract_answer(completion)
        if answer is None:
            return Verdict(0.0, Status.unparseable, "no answer")
        score = float(fn(answer, entry))
        ok = score >= self.config.correct_at
        return Verdict(score, Status.correct if ok else Status.wrong, f"reasoning-gym score {score:g}")
