"""One rank of a job as a Ray actor: today's rank code (trainer.loop.train, whose distributed.group takes the
env:// path torchrun ranks take) with the rendezvous set for it.

Rank 0 also keeps what the local path hands the worker's callbacks in-process — the first event, step
records, rollouts, evals, log lines — as events the driver drains (trainer/cluster/driver.py), and answers
``should_stop`` with the request the driver last forwarded. The actor is threaded (``max_concurrency``):
``run`` trains on one thread while ``drain`` and ``stop`` answer on others.
"""
from __future__ import annotations

import faulthandler
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any


class RankActor:
    def __init__(self, rank: int, world: int, env: dict[str, str], run_dir: str):
        os.environ.update(env)  # before trainer.distributed reads RLVR_DIST_TIMEOUT_S at import
        self.rank, self.world = rank, world
        self._events: list[tuple] = []
        self._lock = threading.Lock()
        self._stop: str | None = None
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        # the run dir is shared storage (checkpoints live there): the driver reads a dead rank's tail from it
        self._log = open(Path(run_dir) / f"rank-{rank}.log", "a", encoding="utf-8", buffering=1)
        faulthandler.enable(self._log)  # a fatal signal (SIGSEGV, abort) leaves its traceback in the log

    def where(self) -> dict[str, Any]:
        import ray

        ctx = ray.get_runtime_context()
        return {"rank": self.rank, "node": ctx.get_node_id(), "ip": ray.util.get_node_ip_address(),
                "pid": os.getpid()}

    def rendezvous(self) -> tuple[str, int]:
        """Rank 0: its node's address and a free port there for the group's store (MASTER_ADDR/PORT)."""
        import ray

        with socket.socket() as s:
            s.bind(("", 0))
            return ray.util.get_node_ip_address(), s.getsockname()[1]

    def log(self, msg: str) -> None:
        self._log.write(f"{time.strftime('%H:%M:%S')} [rank {self.rank}] {msg}\n")
        if self.rank == 0:
            self._event("log", msg)

    def _event(self, *ev) -> None:
        with self._lock:
            self._events.append(ev)

    def drain(self) -> list[tuple]:
        with self._lock:
            out, self._events = self._events, []
        return out

    def stop(self, request: str) -> None:
        self._stop = request

    def run(self, spec_json: str, run_dir: str, models_dir: str, master: tuple[str, int], prelude: str | None):
        os.environ.update({"WORLD_SIZE": str(self.world), "RANK": str(self.rank), "LOCAL_RANK": "0",
                           # one device per bundle: Ray narrows CUDA_VISIBLE_DEVICES to this actor's GPU
                           "MASTER_ADDR": master[0], "MASTER_PORT": str(master[1])})
        from ..config import JobSpec
        from ..loop import train
        from ..producer import prelude as call_prelude

        call_prelude(prelude)
        spec = JobSpec.model_validate_json(spec_json)
        self.log(f"rank {self.rank} of {self.world} starting; group store at {master[0]}:{master[1]}")
        hooks: dict[str, Any] = {}
        if self.rank == 0:
            hooks = {"on_step": lambda s, m: self._event("step", s, m),
                     "on_rollouts": lambda s, g: self._event("rollouts", s, g),
                     "on_start": lambda info: self._event("start", info),
                     "on_eval": lambda s, r: self._event("eval", s, r),
                     "should_stop": lambda: self._stop}
        try:
            result = train(spec, run_dir, models_dir=models_dir, log=self.log, **hooks)
        except BaseException as e:
            self.log(f"failed: {type(e).__name__}: {e}")
            raise
        self.log(f"finished: {result.status} at step {result.step}")
        return result
