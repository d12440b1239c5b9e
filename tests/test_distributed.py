"""Data-parallel training (torch.distributed, gloo on CPU): 2 ranks == 1 process on the same global batch.

Each rank samples half of every step's prompts; rewards are gathered, losses normalised by global
counts and gradients summed, so after several optimiser steps the parameters must match a single
process that saw the whole batch. A deterministic engine (tests/scripted_engine.py) makes the two
runs see the same completions; padding widths still differ between them, as they would for real.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import REPO, free_port

pytestmark = [pytest.mark.slow, pytest.mark.numerics]
TOL = torch.finfo(torch.float64).eps ** 0.5  # of the largest weight move: see below
# CI's second kernel path (Makefile test-kernels) runs one aggregation, one two-pass loss and the FSDP2 run: TOL
# comes from float64's eps alone, the same for every variant; the rest check structure (meshes, deadlocks).
ONE_PATH = pytest.mark.one_kernel_path

SPEC = {
    "algorithm": "grpo",
    # float64: the two runs group rows differently (different summation orders), and Adam divides by
    # sqrt(v), so in float32 a near-zero gradient's round-off moves single weights by a fraction of lr —
    # by amounts that differ between CPU kernel paths. In float64 that noise is ~1e-13 of the update, so
    # sqrt(eps64) of it bounds it on any CPU while a real mismatch (a lost row, a wrong normaliser) is O(1).
    "model": {"path": "builtin:tiny-arith", "dtype": "float64"},
    "data": {"eval_size": 8},
    "rollout": {"group_size": 4, "max_new_tokens": 12},
    # batch-std scaling and token-mean need GLOBAL statistics; KL + entropy exercise the other terms;
    # micro-batches of 3 sequences exercise accumulation with uneven pieces
    "algo": {"advantage": "grpo_batch_std", "kl_coef": 0.05, "entropy_coef": 0.01, "micro_batch_size": 3},
    "optim": {"lr": 1e-3},
    "train": {"steps": 3, "prompts_per_step": 4, "eval_every": 0, "threads": 1, "seed": 3},
}


def _agg(loss_agg: str) -> dict:
    return {**SPEC, "algo": {**SPEC["algo"], "loss_agg": loss_agg}}


def _loss(loss: str) -> dict:
    """Two passes over each step's batch (one minibatch, so both layouts see the same rows per optimiser step)."""
    agg = "seq-mean-token-mean" if loss in ("gspo", "gmpo") else "token-mean"
    return {**SPEC, "algo": {**SPEC["algo"], "policy_loss": loss, "loss_agg": agg, "ppo_epochs": 2},
            "train": {**SPEC["train"], "steps": 2}}


FSDP = {**SPEC, "train": {**SPEC["train"], "world_size": 1, "fsdp": True}}
PLAIN = {**SPEC, "algo": {"advantage": "grpo", "micro_batch_size": 3}}  # no entropy, KL or value term
PLAIN_FSDP = {**PLAIN, "train": {**SPEC["train"], "fsdp": True}}


def _runs_of(item) -> list[tuple[int, dict]]:
    """The (ranks, spec) runs a test of this module compares: the session makes them all at once (``launched``)."""
    params = item.callspec.params if hasattr(item, "callspec") else {}
    return {
        "test_two_gloo_ranks_match_one_process": lambda: [(1, _agg(params["loss_agg"])), (2, _agg(params["loss_agg"]))],
        "test_two_gloo_ranks_match_one_process_for_every_policy_loss":
            lambda: [(1, _loss(params["loss"])), (2, _loss(params["loss"]))],
        "test_fsdp2_ranks_match_one_process": lambda: [(1, SPEC), (2, FSDP)],
        "test_fsdp2_with_skipped_rows_matches_one_process": lambda: [(1, PLAIN), (2, PLAIN_FSDP)],
    }.get(getattr(item, "originalname", ""), list)()


def _key(ranks: int, spec: dict) -> str:
    """A run's folder: specs that validate to the same job (SPEC and ``_agg("token-mean")``) share one run."""
    from trainer.config import JobSpec

    job = JobSpec.model_validate(spec).model_dump_json()
    return f"{ranks}-" + hashlib.sha256(job.encode()).hexdigest()[:16]


@pytest.fixture(scope="session")
def launched(request, tmp_path_factory, models_dir) -> Path:
    """Every run the selected tests of this module compare, made by one launch per rank count: one process
    trains each 1-rank run in turn, one torchrun each 2-rank run (tests/scripted_engine.py ``train_each``).
    Interpreters and imports were most of a run's time (a run alone 8.5 s, 5.3 of them starting up). Under
    xdist both workers share the runs: each launch is made once, by the first worker to want it, while the
    other makes the other launch or waits for it. Returns the folder holding ``<key>/`` run folders and each
    launch's ``ranks-<n>.json`` (its exit code and output's tail)."""
    wanted: dict[int, dict[str, dict]] = {}
    for item in request.session.items:
        for ranks, spec in _runs_of(item):
            wanted.setdefault(ranks, {})[_key(ranks, spec)] = spec
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")  # this run's, shared by its workers
    root = tmp_path_factory.getbasetemp().parent / f"distributed-{run}" if run else tmp_path_factory.getbasetemp()
    root.mkdir(exist_ok=True)
    for blocking in (False, True):  # first the launches nobody is making, then wait for the others'
        for ranks, runs in wanted.items():
            with open(root / f"ranks-{ranks}.lock", "w") as lock:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
                except BlockingIOError:
                    continue
                if not (root / f"ranks-{ranks}.json").exists():
                    _launch(root, ranks, runs, models_dir)
    return root


def _launch(root: Path, ranks: int, runs: dict[str, dict], models_dir: Path) -> None:
    args = []
    for key, spec in runs.items():
        shutil.rmtree(root / key, ignore_errors=True)  # a launch cut short elsewhere: its runs would resume
        (root / key).mkdir()
        (root / key / "spec.json").write_text(json.dumps(spec))
        args += [str(root / key / "spec.json"), str(root / key)]
    args = ["-m", "tests.scripted_engine", *args, str(models_dir)]
    if ranks > 1:
        args = ["-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", str(ranks),
                "--master_addr", "127.0.0.1", "--master_port", str(free_port()), *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RLVR_DIST_TIMEOUT_S": "120"}
    try:
        proc = subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=300 + 120 * len(runs))
        out = {"rc": proc.returncode, "tail": proc.stdout[-3000:] + proc.stderr[-3000:]}
    except subprocess.TimeoutExpired as e:
        out = {"rc": None, "tail": f"timed out after {e.timeout} s"}
    (root / f"ranks-{ranks}.json").write_text(json.dumps(out))


def _result(root: Path, ranks: int, spec: dict, step: int = 3) -> dict:
    launch = json.loads((root / f"ranks-{ranks}.json").read_text())
    assert launch["rc"] == 0, launch["tail"]
    run = root / _key(ranks, spec)
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {"params": load_file(run / "checkpoints" / f"step-{step:07d}" / "model.safetensors"), "metrics": metrics,
            "dir": run}


def _run(tmp_path: Path, name: str, nproc: int, models_dir: Path, spec: dict | None = None, step: int = 3) -> dict:
    """One run in a launch of its own (tests/test_ray.py's one-process reference)."""
    root = tmp_path / name
    root.mkdir()
    _launch(root, nproc, {_key(nproc, spec or SPEC): spec or SPEC}, models_dir)
    return _result(root, nproc, spec or SPEC, step)


@pytest.mark.parametrize("loss_agg", ["token-mean", pytest.param("seq-mean-token-mean", marks=ONE_PATH),
                                      pytest.param("seq-mean-token-sum-norm", marks=ONE_PATH)])
def test_two_gloo_ranks_match_one_process(launched, tiny_model, loss_agg):
    """Every aggregation: each divides by a count of the whole global batch (tokens, sequences, or
    sequences × the generation budget), so rank-local padding widths must not matter."""
    single, pair = _result(launched, 1, _agg(loss_agg)), _result(launched, 2, _agg(loss_agg))
    start = load_file(tiny_model / "model.safetensors")
    moved = max((single["params"][k] - start[k].double()).abs().max().item() for k in start)
    assert moved > 1e-4, "the steps must actually change the weights for the comparison to mean anything"
    for k, v in single["params"].items():
        diff = (pair["params"][k] - v).abs().max().item()
        assert diff <= TOL * moved, (k, diff, TOL * moved)
    # same global batch: same rewards, same loss, same held-out accuracy at the end
    for a, b in zip(single["metrics"], pair["metrics"], strict=True):
        for key in ("reward/mean", "accuracy", "zero_std_group_frac", "data_position", "eval/accuracy"):
            assert a.get(key) == b.get(key), (a["step"], key)
        if "loss" in a:
            assert b["loss"] == pytest.approx(a["loss"], rel=TOL, abs=TOL)


@pytest.mark.parametrize("loss", [pytest.param("cispo", marks=ONE_PATH), "gspo",
                                  pytest.param("gspo_token", marks=ONE_PATH), pytest.param("gmpo", marks=ONE_PATH)])
def test_two_gloo_ranks_match_one_process_for_every_policy_loss(launched, tiny_model, loss):
    """Two passes over each step's batch, so the second pass's ratio leaves 1 and each loss's own clipping acts."""
    single, pair = _result(launched, 1, _loss(loss), step=2), _result(launched, 2, _loss(loss), step=2)
    start = load_file(tiny_model / "model.safetensors")
    moved = max((single["params"][k] - start[k].double()).abs().max().item() for k in start)
    assert moved > 1e-4
    for k, v in single["params"].items():
        assert (pair["params"][k] - v).abs().max().item() <= TOL * moved, k
    assert any(r.get("update/ratio_max", 1) != 1 for r in single["metrics"])  # the ratio did leave 1


@ONE_PATH
def test_runs_in_one_launch_each_meet_at_a_store_of_their_own(tmp_path, models_dir):
    """``launched`` trains several runs per torchrun. Each run's group is new; met at the agent's store, a group
    found the last one's keys: with rank 1 6 s late, rank 0 connected to rank 1's old, closed port (gloo
    "Connection refused"). Both runs finish, with the same parameters."""
    spec = {**SPEC, "train": {**SPEC["train"], "steps": 1}}
    args = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "spec.json").write_text(json.dumps(spec))
        args += [str(tmp_path / name / "spec.json"), str(tmp_path / name)]
    proc = _torchrun(["tests.scripted_engine", *args, str(models_dir)], env={"RLVR_TEST_LATE_RANK": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    a, b = (load_file(tmp_path / n / "checkpoints" / "step-0000001" / "model.safetensors") for n in "ab")
    assert all(torch.equal(a[k], b[k]) for k in a)


@ONE_PATH
def test_job_spec_world_size_makes_the_caller_rank_0(tmp_path, models_dir):
    """`train.world_size: 2`: train() (as the service worker calls it) starts rank 1 itself, rank 0
    writes the metrics, and every step consumed exactly one global batch of prompts."""
    from trainer.config import JobSpec
    from trainer.loop import train

    spec = JobSpec.model_validate({**SPEC, "algo": {}, "train": {**SPEC["train"], "world_size": 2, "steps": 2}})
    seen: list[int] = []
    result = train(spec, tmp_path / "run", models_dir=models_dir, log=lambda m: None,
                   on_step=lambda step, m: seen.append(step))
    assert result.status == "succeeded" and seen == [0, 1, 2]
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r.get("data_position") for r in rows] == [None, 4, 8]
    assert rows[-1]["rollout_tokens"] > 0 and "eval/accuracy" in rows[-1]
    assert (tmp_path / "run" / "rank-1.log").exists()
    assert (tmp_path / "run" / "checkpoints" / "step-0000002" / "model.safetensors").exists()


def test_fsdp2_ranks_match_one_process(launched, tiny_model):
    """`train.fsdp`: parameters, gradients and optimiser state sharded over 2 gloo ranks (FSDP2
    fully_shard) reach the parameters one unsharded process reaches on the same global batch; the
    checkpoint holds the full weights and loads back into transformers as a plain model."""
    from transformers import AutoModelForCausalLM

    single, sharded = _result(launched, 1, SPEC), _result(launched, 2, FSDP)
    start = load_file(tiny_model / "model.safetensors")
    moved = max((single["params"][k] - start[k].double()).abs().max().item() for k in start)
    assert moved > 1e-4
    assert set(sharded["params"]) == set(single["params"])
    for k, v in single["params"].items():
        diff = (sharded["params"][k] - v).abs().max().item()
        assert diff <= TOL * moved, (k, diff, TOL * moved)
    for a, b in zip(single["metrics"], sharded["metrics"], strict=True):
        for key in ("reward/mean", "accuracy", "data_position", "eval/accuracy"):
            assert a.get(key) == b.get(key), (a["step"], key)
    ckpt = sharded["dir"] / "checkpoints" / "step-0000003"
    assert json.loads((ckpt / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    model = AutoModelForCausalLM.from_pretrained(ckpt)
    assert type(model).__name__ == "LlamaForCausalLM"


def _torchrun(module_args: list[str], env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    args = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "2",
            "--master_addr", "127.0.0.1", "--master_port", str(free_port()), "-m", *module_args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RLVR_DIST_TIMEOUT_S": "60", **(env or {})}
    return subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def _check(tmp_path, models_dir, name: str) -> list[dict]:
    proc = _torchrun(["tests.dist_checks", name, str(tmp_path), str(models_dir)])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(2)]


@ONE_PATH
def test_fsdp_weights_reach_vllm_whole(tmp_path, models_dir):
    """Defect 5: under FSDP2 the state dict holds DTensor shards even inside ``gathered()``, and vLLM's
    loader (param.data.copy_) fails on them ("mixed torch.Tensor and DTensor"). The engine's weights are
    whole plain tensors, equal to the unsharded model's, on every rank."""
    for found in _check(tmp_path, models_dir, "vllm_push"):
        assert found["names_match"] and found["items"] == found["whole"] > 0, found
        assert found["plain"] == found["equal"] == found["items"], found


@ONE_PATH
def test_fsdp_cpu_job_shards_on_a_cpu_mesh_where_the_host_has_a_gpu(tmp_path, models_dir):
    """Defect 10: FSDP2's default mesh is the host's accelerator, so a ``train.device: cpu`` job on a
    GPU host got a cuda mesh over its gloo group. The mesh follows the job's device."""
    for found in _check(tmp_path, models_dir, "cpu_mesh"):
        assert found["dtensors"] == found["params"] > 0 and found["meshes"] == ["cpu"], found
        assert found["devices"] == ["cpu"], found


@ONE_PATH
def test_fsdp_ranks_with_uneven_generate_calls_do_not_deadlock(tmp_path, models_dir):
    """Defect 6: every FSDP generate call all-gathers the shards on every rank, so ranks must call it
    equally often. Here rank 0's groups are all dead and resampled while rank 1's are not, and the
    held-out set (65 problems, 8 samples each: chunks of 32) splits 33 / 32 — two chunks on rank 0, one
    on rank 1. Before, rank 0 waited alone in an all-gather until the distributed timeout (60 s here:
    short, yet far above any wait between two ranks of this tiny job on a loaded machine)."""
    spec = {**SPEC, "data": {"eval_size": 65},
            "algo": {**SPEC["algo"], "zero_variance": "resample", "resample_rounds": 1},
            "train": {**SPEC["train"], "steps": 2, "fsdp": True, "eval_samples": 8}}
    run = tmp_path / "run"
    run.mkdir()
    (run / "spec.json").write_text(json.dumps(spec))
    proc = _torchrun(["tests.scripted_engine", str(run / "spec.json"), str(run), str(models_dir)],
                     env={"RLVR_TEST_ENGINE": "skewed"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert all(r["resampled_groups"] > 0 for r in rows[1:])  # the uneven path ran every step
    assert all("eval/pass@8" in r for r in (rows[0], rows[-1]))


@ONE_PATH
def test_fsdp2_with_skipped_rows_matches_one_process(launched, tiny_model):
    """Plain GRPO (no entropy, KL or value term): zero-variance groups' rows carry no loss. One process skips
    them; sharded ranks must run the same forwards, so they run every row (and report them: no extra forward
    of the skipped rows on one rank alone). Same parameters as one process."""
    single, sharded = _result(launched, 1, PLAIN), _result(launched, 2, PLAIN_FSDP)
    assert any(0 < m.get("update/skipped_row_frac", 0) for m in single["metrics"])
    start = load_file(tiny_model / "model.safetensors")
    moved = max((single["params"][k] - start[k].double()).abs().max().item() for k in start)
    for k, v in single["params"].items():
        assert (sharded["params"][k] - v).abs().max().item() <= TOL * moved, k
