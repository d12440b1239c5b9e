"""Device selection, proven on a CPU machine: CUDA's presence mocked, CUDA_VISIBLE_DEVICES parsed, and
the chosen device reaching the policy, the reference, the critic and the engine."""
from __future__ import annotations

import os

import pytest
import torch

from trainer import devices


def _cuda(monkeypatch, n: int):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: n)


@pytest.mark.parametrize("n,pref,rank,want", [
    (0, "auto", 0, "cpu"), (2, "auto", 0, "cuda:0"), (2, "auto", 1, "cuda:1"), (2, "cpu", 1, "cpu"),
    (1, "cuda", 0, "cuda:0"),
])
def test_select_picks_this_ranks_gpu_or_the_cpu(monkeypatch, n, pref, rank, want):
    _cuda(monkeypatch, n)
    assert str(devices.select(pref, rank)) == want


@pytest.mark.parametrize("n,pref,want", [(0, "auto", "cpu"), (1, "auto", "cuda:0"), (2, "auto", "cuda:1"),
                                         (4, "cuda", "cuda:1"), (2, "cpu", "cpu")])
def test_the_async_producer_gets_a_gpu_of_its_own_when_there_are_two(monkeypatch, n, pref, want):
    _cuda(monkeypatch, n)
    assert str(devices.producer_device(pref)) == want


def test_select_refuses_what_is_not_there(monkeypatch):
    _cuda(monkeypatch, 0)
    with pytest.raises(devices.DeviceError, match="no CUDA device is visible"):
        devices.select("cuda")
    _cuda(monkeypatch, 1)
    with pytest.raises(devices.DeviceError, match="rank 1 needs its own GPU but only 1 are visible"):
        devices.select("auto", 1)


def test_gpu_worker_commands_give_each_worker_one_gpu(monkeypatch):
    from service.worker.gpus import commands

    cmds = commands("0,3", "train")
    assert [env["CUDA_VISIBLE_DEVICES"] for _, env in cmds] == ["0", "3"]
    assert all(env["RLVR_GPU_WORKER"] == "1" and argv[argv.index("-c") + 1] == "1" for argv, env in cmds)
    assert len({env["RLVR_WORKER_NAME"] for _, env in cmds}) == 2
    _cuda(monkeypatch, 2)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert [env["CUDA_VISIBLE_DEVICES"] for _, env in commands("all", "train")] == ["0", "1"]
    for bad in ("0,0", "", "0;rm -rf /", "x"):
        with pytest.raises(devices.DeviceError):
            commands(bad, "train")


def test_gpus_all_keeps_the_ids_of_an_inherited_gpu_list(monkeypatch):
    """Defect 9: under CUDA_VISIBLE_DEVICES=2,3 this process's GPUs 0 and 1 are physical 2 and 3, and
    `--gpus all` gave its children CUDA_VISIBLE_DEVICES=0 and 1: other GPUs."""
    from service.worker.gpus import commands

    _cuda(monkeypatch, 2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert [env["CUDA_VISIBLE_DEVICES"] for _, env in commands("all", "train")] == ["2", "3"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-5e1f3a2b, 7")
    assert devices.visible_gpus("all") == ["GPU-5e1f3a2b", "7"]


def test_gpu_workers_get_a_fresh_process_per_job(monkeypatch):
    from service.worker.celery_app import make_celery

    assert make_celery().conf.worker_max_tasks_per_child is None
    monkeypatch.setenv("RLVR_GPU_WORKER", "1")
    assert make_celery().conf.worker_max_tasks_per_child == 1


def test_the_chosen_device_reaches_every_model(tmp_path, models_dir):
    """setup() places the policy, the reference, a separate critic and its value head, and the engine's
    model on the run's device ('meta' stands in for a GPU here: placement without compute)."""
    from trainer.config import JobSpec
    from trainer.distributed import Dist
    from trainer.loop import setup

    spec = JobSpec.model_validate({"algorithm": "ppo", "ppo": {"critic": "builtin:tiny-arith", "kl_reward_coef": 0.1},
                                   "data": {"eval_size": 4}, "train": {"steps": 1, "prompts_per_step": 2}})
    run = setup(spec, tmp_path / "run", models_dir, Dist(device=torch.device("meta")), log=lambda m: None)
    ctx = run.ctx
    where = lambda m: {p.device.type for p in m.parameters()}  # noqa: E731
    assert where(ctx.policy) == {"meta"} and where(ctx.ref) == {"meta"}
    assert {p.device.type for p in ctx.estimator.parameters()} == {"meta"}
    assert ctx.engine.model is ctx.policy


_FAULTS = """
import json, resource, sys, torch
from trainer import devices
if sys.argv[1] == "keep":
    assert devices.keep_freed_memory()
faults = []
for step in range(20):  # a training step's pattern: the same big tensors allocated, then all freed
    r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    xs = [torch.ones(16 * 2**20) for _ in range(3)]  # 64 MB each: glibc maps such blocks on their own
    del xs
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0)
print(json.dumps(faults))  # page faults per step
"""


@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="glibc malloc setting")
def test_freed_memory_is_reused_instead_of_faulted_in_again():
    """Three 64 MB tensors allocated and freed, step after step: with glibc's defaults every step faults
    all their pages in again; with the trainer's setting (trainer.devices.keep_freed_memory) the heap
    grows for the first steps, then later steps reuse it. It grows because torch's 64-byte-aligned
    allocations ask for a little more than the block one just freed, so a freed block is reused only once
    it has merged with a free neighbour: measured here the heap stopped growing after 3-6 steps (ASLR
    moves the alignment), so the last 5 of 20 steps are checked."""
    import json
    import subprocess
    import sys

    def faults(mode: str) -> list[int]:
        out = subprocess.run([sys.executable, "-c", _FAULTS, mode], capture_output=True, text=True, check=True,
                             timeout=120)
        return json.loads(out.stdout.strip().splitlines()[-1])

    pages = 3 * 64 * 2**20 // 4096
    assert all(f > pages // 2 for f in faults("default"))  # every step: the blocks came back page by page
    keep = faults("keep")
    assert keep[0] > pages // 2                        # the first step maps the heap in
    assert all(f < pages // 100 for f in keep[-5:]), keep  # then the freed blocks are reused


@pytest.mark.parametrize("gpus", [0, 2])
def test_a_worker_refuses_more_ranks_than_it_has_devices_before_starting_any(monkeypatch, tmp_path, gpus):
    """Issue 33: `train.world_size: 1024` made the worker start 1023 local processes. It now starts none."""
    import subprocess

    from trainer import distributed

    _cuda(monkeypatch, gpus)
    have = distributed.local_devices("auto")
    assert have == (gpus or len(os.sched_getaffinity(0)))
    started = []
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: started.append(a) or pytest.fail("a rank started"))
    with pytest.raises(distributed.DistributedError, match="train.world_size = 1024"):
        with distributed.group(1024, "{}", tmp_path, tmp_path):
            pass
    assert started == [] and not (tmp_path / "job-spec.json").exists()
