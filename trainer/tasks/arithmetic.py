"""The bundled tiny model's task: two-operand sums and differences (operands 0-50), asked as ``a+b``."""
from __future__ import annotations

from .base import Task


def _load(cfg):
    from ..data import arithmetic_split

    return arithmetic_split(cfg.eval_size, seed=cfg.seed)


TASKS = [Task("arithmetic", "a+b / a-b with operands 0-50, the tiny model's task (no instruction: its "
              "SFT format is the bare question)", _load, shot_answer=lambda s: f"\\boxed{{{s['reference']}}}",
              verifiers=[{"name": "math", "config": {"allow_unevaluated": False}}])]
