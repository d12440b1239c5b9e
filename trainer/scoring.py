"""Turn completions into rewards with the job's verifiers (weighted sum of verdict scores)."""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Sequence

from verifiers import get_verifier


@dataclass
class Scores:
    rewards: list[float]                      # (N,) weighted sum over verifiers
    correct: list[bool]                       # (N,) primary (first) verifier said `correct`
    per_verifier: dict[str, list[float]]      # name -> (N,) scores
    statuses: dict[str, Counter] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    verdicts: dict[str, list[Any]] = field(default_factory=dict)


class Scorer:
    def __init__(self, specs: Sequence[Any]):
        # specs: objects with .name, .weight, .config (trainer.config.VerifierSpec)
        self.entries = [(s.name, s.weight, get_verifier(s.name, s.config)) for s in specs]

    def __call__(self, completions: Sequence[str], references: Sequence[Any]) -> Scores:
        rewards = [0.0] * len(completions)
        out = Scores(rewards, [], {})
        for i, (name, weight, verifier) in enumerate(self.entries):
            t0 = time.perf_counter()
            verdicts = verifier.verify_batch(list(completions), list(references))
            out.seconds[name] = time.perf_counter() - t0
            out.per_verifier[name] = [v.score for v in verdicts]
            out.statuses[name] = Counter(v.status.value for v in verdicts)
            out.verdicts[name] = verdicts
            for j, v in enumerate(verdicts):
                rewards[j] += weight * v.score
            if i == 0:
                out.correct = [v.status.value == "correct" for v in verdicts]
        return out
