"""Asynchronous rollouts (rollout.max_staleness): a producer process samples while the trainer updates.

k = 0 is today's synchronous loop, metric for metric; with k = 1 every trained batch is at most one
policy version old; the loss weighs tokens by min(π_trainer / π_behaviour, cap) on the producer's
recorded log-probs; pause/resume and a producer killed with SIGKILL are survived (once) or fail the job
with the reason.
"""
from __future__ import annotations

import json
import math
import os
import signal
from pathlib import Path

import pytest

from trainer.config import JobSpec
from trainer.loop import train
from trainer.producer import ProducerError

pytestmark = pytest.mark.slow
VOLATILE = ("time/", "tokens_per_s", "latency")


def _spec(k: int, steps: int = 5, **algo) -> JobSpec:
    return JobSpec.model_validate({
        "data": {"eval_size": 16}, "rollout": {"group_size": 4, "max_new_tokens": 10, "max_staleness": k},
        "algo": algo, "optim": {"lr": 1e-4},
        "train": {"steps": steps, "prompts_per_step": 4, "eval_every": 0, "threads": 1, "seed": 3}})


def _rows(run) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def test_k0_is_the_synchronous_loop_exactly(tmp_path, models_dir):
    quiet = lambda m: None  # noqa: E731
    default = JobSpec.model_validate({**_spec(0).model_dump(), "rollout": {"group_size": 4, "max_new_tokens": 10}})
    train(default, tmp_path / "a", models_dir=models_dir, log=quiet)
    train(_spec(0), tmp_path / "b", models_dir=models_dir, log=quiet)
    strip = lambda r: {k: v for k, v in r.items() if not any(x in k for x in VOLATILE)}  # noqa: E731
    assert [strip(r) for r in _rows(tmp_path / "a")] == [strip(r) for r in _rows(tmp_path / "b")]
    assert not any(k.startswith("async/") for r in _rows(tmp_path / "b") for k in r)
    assert not (tmp_path / "b" / "producer.log").exists()  # no producer was started


def test_k1_trains_on_batches_at_most_one_version_old(tmp_path, models_dir):
    rows = _rows_of(tmp_path, models_dir, _spec(1, steps=6))
    stale = [r["async/staleness"] for r in rows[1:]]
    assert stale[0] == 0 and set(stale) <= {0, 1}  # the bound holds on every step
    assert 1 in stale[1:]  # and the producer did run ahead (sampled while the trainer updated)
    assert all(r["async/dropped_batches"] == 0 for r in rows[1:])
    assert [r["data_position"] for r in rows[1:]] == [4 * i for i in range(1, 7)]  # each batch once
    assert all(math.isfinite(r["loss"]) for r in rows[1:])
    # the lag is corrected wherever a row was trained (a step of only zero-variance groups trains none)
    assert all("tis/weight_mean" in r or r["update/skipped_row_frac"] == 1.0 for r in rows[1:])
    assert any("tis/weight_mean" in r for r in rows[1:])


def test_k3_samples_two_batches_per_call_each_within_three_versions(tmp_path, models_dir):
    """k = 3: the producer samples two training batches per engine call (the default (k + 1) // 2), so
    steps (1, 2), (3, 4), ... train on batches of one policy version — the second one version staler than
    the first — each at most 3 versions old, none dropped or skipped."""
    rows = _rows_of(tmp_path, models_dir, _spec(3, steps=8))[1:]
    assert all(r["async/batches_per_call"] == 2 for r in rows)
    stale = [r["async/staleness"] for r in rows]
    assert set(stale) <= {0, 1, 2, 3}
    assert stale[1::2] == [x + 1 for x in stale[0::2]]
    behaviour = [r["step"] - 1 - r["async/staleness"] for r in rows]  # step s trains at version s - 1
    assert behaviour[0::2] == behaviour[1::2]  # the two batches of a call: one version
    assert behaviour == sorted(behaviour)
    assert all(r["async/dropped_batches"] == 0 for r in rows)
    assert [r["data_position"] for r in rows] == [4 * i for i in range(1, 9)]


@pytest.mark.parametrize("calls", [1, 2, 3])
def test_batches_sampled_together_are_each_their_own_prompts_groups(tmp_path, models_dir, monkeypatch, calls):
    """A scripted engine's group depends on its prompt alone, so whether the producer samples one, two
    or three batches per call, step s trains on exactly the groups the synchronous loop trains on."""
    monkeypatch.setenv("RLVR_PRODUCER_PRELUDE", "tests.scripted_engine:install")
    from tests import scripted_engine

    keys = ("reward/mean", "reward/std", "accuracy", "completion/len_mean", "rollout_tokens", "data_position")
    spec = _spec(3, steps=6)
    spec.rollout.producer_batches = calls
    got = [{k: r[k] for k in keys} for r in _rows_of(tmp_path / "async", models_dir, spec)[1:]]
    monkeypatch.setitem(__import__("trainer.engines", fromlist=["ENGINES"]).ENGINES, "hf",
                        scripted_engine.ScriptedEngine)
    want = [{k: r[k] for k in keys} for r in _rows_of(tmp_path / "sync", models_dir, _spec(0, steps=6))[1:]]
    assert got == want


def test_producer_batches_beyond_the_staleness_bound_are_refused():
    with pytest.raises(ValueError, match="producer_batches = 3 needs max_staleness >= 3"):
        JobSpec.model_validate({**_spec(2).model_dump(), "rollout": {"max_staleness": 2, "producer_batches": 3}})
    with pytest.raises(ValueError, match="zero_variance"):
        JobSpec.model_validate({**_spec(2).model_dump(), "rollout": {"max_staleness": 2, "producer_batches": 2},
                                "algo": {"zero_variance": "resample"}})
    assert _spec(3).rollout.batches_per_call(resample=False) == 2
    assert _spec(3).rollout.batches_per_call(resample=True) == 1  # refills draw from the stream: one per call
    assert _spec(1).rollout.batches_per_call(resample=False) == 1


def _rows_of(tmp_path, models_dir, spec, **kw):
    train(spec, tmp_path / "run", models_dir=models_dir, log=lambda m: None, **kw)
    return _rows(tmp_path / "run")


@pytest.mark.parametrize("shift,capped", [(math.log(4), False), (-math.log(4), True)])
def test_importance_weights_are_min_of_the_ratio_and_the_cap(tmp_path, models_dir, monkeypatch, shift, capped):
    """The producer's engine reports behaviour log-probs = its model's + s. The trainer's weight per token
    is min(π_trainer / π_behaviour, cap=2). The first batch was sampled by the trainer's own weights
    (staleness 0), so its ratio is e^-s exactly: 1/4 on every token (under the cap: the weight is the
    ratio), or 4 (every token capped at 2). Later batches are one update older: the weight is still the
    ratio wherever the ratio is under the cap. The entropy bonus puts every row in the update, so the weights
    (over trained tokens) and the ratio (reported over every sampled token) cover the same tokens."""
    monkeypatch.setenv("RLVR_PRODUCER_PRELUDE", "tests.scripted_engine:install_shifted")
    monkeypatch.setenv("RLVR_TEST_LOGP_SHIFT", repr(shift))
    rows = [r for r in _rows_of(tmp_path, models_dir, _spec(1, steps=3, tis_cap=2.0, entropy_coef=0.01))[1:]
            if "tis/weight_mean" in r]
    first = rows[0]
    assert first["async/staleness"] == 0
    assert first["rollout/is_ratio_mean"] == pytest.approx(math.exp(-shift), rel=1e-4)
    if capped:
        assert first["tis/capped_frac"] == 1.0 and first["tis/weight_mean"] == pytest.approx(2.0)
        assert all(r["tis/weight_mean"] <= 2.0 + 1e-9 and r["tis/capped_frac"] > 0.5 for r in rows)
    else:
        for r in rows:
            assert r["tis/capped_frac"] == 0.0
            assert r["tis/weight_mean"] == pytest.approx(r["rollout/is_ratio_mean"], rel=1e-5)


def test_pause_resume_and_the_producer_stops_with_the_run(tmp_path, models_dir):
    calls = {"n": 0}
    running: list[int] = []

    def pause_at_2():
        calls["n"] += 1
        if calls["n"] == 1:
            running.extend(_producers())
        return "pause" if calls["n"] == 2 else None

    first = train(_spec(1), tmp_path / "run", models_dir=models_dir, log=lambda m: None, should_stop=pause_at_2)
    assert (first.status, first.step) == ("paused", 2)
    assert len(running) == 1  # the run's producer, found while it ran
    assert not _producers()  # pausing stopped the producer
    second = train(_spec(1), tmp_path / "run", models_dir=models_dir, log=lambda m: None)
    assert (second.status, second.step) == ("succeeded", 5)
    rows = _rows(tmp_path / "run")
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4, 5]
    assert rows[-1]["data_position"] == 20  # in-flight batches were regenerated, none skipped or repeated
    assert not _producers()


def test_a_killed_producer_is_restarted_once_then_the_job_fails(tmp_path, models_dir):
    from trainer import loop

    runs, killed = [], []
    real = loop.setup
    kills = {"max": 1}

    def keep(*a):
        runs.append(real(*a))
        return runs[-1]

    def on_step(step, m):  # SIGKILL the producer running now, up to kills["max"] different ones
        proc = runs[-1].ctx.producer.proc
        if step >= 1 and len(killed) < kills["max"] and proc.pid not in killed:
            os.kill(proc.pid, signal.SIGKILL)
            killed.append(proc.pid)

    loop.setup = keep
    try:
        res = train(_spec(1, steps=5), tmp_path / "once", models_dir=models_dir, log=lambda m: None, on_step=on_step)
        assert res.status == "succeeded" and res.step == 5 and len(killed) == 1  # restarted once, went on
        assert runs[-1].ctx.producer.restarts == 0
        killed.clear()
        kills["max"] = 2  # the first producer, then the one that replaced it
        with pytest.raises(ProducerError, match="already restarted"):
            train(_spec(1, steps=8), tmp_path / "twice", models_dir=models_dir, log=lambda m: None, on_step=on_step)
        assert len(killed) == 2
    finally:
        loop.setup = real
    assert not _producers()


def _producers() -> list[int]:
    """This process's rollout producers (its children): under xdist another worker's test may have its own."""
    from tests.sandbox.conftest import host_processes_with

    def parent(pid: int) -> int:
        try:  # /proc/<pid>/stat: "pid (comm) state ppid ..."; comm may hold spaces, so split after its ")"
            return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            return -1  # gone meanwhile

    return [pid for pid in host_processes_with("trainer.producer") if parent(pid) == os.getpid()]
