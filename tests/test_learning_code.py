"""Code RL really learns, through the whole code path: completion → sandbox → verdict → advantage → update.

The tiny code model (trainer/models/tiny_code.py, committed) answers `code: 8+9` with a one-line program; the
code verifier runs each program in the sandbox and compares its output with the hidden expected one.
Held-out: 400 expressions never trained on, greedy decoding. GRPO must raise held-out accuracy by the
smallest gain measured across CPU kernel paths and seeds (tests/learning.py) — it does so by finding
that printing the expression lets the program compute the answer.
"""
from __future__ import annotations

import pytest

from service.cli.recipes import learning_spec
from tests.learning import assert_learned, evals
from trainer.loop import train
from trainer.models import tiny_arith, tiny_code

pytestmark = [pytest.mark.slow, pytest.mark.numerics]


def test_grpo_on_code_raises_held_out_accuracy(tmp_path, models_dir):
    spec = learning_spec("code")
    assert spec.verifiers[0].name == "code" and spec.model.path == "builtin:tiny-code"
    train(spec, tmp_path / "run", models_dir=models_dir, log=lambda m: None)
    ev = evals(tmp_path / "run")
    assert sorted(ev) == [0, 50, 100]
    assert_learned(ev, tiny_arith.manifest(tiny_code.ASSETS)["held_out_accuracy"], "code")
