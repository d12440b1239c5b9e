"""Asynchronous rollouts (``rollout.max_staleness: k`` > 0): a producer process samples and scores the
next groups while the trainer updates, so neither waits for the other.

- The producer is its own process (``python -m trainer.producer``; a subprocess, not multiprocessing:
  Celery's prefork children are daemonic and may not fork multiprocessing children) with its own copy of
  the policy, its own threads, the job's engine and verifiers (scoring overlaps too) and the prompt
  stream. Its device (trainer.devices.producer_device): a GPU of its own when the job's process sees
  two or more, else the trainer's (one GPU holds both; vLLM there never sleeps: it samples all the
  time), else the CPU. Each batch is :func:`trainer.online.sample_batches`' output, tagged with the
  policy version that sampled it and the stream position after it, sent over a local socket.
- Weights: after every optimiser step the trainer writes its parameters into one shared-memory buffer
  (a seqlock: the version word is odd while writing) and the producer copies them in before its next
  batch whenever the version moved. One machine; across machines (``train.producer: ray``) the same loop
  runs in a Ray actor, its weights through Ray's object store (trainer/cluster/producer.py).
- Staleness: the trainer's version is the number of optimiser steps taken. A batch sampled at version v
  and consumed at version t is t - v old; older than k and it is dropped (counted), never used. The
  producer runs at most k batches ahead, so with k = 1 every trained group is at most one version old.
- Bigger calls: the producer may sample m = ``rollout.producer_batches`` training batches in one engine
  call (default (k + 1) // 2): a decode batch twice as big costs much less than twice as much on a CPU
  (SmolLM2, one thread: 64 rows ≈ 1.2× the time of 32). It starts a call only with m batches of room, so
  every batch still stays within k; with m ≤ (k + 1) // 2 it starts the next call before the trainer
  runs dry. The synchronous loop cannot do this: it needs the update before it may sample again.
- The loss uses the behaviour policy's log-probs (recorded by the engine at sampling time): the
  trainer's TIS weights min(π_trainer / π_behaviour, tis_cap) are decoupled PPO's correction for the lag
  (tis_cap defaults to 2 here).
- Resume: a checkpoint records the stream position of the last batch the trainer *consumed*; batches in
  flight are regenerated after a resume (from the restored weights), so k > 0 is well-defined, not exact.
  Pause and cancel stop the producer; a producer that dies is restarted once (same version, same
  position), then the job fails with the reason.
"""
from __future__ import annotations

import json
import os
import pickle
import secrets
import subprocess
import sys
import tempfile
import threading
import time
from multiprocessing import shared_memory
from multiprocessing.connection import Client, Listener
from pathlib import Path
from typing import Any

import torch

START_TIMEOUT_S = 300.0   # the producer loads the model and the verifiers
BATCH_TIMEOUT_S = 1800.0  # one batch, at most (the step watchdog fires earlier in the service)
_HEADER = 64              # bytes before the weights: the version word, aligned


class ProducerError(RuntimeError):
    """The rollout producer died twice, or answered nothing in time."""


# ---------------------------------------------------------------------------------------------- weights
def _layout(model) -> tuple[list[tuple[str, tuple, int]], torch.dtype, int]:
    params = [(n, p) for n, p in model.state_dict().items()]
    dtypes = {p.dtype for _, p in params}
    if len(dtypes) != 1:
        raise ValueError(f"async rollouts need one parameter dtype, found {dtypes}")
    out, off = [], 0
    for n, p in params:
        out.append((n, tuple(p.shape), off))
        off += p.numel()
    return out, dtypes.pop(), off


class SharedWeights:
    """The policy's weights in one shared-memory buffer, versioned with a seqlock."""

    def __init__(self, model=None, name: str | None = None, meta: dict | None = None):
        if name is None:
            layout, dtype, numel = _layout(model)
            self.meta = {"layout": layout, "dtype": str(dtype).removeprefix("torch."), "numel": numel}
            size = _HEADER + numel * torch.empty((), dtype=dtype).element_size()
            self.shm = shared_memory.SharedMemory(create=True, size=size)
        else:
            self.meta = meta
            self.shm = shared_memory.SharedMemory(name=name)
            # attaching registers the segment with this process's resource tracker, which would unlink
            # it when this process exits (Python < 3.13): the trainer owns it, so let go of it here
            from multiprocessing import resource_tracker

            resource_tracker.unregister(self.shm._name, "shared_memory")
        self.dtype = getattr(torch, self.meta["dtype"])
        self._version = torch.frombuffer(self.shm.buf, dtype=torch.int64, count=1)
        self._flat = torch.frombuffer(self.shm.buf, dtype=self.dtype, count=self.meta["numel"], offset=_HEADER)

    @property
    def name(self) -> str:
        return self.shm.name

    def write(self, model, version: int) -> None:
        self._version[0] = 2 * version + 1  # odd: a write is under way
        sd = model.state_dict()
        with torch.no_grad():
            for n, shape, off in self.meta["layout"]:
                t = sd[n]
                self._flat[off : off + t.numel()].copy_(t.detach().reshape(-1))
        self._version[0] = 2 * version

    def version(self) -> int:
        v = int(self._version[0])
        return -1 if v % 2 else v // 2

    def read_into(self, model) -> int:
        """Copy the newest complete weights into ``model``; returns their version."""
        sd = model.state_dict()
        while True:
            v1 = int(self._version[0])
            if v1 % 2:
                time.sleep(0.001)
                continue
            with torch.no_grad():
                for n, shape, off in self.meta["layout"]:
                    t = sd[n]
                    t.copy_(self._flat[off : off + t.numel()].view(shape))
            if int(self._version[0]) == v1:
                return v1 // 2

    def close(self, unlink: bool = False) -> None:
        del self._version, self._flat
        self.shm.close()
        if unlink:
            self.shm.unlink()


def _loads(data: bytes) -> Any:
    # plain pickle, not the connection's: torch would pass tensors as file descriptors through a
    # resource sharer that only processes of one multiprocessing family can reach
    return pickle.loads(data)


# ---------------------------------------------------------------------------------------------- trainer side
class AsyncRollouts:
    """The trainer's end: starts the producer, publishes weights, hands out batches no older than k."""

    def __init__(self, spec, run_dir: Path, models_dir: Path, policy, position: int, version: int,
                 log=print, restarts: int = 1, prelude: str | None = None):
        """``prelude``: "module:function" the producer calls before it builds anything (a plugin that
        registers an engine, a test double); default: $RLVR_PRODUCER_PRELUDE, else none."""
        self.prelude = prelude or os.environ.get("RLVR_PRODUCER_PRELUDE")
        self.spec, self.k, self.log = spec, spec.rollout.max_staleness, log
        self.run_dir, self.models_dir = Path(run_dir), Path(models_dir)
        self.weights = SharedWeights(policy)
        self.version = version
        self.weights.write(policy, version)
        self.restarts = restarts
        self.dropped = 0
        self._sock_dir = tempfile.mkdtemp(prefix="rlvr-producer-")
        self._key = secrets.token_bytes(32)
        self._listener = Listener(str(Path(self._sock_dir) / "sock"), family="AF_UNIX", authkey=self._key)
        self._start(position)

    def _start(self, position: int) -> None:
        cfg = {"spec": self.spec.model_dump(mode="json"), "models_dir": str(self.models_dir),
               "socket": self._listener.address, "shm": self.weights.name, "meta": self.weights.meta,
               "position": position, "prelude": self.prelude}
        cfg_file = self.run_dir / "producer.json"
        self.run_dir.mkdir(parents=True, exist_ok=True)
        cfg_file.write_text(json.dumps(cfg))
        env = {**os.environ, "RLVR_PRODUCER_KEY": self._key.hex()}
        log = open(self.run_dir / "producer.log", "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "trainer.producer", str(cfg_file)], env=env,
                                     stdout=log, stderr=subprocess.STDOUT,
                                     cwd=Path(__file__).resolve().parent.parent)
        box: dict[str, Any] = {}

        def accept() -> None:
            try:
                box["conn"] = self._listener.accept()
            except OSError as e:  # the listener closed under us
                box["error"] = e

        waiter = threading.Thread(target=accept, daemon=True, name="producer-accept")
        waiter.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while waiter.is_alive() and self.proc.poll() is None and time.monotonic() < deadline:
            waiter.join(0.5)
        if "conn" not in box:
            self.proc.kill()
            raise ProducerError(f"the rollout producer did not start (exit code {self.proc.poll()}; see "
                                "producer.log)")
        self.conn = box["conn"]

    def publish(self, policy, version: int) -> None:
        """After an optimiser step: the producer samples with these weights from its next batch on."""
        self.version = version
        self.weights.write(policy, version)

    def next(self) -> tuple[Any, int, dict[str, float]]:
        """(groups, their staleness, timing) — the oldest batch still within k versions."""
        t0 = time.perf_counter()
        while True:
            msg = self._recv()
            stale = self.version - msg["version"]
            self._take()  # room for one more batch ahead
            if stale <= self.k:
                return msg["groups"], stale, {"async/trainer_wait_s": time.perf_counter() - t0,
                                              "async/producer_wait_s": msg["waited_s"],
                                              "async/producer_busy_s": msg["busy_s"],
                                              "async/batches_per_call": msg["batches_per_call"],
                                              "async/data_position": msg["position"]}
            self.dropped += 1

    def _take(self) -> None:
        try:
            self.conn.send(("take", None))
        except OSError:  # the producer just died: the next receive notices and restarts it
            pass

    def _recv(self) -> dict:
        deadline = time.monotonic() + BATCH_TIMEOUT_S
        while True:
            if self.conn.poll(0.2):
                try:
                    return _loads(self.conn.recv_bytes())
                except (EOFError, OSError):
                    pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self._restart()
                deadline = time.monotonic() + BATCH_TIMEOUT_S

    def _restart(self) -> None:
        code = self.proc.poll()
        why = f"exit code {code}" if code is not None else "no batch in time"
        if self.restarts <= 0:
            raise ProducerError(f"the rollout producer failed ({why}) and was already restarted; see producer.log")
        self.restarts -= 1
        self.log(f"rollout producer failed ({why}): restarting it")
        self.proc.kill()
        self.proc.wait(timeout=30)
        self._start(self.position_hint)

    position_hint = 0  # the stream position a restarted producer starts from (set by the loop)

    def close(self) -> None:
        try:
            self.conn.send(("stop", None))
        except (OSError, AttributeError):
            pass
        if getattr(self, "proc", None) is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._listener.close()
        self.weights.close(unlink=True)


# ---------------------------------------------------------------------------------------------- producer side
def sampler(spec, models_dir: Path, position: int):
    """The producer's sampling context: the policy and the job's engine on the producer's own device
    (trainer.devices.producer_device), its verifiers and the prompt stream from ``position``."""
    from .context import Ctx
    from .data import PromptStream
    from .devices import producer_device
    from .distributed import Dist
    from .engines import job_engine
    from .models.load import load_models
    from .models.resolve import resolve_model
    from .scoring import Scorer
    from .splits import load_splits

    dist = Dist(device=producer_device(spec.train.device))
    model_dir = resolve_model(spec.model.path, Path(models_dir), log=lambda m: None)
    policy, _, tok = load_models(spec, model_dir, None, dist, reference=False)
    policy.eval()
    train_set, _ = load_splits(spec.data)
    stream = PromptStream(train_set, seed=spec.train.seed, position=position)
    from .episodes import tools_for

    return Ctx(spec, dist, policy, None, tok, job_engine(spec, policy, tok, dist, sleep=False),
               Scorer(spec.verifiers), stream, None, None, None, tools=tools_for(spec, 0))


def prepare(spec) -> None:
    """This process as a producer: its threads, kernels, allocator and its own sampling stream."""
    from .devices import deterministic, keep_freed_memory

    torch.set_num_threads(spec.rollout.producer_threads)
    deterministic(spec.train.deterministic)
    keep_freed_memory()
    torch.manual_seed(spec.train.seed + 10_007)  # its own sampling stream, apart from the trainer's


def prelude(name: str | None) -> None:
    """Call "module:function" before anything is built (a plugin that registers an engine, a test double)."""
    if name:
        import importlib

        module, _, fn = name.partition(":")
        getattr(importlib.import_module(module), fn)()


def main(cfg_file: str) -> int:
    from .config import JobSpec

    cfg = json.loads(Path(cfg_file).read_text())
    prelude(cfg.get("prelude"))
    spec = JobSpec.model_validate(cfg["spec"])
    prepare(spec)
    conn = Client(cfg["socket"], family="AF_UNIX", authkey=bytes.fromhex(os.environ["RLVR_PRODUCER_KEY"]))
    weights = SharedWeights(name=cfg["shm"], meta=cfg["meta"])
    return serve(spec, sampler(spec, Path(cfg["models_dir"]), cfg["position"]), conn, weights)


def serve(spec, ctx, conn, weights) -> int:
    """The producer's loop, whatever carries it: ``conn.recv()`` gives credits ("take") or "stop",
    ``conn.send_bytes`` takes a pickled batch, ``weights`` has ``version()`` and ``read_into(model)`` —
    a local socket and shared memory here, Ray in trainer/cluster/producer.py."""
    from .engines.weights import changed
    from .online import sample_batches

    policy = ctx.policy
    m = spec.rollout.batches_per_call(spec.algo.zero_variance == "resample")
    ahead, have = spec.rollout.max_staleness, -1  # credits: batches it may sample before the trainer takes one
    t0 = time.perf_counter()
    while True:
        while ahead < m:  # a call samples m batches: wait until the trainer has taken enough
            cmd, _ = conn.recv()
            if cmd == "stop":
                return 0
            ahead += 1
        t1 = time.perf_counter()
        waited = t1 - t0  # idle since the last call: sends the trainer was not reading yet, then credits
        if weights.version() != have:
            have = weights.read_into(policy)
            changed(policy)  # its engine (vLLM) pushes the new weights before sampling
        batches = sample_batches(ctx, m)
        t0 = time.perf_counter()
        for grp, position in batches:
            conn.send_bytes(pickle.dumps({"groups": grp, "version": have, "position": position, "waited_s": waited,
                                          "busy_s": (t0 - t1) / m, "batches_per_call": m},
                                         protocol=pickle.HIGHEST_PROTOCOL))
            waited = 0.0  # the wait is counted once, with the call's first batch
        ahead -= m


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
