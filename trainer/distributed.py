"""Data-parallel training inside one job: torch.distributed with manual gradient all-reduce.

Every rank runs the same loop on its slice of the global batch (prompts ``[rank*P/W, (rank+1)*P/W)``).
Rewards and small per-sample lists are gathered so every rank computes the same advantages and
metrics; the losses are normalised by GLOBAL token/sequence counts (trainer.algos aggregations), so
summing the ranks' gradients gives exactly the single-process gradient on the whole batch and the
parameters stay identical on every rank without broadcasting them.

Two ways in:
- under ``torchrun --nproc_per_node W -m trainer.rank job.json RUN_DIR MODELS_DIR``
  (WORLD_SIZE/RANK/MASTER_* set by the launcher);
- ``train.world_size: W`` in the job spec: the process that calls ``trainer.loop.train`` (the service's
  worker) becomes rank 0 and starts ranks 1..W-1 itself as ``python -m trainer.rank``
  subprocesses (subprocesses, not multiprocessing: Celery's prefork children are daemonic and may not
  fork multiprocessing children). Rank 0 alone writes metrics and checkpoints and answers stop requests;
- as Ray actors on several machines (trainer/cluster), each with WORLD_SIZE/RANK/MASTER_* set as torchrun
  would: the env:// path again.
Backend: NCCL with one GPU per rank when CUDA is available, else gloo on CPU.
"""
from __future__ import annotations

import datetime
import os
import socket
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch

from . import devices

TIMEOUT_S = float(os.environ.get("RLVR_DIST_TIMEOUT_S", "1800"))  # one collective (and rendezvous) at most


class DistributedError(RuntimeError):
    """A rank failed or the process group could not be formed."""


class Dist:
    """One process's view of the group. With world 1 every collective is the identity."""

    def __init__(self, rank: int = 0, world: int = 1, device: torch.device | None = None):
        self.rank, self.world = rank, world
        self.device = device or torch.device("cpu")
        self.sharded = False  # FSDP: gradients arrive reduce-scattered (summed), nothing to all-reduce

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def shard(self, n: int) -> slice:
        """This rank's contiguous slice of n items (n divisible by world)."""
        if n % self.world:
            raise DistributedError(f"{n} items cannot be split evenly over {self.world} ranks")
        k = n // self.world
        return slice(self.rank * k, (self.rank + 1) * k)

    def all_sum(self, x: torch.Tensor) -> torch.Tensor:
        if self.world == 1:
            return x
        y = x.detach().clone().to(self.device)
        torch.distributed.all_reduce(y)
        return y.to(x.device)

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` in rank order (picklable, small)."""
        if self.world == 1:
            return [obj]
        out: list[Any] = [None] * self.world
        torch.distributed.all_gather_object(out, obj)
        return out

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""
        if self.world == 1:
            return obj
        box = [obj]
        torch.distributed.broadcast_object_list(box, src=0)
        return box[0]

    def sum_grads(self, params: list[torch.nn.Parameter]) -> None:
        """Sum gradients over ranks in one flat buffer (missing grads count as zeros). FSDP-sharded
        parameters (DTensors) are skipped: their gradients arrive reduce-scattered, already summed."""
        if self.world == 1:
            return
        from torch.distributed.tensor import DTensor

        params = [p for p in params if not isinstance(p, DTensor)]
        if not params:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads]).to(self.device)
        torch.distributed.all_reduce(flat)
        offset = 0
        for p, g in zip(params, grads):
            n = g.numel()
            p.grad = flat[offset : offset + n].view_as(p).to(p.device, p.dtype)
            offset += n

    def barrier(self) -> None:
        if self.world > 1:
            torch.distributed.barrier()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _init(rank: int, world: int, local_rank: int, init_method: str, device_pref: str = "auto") -> Dist:
    device = devices.select(device_pref, local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    torch.distributed.init_process_group(
        "nccl" if device.type == "cuda" else "gloo", init_method=init_method, rank=rank, world_size=world,
        timeout=datetime.timedelta(seconds=TIMEOUT_S),
    )
    return Dist(rank, world, device)


def local_devices(device: str = "auto") -> int:
    """How many ranks this worker can give a device each: its visible GPUs (CUDA_VISIBLE_DEVICES), else the
    CPU cores it may run on."""
    if device != "cpu" and torch.cuda.is_available():
        return torch.cuda.device_count()
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


@contextmanager
def group(world_size: int, spec_json: str, run_dir: Path, models_dir: Path, device: str = "auto") -> Iterator[Dist]:
    """The process group this training run belongs to (torchrun's, one we start, or none), each rank on
    the device trainer.devices picks (a GPU per rank when there are GPUs)."""
    env_world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    children: list[subprocess.Popen] = []
    if env_world > 1:  # launched by torchrun (or by our own launcher below)
        # env://: under torchrun the agent's store is reused (TORCHELASTIC_USE_AGENT_STORE)
        dist = _init(int(os.environ["RANK"]), env_world, local, "env://", device)
    elif world_size > 1:
        have = local_devices(device)
        if world_size > have:  # before any process starts: 1023 ranks on a 2-core worker is a fork bomb
            raise DistributedError(f"train.world_size = {world_size} ranks, but this worker has {have} device(s) "
                                   "for them (one rank per GPU, else per CPU core)")
        port = _free_port()
        run_dir.mkdir(parents=True, exist_ok=True)
        spec_file = run_dir / "job-spec.json"
        spec_file.write_text(spec_json, encoding="utf-8")
        for r in range(1, world_size):
            env = {**os.environ, "WORLD_SIZE": str(world_size), "RANK": str(r), "LOCAL_RANK": str(r),
                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
            log = open(run_dir / f"rank-{r}.log", "ab")
            children.append(subprocess.Popen(
                [sys.executable, "-m", "trainer.rank", str(spec_file), str(run_dir), str(models_dir)],
                env=env, stdout=log, stderr=subprocess.STDOUT, cwd=Path(__file__).resolve().parent.parent))
        try:
            dist = _init(0, world_size, 0, f"tcp://127.0.0.1:{port}", device)
        except Exception as e:
            _kill(children)
            raise DistributedError(f"could not form a group of {world_size}: {e}") from e
    else:
        dist = Dist(device=devices.select(device, local))
    ok = False
    try:
        yield dist
        ok = True
    finally:
        if dist.world > 1:
            if ok:
                torch.distributed.barrier()  # nobody tears down while a peer is mid-collective
            torch.distributed.destroy_process_group()
        if children:
            if not ok:
                _kill(children)
            _wait(children, run_dir)


def _kill(children: list[subprocess.Popen]) -> None:
    for p in children:
        if p.poll() is None:
            p.kill()
    for p in children:
        p.wait(timeout=30)


def _wait(children: list[subprocess.Popen], run_dir: Path) -> None:
    failed = []
    for r, p in enumerate(children, 1):
        try:
            rc = p.wait(timeout=120)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=30)
            rc = "timeout"
        if rc != 0:
            failed.append(f"rank {r}: exit {rc} (see {run_dir / f'rank-{r}.log'})")
    if failed:
        raise DistributedError("; ".join(failed))


# ---------------------------------------------------------------------------------------------- FSDP2
def fsdp_wrap(model, dist: Dist):
    """Shard ``model`` over the group with FSDP2 (``fully_shard``): each decoder layer, then the root.

    Gradients are SUMMED across ranks (divide factor 1): our losses are already normalised by global
    counts, exactly as with the all-reduce of the unsharded path, so both reach the same parameters."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, fully_shard

    # on the job's device: fully_shard's default mesh is the host's accelerator, a cuda mesh over a gloo
    # group (and shards moved to cuda:0) for a train.device: cpu job on a GPU host
    mesh = init_device_mesh(dist.device.type, (dist.world,))
    layers = [m for m in model.modules() if type(m).__name__.endswith("DecoderLayer")]
    for layer in layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.set_gradient_divide_factor(1.0)
    model.rlvr_share_prompts = False  # every rank must run the same forwards (see trainer.batch)
    dist.sharded = True
    return model


@contextmanager
def gathered(model) -> Iterator[None]:
    """Every FSDP2-sharded module of ``model`` unsharded for the block (one all-gather each, on every
    rank together), so that forwards inside it — generation, whose length differs between ranks — run
    no collective; resharded after. A plain model passes through."""
    from torch.distributed.fsdp import FSDPModule

    mods = [m for m in model.modules() if isinstance(m, FSDPModule)]
    for m in mods:
        m.set_reshard_after_forward(False)
        m.unshard()
    try:
        yield
    finally:
        for m in mods:
            m.reshard()
            m.set_reshard_after_forward(True)
