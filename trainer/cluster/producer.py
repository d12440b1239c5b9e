"""The asynchronous rollout producer as a Ray actor (``train.producer: ray``): sampling on another node.

The producer runs today's loop (trainer.producer.serve: credits, batches of m, the staleness bound) in a
thread of its actor; only the carriers change. Batches come back as the answers of ``get`` calls, credits
and stop go as ``take`` / ``stop`` calls. Weights go through Ray's object store: after every optimiser step
the trainer puts its parameters as one flat buffer (``ray.put``) and hands the producer the reference; the
producer fetches the newest one before its next call when the version moved — as it reads the shared
buffer today. Why not a torch.distributed broadcast to the producer: a collective needs both sides in it at
once, so the trainer would wait for the producer to finish its sampling call before it could go on, the
very wait asynchronous rollouts remove; the object store lets the trainer publish and go on, and the
producer pull when it is ready, on CPUs and GPUs alike (a GPU model is copied to host memory once per
step; an NCCL broadcast would be the faster carrier for large models on GPUs).

Placement: inside a job's placement group (rank 0 creates the producer) it takes the group's last bundle —
its own GPU or ``rollout.producer_threads`` CPUs, on another node when the strategy spreads; elsewhere (a
trainer that is not in a group, as in bench/async.py) an actor of those resources wherever the cluster has
them. The producer belongs to the rank that created it: it dies with it, and with the group.
"""
from __future__ import annotations

import pickle
import queue
import threading
import time
import warnings
from pathlib import Path

import torch

from .. import producer as local
from . import START_TIMEOUT_S, job_env

GET_POLL_S = 1.0  # a get() waiting for a batch looks this often whether the loop has died


class _Carrier:
    """What trainer.producer.serve talks to inside the actor: a queue of commands in, of batches out."""

    def __init__(self):
        self.commands: queue.Queue = queue.Queue()
        self.batches: queue.Queue = queue.Queue()

    def recv(self):
        return self.commands.get()

    def send_bytes(self, data: bytes) -> None:
        self.batches.put(data)


class _Weights:
    """The newest published weights: (version, object ref), fetched into the model on read."""

    def __init__(self, meta: dict):
        self.meta, self.latest, self.lock = meta, (-1, None), threading.Lock()

    def offer(self, version: int, ref) -> None:
        with self.lock:  # a threaded actor may run two offers out of order: keep the newest
            if version > self.latest[0]:
                self.latest = (version, ref)

    def version(self) -> int:
        return self.latest[0]

    def read_into(self, model) -> int:
        import ray

        with self.lock:
            version, ref = self.latest
        flat = ray.get(ref, timeout=local.BATCH_TIMEOUT_S)
        with warnings.catch_warnings():  # the store's buffer is read-only; it is only read from
            warnings.simplefilter("ignore", UserWarning)
            values = torch.from_numpy(flat).view(getattr(torch, self.meta["dtype"]))
        sd = model.state_dict()
        with torch.no_grad():
            for n, shape, off in self.meta["layout"]:
                t = sd[n]
                t.copy_(values[off: off + t.numel()].view(shape))
        return version


class ProducerActor:
    def __init__(self, spec_json: str, models_dir: str, position: int, meta: dict, env: dict, prelude):
        import os

        os.environ.update(env)
        from ..config import JobSpec

        local.prelude(prelude)
        spec = JobSpec.model_validate_json(spec_json)
        local.prepare(spec)
        self.carrier, self.weights = _Carrier(), _Weights(meta)
        ctx = local.sampler(spec, Path(models_dir), position)
        self.error: BaseException | None = None

        def loop() -> None:
            try:
                local.serve(spec, ctx, self.carrier, self.weights)
            except BaseException as e:  # handed to the trainer by its next get()
                self.error = e

        self.thread = threading.Thread(target=loop, daemon=True, name="producer")
        self.thread.start()

    def where(self) -> dict:
        import os

        import ray

        return {"node": ray.get_runtime_context().get_node_id(), "ip": ray.util.get_node_ip_address(),
                "pid": os.getpid()}

    def offer(self, version: int, refs: list) -> None:
        self.weights.offer(version, refs[0])  # in a list: Ray passes the reference, not the weights

    def take(self) -> None:
        self.carrier.commands.put(("take", None))

    def stop(self) -> None:
        self.carrier.commands.put(("stop", None))

    def get(self, timeout_s: float) -> bytes:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return self.carrier.batches.get(timeout=GET_POLL_S)
            except queue.Empty:
                if self.error is not None:
                    raise self.error
                if not self.thread.is_alive() or time.monotonic() > deadline:
                    raise TimeoutError(f"no batch within {timeout_s:g} s")


class RayRollouts(local.AsyncRollouts):
    """The trainer's end for a producer actor: the same hand-out of batches within k versions
    (AsyncRollouts.next), with weights through the object store and batches through actor calls."""

    def __init__(self, spec, run_dir: Path, models_dir: Path, policy, position: int, version: int,
                 log=print, restarts: int = 1, prelude: str | None = None):
        import os

        self.prelude = prelude or os.environ.get("RLVR_PRODUCER_PRELUDE")
        self.spec, self.k, self.log = spec, spec.rollout.max_staleness, log
        self.run_dir, self.models_dir = Path(run_dir), Path(models_dir)
        layout, dtype, numel = local._layout(policy)
        self.meta = {"layout": layout, "dtype": str(dtype).removeprefix("torch."), "numel": numel}
        self.restarts, self.dropped, self.actor = restarts, 0, None
        self.gpu = next(policy.parameters()).device.type == "cuda"  # a trainer on a GPU: the producer gets one
        self.version = version
        self._put(policy)
        self._start(position)

    def _put(self, policy) -> None:
        import ray

        with torch.no_grad():
            flat = torch.cat([t.detach().reshape(-1).cpu() for t in policy.state_dict().values()])
        self._ref = ray.put(flat.view(torch.uint8).numpy())  # bytes: bf16 has no numpy dtype

    def _start(self, position: int) -> None:
        import ray

        pg = ray.util.get_current_placement_group()
        if pg is not None:  # the job's group: its last bundle is the producer's
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            index = len(pg.bundle_specs) - 1
            want = pg.bundle_specs[index]
            where = {"scheduling_strategy": PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=index)}
        else:
            want = {"CPU": float(self.spec.rollout.producer_threads), "GPU": 1.0 if self.gpu else 0.0}
            where = {}
        self.actor = ray.remote(ProducerActor).options(
            num_cpus=want.get("CPU", 1), num_gpus=want.get("GPU", 0), max_concurrency=4, **where,
        ).remote(self.spec.model_dump_json(), str(self.models_dir), position, self.meta, job_env(), self.prelude)
        try:
            self.where = ray.get(self.actor.where.remote(), timeout=START_TIMEOUT_S)
        except (ray.exceptions.RayError, TimeoutError) as e:
            raise local.ProducerError(f"the rollout producer did not start: {e}") from None
        self.actor.offer.remote(self.version, [self._ref])
        self.log(f"rollout producer on node {self.where['node'][:12]} ({self.where['ip']})")

    def publish(self, policy, version: int) -> None:
        self.version = version
        self._put(policy)
        self.actor.offer.remote(version, [self._ref])

    def _take(self) -> None:
        self.actor.take.remote()  # a dead actor: the next get() notices and restarts it

    def _recv(self) -> dict:
        import ray

        while True:
            try:
                data = ray.get(self.actor.get.remote(local.BATCH_TIMEOUT_S), timeout=local.BATCH_TIMEOUT_S + 60)
                return pickle.loads(data)
            except (ray.exceptions.RayError, TimeoutError) as e:
                self._restart_actor(e)

    def _restart_actor(self, why: Exception) -> None:
        import ray

        if self.restarts <= 0:
            raise local.ProducerError(f"the rollout producer failed ({_short(why)}) and was already restarted")
        self.restarts -= 1
        self.log(f"rollout producer failed ({_short(why)}): restarting it")
        ray.kill(self.actor, no_restart=True)
        self._start(self.position_hint)

    def close(self) -> None:
        import ray

        if self.actor is not None:
            try:
                ray.kill(self.actor, no_restart=True)  # nothing of it needs saving: in-flight batches are resampled
            except Exception:  # already gone
                pass
            self.actor = None


def _short(e: Exception) -> str:
    return " ".join(str(e).split())[:300]
