"""text_similarity: how close the completion is to the reference text (OpenAI's fuzzy_match).

Score = normalised Indel similarity in [0, 1]: 2·LCS(a, b) / (|a| + |b|), rapidfuzz's ``fuzz.ratio`` / 100
(rapidfuzz is a dependency, not optional: difflib's ratio is a heuristic that can score lower for the same
pair, so a fallback would make rewards depend on what happens to be installed). ``correct`` when the
score reaches ``pass_threshold``.
"""
from __future__ import annotations

from typing import Any

from pydantic import Field

from .base import BaseVerifier, Status, Verdict, VerifierConfig


def fuzzy_ratio(a: str, b: str) -> float:
    from rapidfuzz import fuzz  # imported here: `import verifiers` stays light

    return fuzz.ratio(a, b) / 100.0


class TextSimilarityVerifier(BaseVerifier):
    name = "text_similarity"
    version = "1"
    description = "Fuzzy similarity of the completion to the reference text, in [0, 1]."

    class Config(VerifierConfig):
        pass_threshold: float = Field(1.0, ge=0.0, le=1.0, description="Score at or above this is `correct`.")
        ignore_case: bool = False
        max_chars: int = Field(20_000, ge=1, le=1_000_000, description="Longer texts are cut (bounded time).")

    config: Config

    def verify(self, completion: str, reference: Any) -> Verdict:
        if not isinstance(reference, str):
            return Verdict(0.0, Status.error, f"reference must be a string, not {type(reference).__name__}")
        a, b = (completion or "").strip()[: self.config.max_chars], reference.strip()[: self.config.max_chars]
        if self.config.ignore_case:
            a, b = a.casefold(), b.casefold()
        score = fuzzy_ratio(a, b)
        ok = score >= self.config.pass_threshold
        return Verdict(score, Status.correct if ok else Status.wrong, f"similarity {score:.3f}")
