"""Same seed, same machine, same thread count: the same metrics, bit for bit (``train.deterministic``).

Not a numerics test: it compares a run with itself on one kernel path, and it runs at 2 threads (the
numerics pass runs two tests side by side at one thread each)."""
from __future__ import annotations

import pytest
import torch

from tests.test_resume import _metrics, _spec
from trainer.config import JobSpec
from trainer.loop import train

pytestmark = pytest.mark.slow


def test_same_seed_same_threads_same_metrics_bit_for_bit(tmp_path, models_dir):
    """train.deterministic (the default): two runs of one spec at 2 threads write identical step records
    (wall-clock figures aside), every float to the last bit, and torch's deterministic algorithms are on."""
    spec = JobSpec.model_validate({**_spec("grpo").model_dump(), "train": {**_spec("grpo").train.model_dump(),
                                                                            "threads": 2, "steps": 3}})
    assert spec.train.deterministic
    quiet = lambda m: None  # noqa: E731
    train(spec, tmp_path / "a", models_dir=models_dir, log=quiet)
    assert torch.are_deterministic_algorithms_enabled()
    train(spec, tmp_path / "b", models_dir=models_dir, log=quiet)
    assert _metrics(tmp_path / "a") == _metrics(tmp_path / "b")
