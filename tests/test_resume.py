"""A run paused at step k and resumed continues exactly: same prompts, same metrics, same weights.

Checkpoints carry the optimizer, scheduler, value head, RNG streams and the prompt-stream position;
the resumed run must neither replay nor skip prompts (data_position advances by exactly one batch per
step) and must end bit-for-bit where the uninterrupted run ends (single-threaded, same machine).
"""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from trainer.config import JobSpec
from trainer.loop import train

pytestmark = [pytest.mark.slow, pytest.mark.numerics]

VOLATILE = ("time/", "tokens_per_s", "latency")  # wall-clock figures differ run to run


def _spec(algorithm: str) -> JobSpec:
    critic = algorithm == "ppo-critic"  # PPO with a separate critic network: its weights resume too
    return JobSpec.model_validate({
        "algorithm": "ppo" if critic else algorithm,
        **({"ppo": {"critic": "builtin:tiny-arith"}} if critic else {}),
        "data": {"eval_size": 16},
        "rollout": {"group_size": 4, "max_new_tokens": 12},
        # several shuffled minibatches per step and resampling: RNG and stream position both matter
        "algo": {"ppo_epochs": 2, "minibatch_size": 8, "zero_variance": "resample", "resample_rounds": 1},
        "optim": {"lr": 1e-3},
        "train": {"steps": 5, "prompts_per_step": 4, "eval_every": 2, "threads": 1, "seed": 7},
    })


def _metrics(run) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not any(v in k for v in VOLATILE) and k != "checkpoint"} for r in rows]


@pytest.mark.parametrize("algorithm", ["grpo", "ppo", "ppo-critic"])
def test_paused_and_resumed_run_equals_uninterrupted(tmp_path, models_dir, algorithm):
    spec = _spec(algorithm)
    quiet = lambda m: None  # noqa: E731
    full = train(spec, tmp_path / "full", models_dir=models_dir, log=quiet)

    calls = {"n": 0}

    def pause_at_3():
        calls["n"] += 1
        return "pause" if calls["n"] == 3 else None

    first = train(spec, tmp_path / "split", models_dir=models_dir, log=quiet, should_stop=pause_at_3)
    assert (first.status, first.step) == ("paused", 3)
    second = train(spec, tmp_path / "split", models_dir=models_dir, log=quiet)
    assert (second.status, second.step) == ("succeeded", 5)

    a, b = _metrics(tmp_path / "full"), _metrics(tmp_path / "split")
    assert [r["step"] for r in b] == [0, 1, 2, 3, 4, 5]  # each step once: nothing replayed or skipped
    assert a == b
    positions = [r["data_position"] for r in a if r["step"]]
    resampled = [r["resampled_groups"] for r in a if r["step"]]
    # the stream advances by exactly the prompts drawn (batch + resampled groups), never rewinds
    assert all(p1 - p0 == 4 + n for p0, p1, n in zip([0] + positions, positions, resampled))
    wa = load_file(tmp_path / "full" / "checkpoints" / "step-0000005" / "model.safetensors")
    wb = load_file(tmp_path / "split" / "checkpoints" / "step-0000005" / "model.safetensors")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert full.accuracy_after == second.accuracy_after


def test_step_killed_between_checkpoint_and_metrics_is_recorded_on_resume(tmp_path, models_dir):
    """The window the fault tests hit: checkpoint N written, worker frozen or killed before step N's
    metrics reach the store. The resumed run starts at N+1, so it must deliver N's record again."""
    spec = JobSpec.model_validate({
        "rollout": {"group_size": 4, "max_new_tokens": 8}, "data": {"eval_size": 4},
        "train": {"steps": 4, "prompts_per_step": 2, "eval_every": 0, "checkpoint_every": 3, "threads": 1},
    })
    run, quiet = tmp_path / "run", (lambda m: None)

    def killed_at_3(step, m):
        if step == 3:
            raise SystemExit("killed")

    with pytest.raises(SystemExit):
        train(spec, run, models_dir=models_dir, log=quiet, on_step=killed_at_3)
    lines = (run / "metrics.jsonl").read_text().splitlines()
    step3 = json.loads(lines[-1])
    assert step3["step"] == 3 and step3["checkpoint"] == "step-0000003"
    # as if killed before the file write too, halfway through the line
    (run / "metrics.jsonl").write_text("\n".join(lines[:-1]) + '\n{"step": 3, "rew')

    seen: dict[int, dict] = {}
    result = train(spec, run, models_dir=models_dir, log=quiet, on_step=lambda s, m: seen.setdefault(s, m))
    assert (result.status, result.step) == ("succeeded", 4)
    assert sorted(seen) == [3, 4]
    assert {**seen[3], "step": 3} == step3  # the very record the killed worker would have written
    lines = (run / "metrics.jsonl").read_text().splitlines()
    assert lines[3] == '{"step": 3, "rew'  # the torn line stays torn, on its own line
    assert [json.loads(x)["step"] for x in lines[:3] + lines[4:]] == [0, 1, 2, 3, 4]

