"""How a job (or a ``multi`` verifier) names a verifier: one definition for both."""
from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field

from .base import VerifierConfig


class VerifierSpec(VerifierConfig):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: str = Field(..., min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:\-]+$",
                      description="A registered verifier (GET /v1/verifiers): built-in, plugin, or registered over "
                                  "HTTP.")
    weight: float = Field(1.0, ge=-100, le=100, description="Its score's weight in the reward (a weighted sum over "
                          "the job's verifiers; in `multi` without a formula, over the sub-verifiers).")
    config: dict[str, Any] = Field(default_factory=dict, description="The verifier's own settings (its config "
                                   "schema is in GET /v1/verifiers); unknown keys are refused.")
    version: int | None = Field(None, ge=1, le=2**31 - 1, description="Pins an HTTP-registered verifier's "
                                "version (default: the latest at submission, recorded in the job).")
