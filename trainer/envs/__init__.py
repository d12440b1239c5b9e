"""What answers the model between the turns of an episode, besides the python tool (trainer/episodes.py).

An environment gets the model's answers (``acts_on = "answer"``: code repair runs them against public tests)
or its parsed tool calls (``"call"``: an HTTP environment steps on them) and gives back a :class:`Reply` per
episode: the text the model reads next (appended as tokens with loss 0), a typed outcome, whether the episode
is over, and a reward where the environment gives one. ``envs.build`` picks one by ``episodes.env.type``.
"""
from __future__ import annotations

from .base import Reply

__all__ = ["Reply", "build"]


def build(cfg, seed: int = 0):
    """The environment of ``episodes`` (None for the python tool, which trainer.episodes.Tools runs)."""
    kind = cfg.env.type
    if kind == "code_repair":
        from .repair import CodeRepair

        return CodeRepair(cfg.env)
    if kind == "http":
        from .http import HttpEnvironment

        return HttpEnvironment(cfg.env, cfg.format, seed)
    return None
