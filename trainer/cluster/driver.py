"""Drive one job's placement group from the process that claimed the job (the service's Celery task).

- Placement: ``placement_group`` of one bundle per rank — ``{"GPU": 1, "CPU": 1}`` when the job trains on
  GPUs (``train.device`` cuda, or auto on a cluster that has GPUs), else ``{"CPU": train.threads or 1}`` —
  plus one for a ``train.producer: ray`` rollout producer, with the spec's strategy (auto: PACK). It must
  be ready within ``place_timeout_s`` or the job fails saying what the cluster has.
- Rendezvous: rank 0's actor names its node's IP and a free port there; every rank runs with WORLD_SIZE,
  RANK, MASTER_ADDR and MASTER_PORT set (trainer/cluster/rank.py), so torch.distributed forms the group as
  under torchrun — gloo on CPUs, NCCL on GPUs.
- Callbacks: rank 0's events are drained every ``POLL_S`` and handed to this process's on_step / on_rollouts /
  on_start / on_eval / log in order; a callback that raises (a lost lease) stops the group.
- Stops: ``should_stop`` is asked every ``STOP_CHECK_S``; a request is forwarded to rank 0, which stops at
  the end of its step (checkpointing, as on the local path). A group still running ``stop_grace_s`` later
  (a hung step) is killed, and the job ends paused or cancelled at its last checkpoint all the same.
- Failures: a rank whose process or node is lost (Ray's ActorDiedError) fails the job with the rank, its
  node, Ray's reason and the tail of its log — at once, not after the collective timeout its peers would
  wait out; with ``restarts`` left the group is placed again instead and resumes from the last checkpoint.
  A Python exception in rank 0 is raised as itself (its type is the job's error code, as locally).
- Cleanup: every actor killed and the placement group removed on every way out. A driver that dies without
  that (kill -9) leaves nothing either: the actors and the group belong to its Ray job, which Ray ends.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from .. import checkpoint
from . import START_TIMEOUT_S, ClusterError, job_env, tail
from .rank import RankActor

POLL_S = 0.2         # how often rank 0's events are drained (and ranks' ends noticed)
STOP_CHECK_S = 1.0   # how often should_stop is asked (it renews the lease: a database write)
CALL_TIMEOUT_S = 60.0     # a small actor call (drain, where, rendezvous) on a live actor
SETTLE_S = 5.0       # after one rank fails, how long its peers may take to fail too (the first cause wins)
FINISH_TIMEOUT_S = 120.0  # the other ranks end after rank 0 returned (they leave the same final barrier)


class RankDied(ClusterError):
    """A rank's process or node was lost (or a rank other than 0 raised)."""

    def __init__(self, message: str, lost: bool):
        super().__init__(message)
        self.lost = lost  # the process/node died (worth a restart), not an exception in our code


def train_on_ray(spec, run_dir: str | Path, *, models_dir: str | Path, address: str | None, name: str,
                 on_step=None, should_stop=None, on_rollouts=None, on_start=None, on_eval=None,
                 log: Callable[[str], None] = print, restarts: int = 0, on_restart=None,
                 stop_grace_s: float = 60.0, place_timeout_s: float = 600.0, prelude: str | None = None):
    """Run ``spec`` as a placement group on the Ray cluster at ``address``; same callbacks and result as
    trainer.loop.train. ``name`` names the placement group (``ray list placement-groups``). ``on_restart(why,
    n)`` hears each of up to ``restarts`` re-placements after a lost rank. ``prelude``: "module:function"
    each rank calls first (default $RLVR_RANK_PRELUDE)."""
    import os

    connect(address)
    hooks = {"step": on_step, "rollouts": on_rollouts, "start": on_start, "eval": on_eval, "log": log}
    prelude = prelude or os.environ.get("RLVR_RANK_PRELUDE")
    attempt = 0
    while True:
        group = _Group(spec, Path(run_dir))
        try:
            group.start(Path(models_dir), name, place_timeout_s, prelude)
            return group.drive(hooks, should_stop, stop_grace_s, log)
        except RankDied as e:
            if not e.lost or attempt >= restarts:
                raise
            attempt += 1
            log(f"{e}; placing the group again from the last checkpoint ({attempt} of {restarts})")
            if on_restart:
                on_restart(str(e), attempt)
        finally:
            group.close()


def connect(address: str | None) -> None:
    import ray

    if not ray.is_initialized():
        # the ranks' output is in their logs (and rank 0's relayed): not interleaved into this worker's
        ray.init(address=address, log_to_driver=False, configure_logging=False)


def bundles(spec) -> tuple[list[dict[str, float]], str]:
    """The placement group this job asks for: its bundles and Ray strategy."""
    import ray

    tc = spec.train
    gpus = tc.device == "cuda" or (tc.device == "auto" and ray.cluster_resources().get("GPU", 0) > 0)
    rank = {"GPU": 1.0, "CPU": 1.0} if gpus else {"CPU": float(tc.threads or 1)}
    out = [dict(rank) for _ in range(tc.world_size)]
    if tc.producer == "ray":
        out.append({"GPU": 1.0, "CPU": 1.0} if gpus else {"CPU": float(spec.rollout.producer_threads)})
    return out, "PACK" if tc.placement == "auto" else tc.placement.upper()


class _Group:
    def __init__(self, spec, run_dir: Path):
        self.spec, self.run_dir, self.world = spec, run_dir, spec.train.world_size
        self.actors: list = []
        self.pg = None

    def start(self, models_dir: Path, name: str, place_timeout_s: float, prelude) -> None:
        """Place the group, start a rank in each bundle, set the rendezvous and start training."""
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        spec, run_dir = self.spec, self.run_dir
        want, self.strategy = bundles(spec)
        self.pg = placement_group(want, strategy=self.strategy, name=name)
        try:
            ray.get(self.pg.ready(), timeout=place_timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise ClusterError(f"the Ray cluster could not place {len(want)} bundle(s) {want[0]}"
                               f"{' + producer ' + str(want[-1]) if len(want) > self.world else ''} {self.strategy} "
                               f"within {place_timeout_s:g} s; it has {_resources()}") from None
        actor = ray.remote(RankActor)
        env = job_env()
        for r in range(self.world):
            b = want[r]
            self.actors.append(actor.options(
                num_cpus=b["CPU"], num_gpus=b.get("GPU", 0), max_concurrency=4, name=None,
                scheduling_strategy=PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=r),
            ).remote(r, self.world, env, str(run_dir)))
        try:
            self.where = ray.get([a.where.remote() for a in self.actors], timeout=START_TIMEOUT_S)
            master = ray.get(self.actors[0].rendezvous.remote(), timeout=CALL_TIMEOUT_S)
        except ray.exceptions.RayActorError as e:
            raise RankDied(f"a rank could not start: {_reason(e)}", lost=False) from None
        except ray.exceptions.GetTimeoutError:
            raise ClusterError(f"the ranks did not start within {START_TIMEOUT_S:g} s of being placed") from None
        self.refs = [a.run.remote(spec.model_dump_json(), str(run_dir), str(models_dir), master, prelude)
                     for a in self.actors]

    def drive(self, hooks: dict[str, Any], should_stop, grace_s: float, log):
        import ray

        pending = dict(zip(self.refs, range(self.world)))
        result, stop, stop_at, next_check = None, None, None, 0.0
        self.last_step, self.acc_before = 0, None
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1, timeout=POLL_S)
            if done:
                rank = pending.pop(done[0])
                try:
                    out = ray.get(done[0], timeout=CALL_TIMEOUT_S)
                except ray.exceptions.RayError as e:
                    self._relay(hooks)  # what rank 0 recorded before the failure still counts
                    raise self._failure({rank: e}, pending) from None
                if rank == 0:
                    result = out
                    deadline = time.monotonic() + FINISH_TIMEOUT_S
            self._relay(hooks)  # every turn: rank 0's actor outlives its run until close()
            now = time.monotonic()
            if result is not None and pending and now > deadline:
                raise RankDied(f"ranks {sorted(pending.values())} did not finish {FINISH_TIMEOUT_S:g} s after "
                               "rank 0", lost=False)
            if result is None and stop is None and should_stop and now >= next_check:
                next_check = now + STOP_CHECK_S
                stop = should_stop()
                if stop:
                    self.actors[0].stop.remote(stop)
                    stop_at = now
            if result is None and stop_at is not None and now - stop_at > grace_s:
                log(f"the group did not stop within {grace_s:g} s of the {stop} request: stopping it")
                latest = checkpoint.latest(self.run_dir / "checkpoints")
                from ..loop import RunResult

                return RunResult("paused" if stop == "pause" else "cancelled", self.last_step, self.acc_before,
                                 None, str(self.run_dir), str(latest) if latest else None)
        self._relay(hooks)
        return result

    def _relay(self, hooks: dict[str, Any]) -> None:
        import ray

        try:
            events = ray.get(self.actors[0].drain.remote(), timeout=CALL_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:  # busy or hung: the step watchdog bounds it, drained next time
            return
        except ray.exceptions.RayActorError:  # rank 0 is gone: its run ref says why
            return
        for kind, *args in events:
            if kind == "step":
                self.last_step = args[0]
                if args[0] == 0:
                    self.acc_before = args[1].get("eval/accuracy")
            elif kind == "start":
                args[0]["ray"] = {"strategy": self.strategy, "placement_group": self.pg.id.hex(),
                                  "ranks": [{k: w[k] for k in ("rank", "node", "ip", "pid")} for w in self.where]}
            if hooks.get(kind):
                hooks[kind](*args)

    def _failure(self, errors: dict[int, Exception], pending: dict) -> ClusterError | BaseException:
        """The job's error once a rank failed: its peers get SETTLE_S to fail too (a dead rank breaks their
        collective), then a lost process wins over the errors it caused, and rank 0's own exception is raised
        as itself when every rank raised the same kind."""
        import ray

        left = list(pending)
        if left:
            done, _ = ray.wait(left, num_returns=len(left), timeout=SETTLE_S)
            for ref in done:
                try:
                    ray.get(ref, timeout=CALL_TIMEOUT_S)
                except ray.exceptions.RayError as e:
                    errors[pending[ref]] = e
        lost = {r: e for r, e in errors.items() if isinstance(e, ray.exceptions.RayActorError)}
        if lost:
            r = min(lost)
            return RankDied(self._describe(r, f"died: {_reason(lost[r])}"), lost=True)
        causes = {r: getattr(e, "cause", None) or e for r, e in errors.items()}
        if 0 in causes and all(type(c) is type(causes[0]) for c in causes.values()):
            return causes[0]
        r = min([r for r in causes if r != 0] or [0])
        return RankDied(self._describe(r, f"failed: {type(causes[r]).__name__}: {causes[r]}"), lost=False)

    def _describe(self, rank: int, what: str) -> str:
        w = self.where[rank]
        log_tail = tail(self.run_dir / f"rank-{rank}.log")
        return (f"rank {rank} of {self.world} (node {w['node'][:12]} at {w['ip']}) {what}"
                + (f"; the tail of rank-{rank}.log:\n{log_tail}" if log_tail else ""))

    def close(self) -> None:
        """Kill every rank (and so what they own: the producer) and remove the placement group."""
        import ray
        from ray.util.placement_group import remove_placement_group

        for a in self.actors:
            try:
                ray.kill(a, no_restart=True)
            except Exception:  # already dead
                pass
        if self.pg is not None:
            try:
                remove_placement_group(self.pg)
            except Exception:  # already removed
                pass


def _reason(e: Exception) -> str:
    """Ray's account of a lost actor, without its per-field lines (ids, namespace)."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip() and not ln.startswith("\t")]
    return " ".join(lines).split(" Some common causes include")[0][:800]  # not the generic advice


def _resources() -> str:
    import ray

    total = ray.cluster_resources()
    return ", ".join(f"{k} {v:g}" for k, v in sorted(total.items()) if k in ("CPU", "GPU")) + \
        f" over {len([n for n in ray.nodes() if n.get('Alive')])} node(s)"
