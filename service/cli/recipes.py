"""Recipes by name: the job specs in examples/jobs/ (shipped in the package as service/cli/recipes/, a link
to that folder), written once. `rlvr demo`, the learning tests and the benches load them from here."""
from __future__ import annotations

import copy
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

RECIPES = Path(__file__).resolve().parent / "recipes"
DEMO = {"math": "demo-math", "code": "demo-code", "tools": "demo-tools"}  # `rlvr demo --task …`, tiny models
REAL = {"math": "real-math", "code": "real-code"}   # `rlvr demo --task … --model smollm2-135m`, bench/learning.py


@lru_cache(maxsize=None)
def _load(name: str) -> dict[str, Any]:
    path = RECIPES / f"{name}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in RECIPES.glob("*.yaml"))
        raise ValueError(f"unknown recipe {name!r}; known: {', '.join(known)}")
    return yaml.safe_load(path.read_text())


def recipe(name: str) -> dict[str, Any]:
    """The job spec ``examples/jobs/<name>.yaml`` as a dict (a fresh copy: callers may change it)."""
    return copy.deepcopy(_load(name))


def learning_spec(algorithm: str = "grpo", seed: int = 0):
    """The learning tests' job (and bench/learning_spread.py's): the demo's recipe with only the algorithm
    changed ("ppo-critic": PPO with a separate critic model; "code": GRPO on the tiny code task; "tools": GRPO
    on tool-using episodes, demo-tools), single-threaded so a run is reproducible on a given CPU kernel path."""
    from trainer.config import JobSpec

    base = recipe(DEMO[algorithm] if algorithm in ("code", "tools") else DEMO["math"])
    extra = {"algorithm": "ppo", "ppo": {"critic": "builtin:tiny-arith"}} if algorithm == "ppo-critic" else \
        {"algorithm": "grpo" if algorithm in ("code", "tools") else algorithm}
    # online DPO learns from one pair per group (not G completions): twice the steps (each is 4x cheaper)
    budget = {"steps": 300, "eval_every": 100} if algorithm == "dpo" else {}
    return JobSpec.model_validate({**base, "name": f"learn-{algorithm}", **extra,
                                   "train": {**base["train"], "seed": seed, "threads": 1, **budget}})
