"""Spine placeholder: integer answers in the last \\boxed{} (the full sympy checker replaces this)."""
from __future__ import annotations

import re
from typing import Any

from .base import BaseVerifier, Status, Verdict

_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


class MathVerifier(BaseVerifier):
    name = "math"
    version = "0.1"
    description = "Integer answer in the last \\boxed{} compared with the reference."

    def verify(self, completion: str, reference: Any) -> Verdict:
        found = _BOXED.findall(completion)
        if not found:
            return Verdict(0.0, Status.unparseable, "no \\boxed{} answer")
        try:
            ok = int(found[-1].strip()) == int(str(reference).strip())
        except ValueError:
            return Verdict(0.0, Status.wrong, "answer is not an integer")
        return Verdict(1.0, Status.correct, "") if ok else Verdict(0.0, Status.wrong, "different value")
