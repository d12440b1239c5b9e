"""GRPO over tool-using episodes learns to call the tool: the bundled tiny tool model (trainer/models/tiny_tool.py)
answers 2-digit sums at once and almost always wrong, and calls Python in about a fifth of its sampled episodes.
Trained on whole episodes (demo-tools: sandbox calls between turns, observations masked out of the loss), its
greedy held-out accuracy WITH the tool rises far past its accuracy with the tool switched off, which does not
rise: the gain comes from calling the tool, not from better arithmetic.

The gain the test needs comes from bench/learning_spread.py over seeds and CPU kernel paths (``MEASURED``)."""
from __future__ import annotations

import json
import statistics

import pytest

from service.cli.recipes import learning_spec, recipe
from trainer.config import EpisodesConfig
from trainer.loop import train
from trainer.models import tiny_arith, tiny_tool

pytestmark = [pytest.mark.slow, pytest.mark.numerics]

# held-out gain with the tool (last eval - start), 8 seeds on each of two kernel paths:
#   python bench/learning_spread.py --algos tools --capabilities default --seeds 0,1,2,3,4,5,6,7
#   python bench/learning_spread.py --algos tools --capabilities avx512 --seeds 0,1,2,3,4,5,6,7  (AMD Zen 4)
# 16 runs: mean 0.6106, s.d. 0.0561 -> the test needs mean - 3 s.d. = 0.4423. The native AVX2 path (seeds 0-3:
# 0.610, 0.655, 0.665, 0.540) lands within 0.01 of the portable one, seed by seed; on Zen 4's AVX-512 seed 0
# parts from it after step 10 (0.475: the portable runs alone had set the bar at 0.4768). Table:
# bench/RESULTS.md ("Learning-test spread").
MEASURED = [0.6150, 0.6550, 0.6650, 0.5500, 0.5450, 0.6600, 0.6250, 0.6250,   # default (portable)
            0.4750, 0.6550, 0.6650, 0.5400, 0.5900, 0.6600, 0.6250, 0.6200]   # avx512, AMD Zen 4
EVAL_SE = (0.5 * 0.5 / 200) ** 0.5  # one standard error of a 200-problem greedy eval at its widest (p = 0.5)


def need() -> float:
    """mean - 3 s.d. of the measured gains (and never less than 4 eval standard errors: clear of no learning)."""
    return max(statistics.mean(MEASURED) - 3 * statistics.stdev(MEASURED), 4 * EVAL_SE)


def test_the_recipe_plays_the_episodes_the_model_was_built_for():
    assert EpisodesConfig.model_validate(recipe("demo-tools")["episodes"]) == tiny_tool.episodes_config()
    assert recipe("demo-tools")["rollout"]["max_new_tokens"] == tiny_tool.MAX_NEW_TOKENS


def test_grpo_on_episodes_learns_to_call_the_tool(tmp_path, models_dir):
    spec = learning_spec("tools")
    train(spec, tmp_path / "run", models_dir=models_dir, log=lambda m: None)
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    ev = {r["step"]: r for r in rows if "eval/accuracy" in r}
    first, last = ev[min(ev)], ev[max(ev)]
    gain = last["eval/accuracy"] - first["eval/accuracy"]
    print({s: (r["eval/accuracy"], r["eval/tools_off/accuracy"], r["eval/tool_calls"]) for s, r in ev.items()})
    start = tiny_arith.manifest(tiny_tool.ASSETS)["held_out_accuracy"]  # built on 400 problems, run on 200
    assert abs(first["eval/accuracy"] - start) <= 4 * EVAL_SE
    assert first["eval/tool_calls"] < 0.5  # greedy answers mostly without the tool at the start
    assert gain >= need(), ev
    # tools off, the same model gains nothing: what it learnt is to call the tool
    assert last["eval/tools_off/accuracy"] <= first["eval/tools_off/accuracy"] + 3 * EVAL_SE
    assert last["eval/accuracy"] - last["eval/tools_off/accuracy"] >= need()
    assert last["eval/tool_calls"] > 0.5
    # every episode's training row was the sampler's exact tokens
    assert all(r.get("episodes/token_mismatches", 0) == 0 for r in rows)
