"""Learning tests that fail when the algorithm is wrong, not only when nothing learns.

tests/test_learning.py and tests/test_learning_algos.py show held-out accuracy RISES under the right update; a
learner with its sign reversed, or one whose critic learns nothing, could still pass a test that only watches the
reward. These break the algorithm on purpose (tests/learning.py ``wrong``) or watch the piece a bug would
silence, on a short job from the committed tiny model (tests/learning.py ``SHORT``: 20 steps of 8 prompts
of the demo's recipe,
single-threaded, ~20 s on one core):

- GRPO with its advantage's sign flipped must make held-out accuracy FALL (the same update with the right sign
  raises it: tests/test_learning.py) — the test of the direction every other learning test takes on trust;
- PPO's critic must track the returns: its mean value ends close to the mean return, where a critic that
  learns nothing (its value loss zeroed, also run here) keeps its initial values.

The other two wrong algorithms the review names fail targeted unit tests, checked by mutation (bench/RESULTS.md,
"Wrong-algorithm tests"): Dr. GRPO's normaliser taken from the batch's padded width fails
tests/test_update.py::test_the_padded_width_leaves_the_update_unchanged[seq-mean-token-sum-norm]; k3 with its sign
reversed fails tests/test_algos.py::test_k3_in_the_loss_gives_the_forward_kl_gradient (an exact expectation).

Each threshold is mean - 3 s.d. (or + 3 s.d.) of the figure over 8 seeds, measured by
``bench/learning_spread.py --wrong flipped,ppo,dead-critic --seeds 0,1,2,3,4,5,6,7`` (figures in the comments).
"""
from __future__ import annotations

import pytest

from tests.learning import critic_figures, evals, short_spec, wrong
from trainer.loop import train

pytestmark = [pytest.mark.slow, pytest.mark.numerics]

# Flipped sign: held-out accuracy at step 0 minus at step 20 (200 problems), seeds 0-7, this host's default
# kernels (AVX2 on this VM today), one thread: 0.095 0.045 0.080 0.070 0.080 0.075 0.085 0.065 -> mean 0.0744,
# s.d. 0.0150;
# mean - 3 s.d. = 0.0294. (A run whose update did nothing would fall by 0: the same greedy eval of the same model.)
FALL_MIN = 0.0294
# PPO (value head): |mean value - mean return| over the last 10 of 20 steps, seeds 0-7: 0.0371 0.0007 0.0108
# 0.0198 0.0115 0.0229 0.0085 0.0276 -> mean 0.0174, s.d. 0.0117; mean + 3 s.d. = 0.0525.
BIAS_MAX = 0.0525
# The same with the value loss zeroed (a dead critic), seeds 0-7: 0.1032 0.1261 0.0993 0.0835 0.1082 0.1083
# 0.0913 0.1064 -> mean 0.1033, s.d. 0.0127; mean - 3 s.d. = 0.0652.
DEAD_BIAS_MIN = 0.0652


def test_a_flipped_advantage_sign_makes_held_out_accuracy_fall(tmp_path, models_dir):
    with wrong("flipped"):
        train(short_spec("grpo"), tmp_path / "run", models_dir=models_dir, log=lambda m: None)
    ev = evals(tmp_path / "run")
    assert sorted(ev) == [0, 20]
    print(f"flipped sign: held-out accuracy {ev}; fall {ev[0] - ev[20]:+.4f} (needs {FALL_MIN:+.4f})")
    assert ev[0] - ev[20] >= FALL_MIN, ev


def test_the_critic_tracks_the_returns_and_a_dead_one_does_not(tmp_path, models_dir):
    train(short_spec("ppo"), tmp_path / "live", models_dir=models_dir, log=lambda m: None)
    live = critic_figures(tmp_path / "live")
    with wrong("dead-critic"):
        train(short_spec("ppo"), tmp_path / "dead", models_dir=models_dir, log=lambda m: None)
    dead = critic_figures(tmp_path / "dead")
    print(f"critic: live {live}, dead {dead}; live bias needs <= {BIAS_MAX:.4f}, dead >= {DEAD_BIAS_MIN:.4f}")
    assert BIAS_MAX < DEAD_BIAS_MIN  # the two measured bands do not overlap: the test tells them apart
    assert live["value_bias"] <= BIAS_MAX, live
    assert dead["value_bias"] >= DEAD_BIAS_MIN, dead  # the check itself can fail: a dead critic is caught
