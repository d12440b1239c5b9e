"""What an environment answers a turn with (trainer.envs)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Reply:
    text: str                    # what the model reads next ("" when the episode is over)
    outcome: str                 # ok | tool_error | timeout | infra_error (trainer.episodes.OUTCOMES)
    done: bool
    reward: float | None = None  # the environment's reward for this step, if it gives one
    seconds: float = 0.0
