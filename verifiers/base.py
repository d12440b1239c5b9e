"""The one shape every verifier shares.

A verifier takes a model ``completion`` (text) and the dataset's ``reference`` for that prompt
(a bare gold answer string for math, a dict of tests for code, anything JSON for plugins) and
returns one :class:`Verdict`. Scores are floats in [0, 1] unless a verifier documents otherwise.
"""
from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, Protocol, Sequence, runtime_checkable

from pydantic import BaseModel, ConfigDict


class Status(str, enum.Enum):
    correct = "correct"          # the completion reaches the reference answer / passes
    wrong = "wrong"              # an answer was found and judged, and it is not right
    unparseable = "unparseable"  # no answer could be extracted from the completion
    timeout = "timeout"          # the check ran out of its time budget
    error = "error"              # infrastructure failure (sandbox down, bug): never silently a 0


@dataclass(frozen=True)
class Verdict:
    score: float
    status: Status
    reason: str = ""
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["status"] = self.status.value
        return d


class VerifierConfig(BaseModel):
    """Base for each verifier's own small config (unknown keys are an error, not ignored)."""

    model_config = ConfigDict(extra="forbid")


def sandbox_seconds(verifier: Any, reference: Any) -> float:
    """:meth:`BaseVerifier.sandbox_seconds` of any verifier (a plugin without it: 0, and the sandbox's
    own budget still meters whatever it runs)."""
    fn = getattr(verifier, "sandbox_seconds", None)
    return float(fn(reference)) if callable(fn) else 0.0


@runtime_checkable
class Verifier(Protocol):
    name: ClassVar[str]
    version: ClassVar[str]
    description: ClassVar[str]

    batches: ClassVar[bool]  # verify_batch does more than call verify in a loop (the scorer then times each call)

    def verify(self, completion: str, reference: Any) -> Verdict: ...

    def verify_batch(self, completions: Sequence[str], references: Sequence[Any]) -> list[Verdict]: ...

    def warm_up(self) -> None:
        """Start what the first check needs (worker processes, jails), so it is held to its time budget."""


class BaseVerifier:
    """Convenience base: a ``Config`` model, a stored config, a sequential batch method, nothing to warm up."""

    name: ClassVar[str] = "base"
    version: ClassVar[str] = "0"
    description: ClassVar[str] = ""
    batches: ClassVar[bool] = False  # a subclass with its own verify_batch sets True
    Config: ClassVar[type[VerifierConfig]] = VerifierConfig

    def __init__(self, config: VerifierConfig | dict | None = None, **kwargs: Any) -> None:
        if config is None or isinstance(config, dict):
            config = self.Config(**{**(config or {}), **kwargs})
        self.config = config

    def verify(self, completion: str, reference: Any) -> Verdict:  # pragma: no cover - abstract
        raise NotImplementedError

    def sandbox_seconds(self, reference: Any) -> float:
        """The most jail wall-clock seconds one ``verify`` against ``reference`` may spend (what a caller
        budgets for; the sandbox's own budget holds it to that). Default: none (runs nothing jailed)."""
        return 0.0

    def verify_batch(self, completions: Sequence[str], references: Sequence[Any]) -> list[Verdict]:
        if len(completions) != len(references):
            raise ValueError(f"{len(completions)} completions but {len(references)} references")
        return [self.verify(c, r) for c, r in zip(completions, references)]

    def warm_up(self) -> None:
        pass
