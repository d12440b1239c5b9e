"""An rlvr verifier plugin: the fraction of required keywords that the completion mentions.

The reference is a list of keywords (or one string of comma-separated ones). Install the package into
the environment rlvr runs in and use it in a job spec as ``{"name": "keywords", "config": {...}}``.
"""
from __future__ import annotations

import re
from typing import Any

from pydantic import Field

from verifiers import BaseVerifier, Status, Verdict, VerifierConfig


class KeywordVerifier(BaseVerifier):
    name = "keywords"
    version = "0.1.0"
    description = "Fraction of the reference's keywords found in the completion (whole words)."

    class Config(VerifierConfig):
        ignore_case: bool = True
        all_required: bool = Field(False, description="Score 1 only if every keyword is present, else 0.")

    config: Config

    def verify(self, completion: str, reference: Any) -> Verdict:
        words = [w.strip() for w in reference.split(",")] if isinstance(reference, str) else list(reference or [])
        words = [w for w in words if w]
        if not words:
            return Verdict(0.0, Status.error, "reference has no keywords")
        flags = re.IGNORECASE if self.config.ignore_case else 0
        found = [w for w in words if re.search(rf"\b{re.escape(w)}\b", completion or "", flags)]
        frac = len(found) / len(words)
        score = float(frac == 1.0) if self.config.all_required else frac
        status = Status.correct if frac == 1.0 else Status.wrong
        return Verdict(score, status, f"{len(found)}/{len(words)} keywords", {"found": found})
