"""Run one stored job with the trainer and record everything in the store.

Shared by the Celery task and by tests; the only place that maps trainer outcomes onto job status.
A worker first *claims* the job (a lease in the database), renews the lease while it trains, and
writes nothing once it has lost it. A duplicate delivery of the same id finds the job claimed and
returns at once, so at most one worker ever trains a job at a time.
"""
from __future__ import annotations

import logging
import os
import socket
import threading
import time
import traceback
import uuid
from pathlib import Path
from typing import Any

from trainer.cluster import use_ray
from trainer.config import JobSpec

from ..access.redact import redact_paths
from ..settings import Settings, get_settings
from ..store.jobs import JobStatus, LeaseLost, Store
from .watch import Watch

log = logging.getLogger("rlvr.runner")


class Heartbeat(threading.Thread):
    """Renews the job's lease every lease/4 seconds, so a worker busy inside a long step keeps it —
    and is the step watchdog: a step that has not finished within ``step_timeout_s`` (a hung
    generation, verifier or filesystem) fails the job with StepTimeout. In a Celery worker
    (``hard_exit``) the process then exits, so the hung work cannot go on holding the device; Celery
    replaces the process, and the redelivered message finds the job already failed."""

    def __init__(self, store: Store, job_id: str, owner: str, lease_s: float, step_timeout_s: float,
                 hard_exit: bool = False):
        super().__init__(daemon=True, name=f"heartbeat-{job_id}")
        self.store, self.job_id, self.owner, self.lease_s = store, job_id, owner, lease_s
        self.step_timeout_s, self.hard_exit = step_timeout_s, hard_exit
        self.stopped, self.lost = threading.Event(), False
        self.last_progress = time.monotonic()

    def progress(self) -> None:
        self.last_progress = time.monotonic()

    def _timed_out(self) -> None:
        msg = (f"no training step finished within {self.step_timeout_s:g}s (hung generation, verifier or "
               "I/O?); the job was stopped" + ("; its worker process is replaced" if self.hard_exit else ""))
        log.error("job %s: %s", self.job_id, msg)
        try:
            self.store.finish(self.job_id, self.owner, JobStatus.failed, error_code="StepTimeout", error_message=msg)
        except Exception as e:  # lost the lease meanwhile: the new owner is in charge
            log.warning("job %s: could not record the step timeout: %s", self.job_id, e)
        self.lost = True
        if self.hard_exit:
            os._exit(70)  # the stuck thread cannot be interrupted from here; the process can

    def run(self) -> None:
        while not self.stopped.wait(min(self.lease_s / 4, self.step_timeout_s / 2)):
            if time.monotonic() - self.last_progress > self.step_timeout_s:
                self._timed_out()
                return
            try:
                self.store.heartbeat(self.job_id, self.owner, self.lease_s)
            except LeaseLost:
                self.lost = True
                return
            except Exception as e:  # DB blip: keep trying; the lease covers a few missed beats
                log.warning("heartbeat for %s failed: %s", self.job_id, e)


class _Recorder:
    """What the trainer's callbacks do for a stored job: record steps, events, checkpoints, rollouts,
    warnings; answer stop requests (a pause/cancel asked over the API, or a pause a warning asks for)."""

    def __init__(self, store: Store, job_id: str, owner: str, hb: Heartbeat, run_dir, settings: Settings):
        self.store, self.job_id, self.owner, self.hb, self.run_dir = store, job_id, owner, hb, run_dir
        self.settings = settings
        self.watch = Watch(verifier_error_threshold=settings.verifier_error_pause_threshold)
        self.pause_for: list[str] = []
        self.error_example: dict[str, str] = {}  # verifier -> one error reason from the step's rollouts

    def on_step(self, step: int, m: dict[str, Any]) -> None:
        store, job_id = self.store, self.job_id
        if self.hb.lost:
            raise LeaseLost(f"{self.owner} no longer holds job {job_id} (its heartbeat found the lease gone)")
        self.hb.progress()  # the step watchdog times the next step from here
        if not store.put_metrics(job_id, step, m, owner=self.owner):
            return  # the same record again (resume re-delivers a checkpoint's step): nothing new to tell
        store.put_live(job_id, step, m, owner=self.owner)  # what GET /metrics shows, without reading series
        store.add_event(job_id, "metrics", f"step {step}", step=step, metrics=m)
        if "eval/accuracy" in m:
            store.add_event(job_id, "eval", f"step {step}: held-out accuracy {m['eval/accuracy']:.3f}",
                            step=step, accuracy=m["eval/accuracy"])
        if "checkpoint" in m:
            path = str(self.run_dir / "checkpoints" / m["checkpoint"])
            store.put_checkpoint(job_id, step, m["checkpoint"], path, m)
            store.add_event(job_id, "checkpoint", f"step {step}: saved {m['checkpoint']}", step=step,
                            name=m["checkpoint"])
        if m.get("checkpoints_pruned"):  # train.keep_last: older ones are gone from disk
            store.delete_checkpoints(job_id, list(m["checkpoints_pruned"]))
        for w in self.watch.observe(step, m):
            message = w.message
            if w.reason == "verifier_errors" and self.error_example:  # what the errors said, not just how many
                message += "; for example " + "; ".join(f"{n}: {r}" for n, r in self.error_example.items())
            store.add_event(job_id, "warning", message, level="warning", reason=w.reason, step=step)
            if w.pause and w.reason not in self.pause_for:
                self.pause_for.append(w.reason)

    def should_stop(self) -> str | None:
        request = self.store.heartbeat(self.job_id, self.owner, self.settings.lease_s)  # raises LeaseLost
        return request or ("pause" if self.pause_for else None)

    def on_rollouts(self, step: int, groups: list[dict[str, Any]]) -> None:
        self.store.put_rollouts(self.job_id, step, groups)
        self.error_example = {}
        for c in (c for g in groups for c in g.get("completions", [])):
            for name, v in c.get("verdicts", {}).items():
                if v.get("status") == "error" and name not in self.error_example:
                    self.error_example[name] = redact_paths(str(v.get("reason", "")))[:300]

    def on_eval(self, step: int, records: list[dict[str, Any]]) -> None:
        self.store.put_evals(self.job_id, step, records, owner=self.owner)

    def on_start(self, info: dict[str, Any]) -> None:
        where = info["device"] + (f" ({info['gpu']})" if info.get("gpu") else "")
        extra = ", FSDP" if info.get("fsdp") else ""
        if info.get("ray"):
            nodes = {r["node"] for r in info["ray"]["ranks"]} | ({info["producer"]["node"]}
                                                                 if info.get("producer") else set())
            extra += f", placed by Ray ({info['ray']['strategy']}) on {len(nodes)} node(s)"
        self.store.add_event(self.job_id, "status", f"training on {where}, {info['world_size']} rank(s){extra}, "
                             f"rollouts by {info['engine']}", **info)


    def on_restart(self, why: str, attempt: int) -> None:
        self.store.add_event(self.job_id, "warning", redact_paths(f"{why}; resuming from the last checkpoint "
                             f"(restart {attempt} of {self.settings.ray_rank_restarts})")[:4000], level="warning",
                             reason="rank_lost")


def env_settings(settings: Settings, tenant: str) -> dict[str, str]:
    """What trainer/envs reads for an HTTP-environment job: the allow-list, the tenant's cap and where its slots
    live — a Redis every worker shares (env_slots_redis, or a Redis broker) makes it one cap across machines."""
    out = {"RLVR_ENV_ALLOW": settings.env_allow, "RLVR_ENV_MAX_SESSIONS": str(settings.env_max_sessions),
           "RLVR_ENV_TENANT": tenant}
    shared = settings.env_slots_redis or (settings.broker if settings.broker.startswith(("redis://", "rediss://"))
                                          else None)
    if shared:
        out["RLVR_ENV_SLOTS_REDIS"] = shared
    return out


def _train(job, store: Store, settings: Settings, rec: _Recorder):
    """Resolve the stored spec for this worker and run it."""
    from trainer.loop import train

    from .specs import resolve_spec
    from .stored_verifiers import resolve_job_spec

    spec = resolve_spec(JobSpec.model_validate(job.spec), store, job.tenant, settings,
                        log=lambda msg: log.info("%s: %s", job.id, msg))
    spec = resolve_job_spec(spec, store.engine)  # pinned HTTP verifiers: their stored source
    if spec.episodes is not None and spec.episodes.env.type == "http":
        # what trainer/envs reads: the operator's allow-list and cap, and whose cap this job's calls count
        # against (one job at a time per worker process)
        os.environ.pop("RLVR_ENV_SLOTS_REDIS", None)
        os.environ.update(env_settings(settings, job.tenant))
    if settings.worker_threads and not spec.train.threads:
        spec.train.threads = settings.worker_threads
    remote = None
    if settings.score_on_verify_queue:
        from ..worker.verify_queue import queue_scorer

        remote = queue_scorer(settings)
    hooks = dict(on_step=rec.on_step, should_stop=rec.should_stop, on_rollouts=rec.on_rollouts, on_start=rec.on_start,
                 on_eval=rec.on_eval,
                 log=lambda msg: log.info("%s: %s", job.id, msg))
    if use_ray(spec, settings.ray_address, settings.ray_every_job):  # ranks on the cluster, driven from this task
        from trainer.cluster.driver import train_on_ray

        return train_on_ray(spec, rec.run_dir, models_dir=settings.models_dir, address=settings.ray_address,
                            name=f"rlvr-{job.id}", restarts=settings.ray_rank_restarts, on_restart=rec.on_restart,
                            stop_grace_s=settings.ray_stop_grace_s, place_timeout_s=settings.ray_place_timeout_s,
                            **hooks)
    return train(spec, rec.run_dir, models_dir=settings.models_dir, score_remote=remote, **hooks)


def _lease_lost(job_id: str, e: LeaseLost) -> str:
    """One message whichever path finds the lease gone (operators and the fault tests read it)."""
    log.warning("job %s: %s; stopping without writing", job_id, e)
    return "lease_lost"


def execute_job(job_id: str, settings: Settings | None = None, store: Store | None = None,
                hard_exit: bool = False) -> str:
    settings = settings or get_settings()
    store = store or Store(settings.db_url)
    owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
    run_dir = settings.runs_dir / job_id
    job = store.claim(job_id, owner, settings.lease_s, str(run_dir))
    if job is None:
        log.info("job %s is not claimable (done, cancelled, paused or held by another worker)", job_id)
        return "skipped"
    hb = Heartbeat(store, job_id, owner, settings.lease_s, settings.step_timeout_s, hard_exit)
    hb.start()
    rec = _Recorder(store, job_id, owner, hb, run_dir, settings)
    try:
        result = _train(job, store, settings, rec)
        status = {"succeeded": JobStatus.succeeded, "paused": JobStatus.paused,
                  "cancelled": JobStatus.cancelled}[result.status]
        store.finish(job_id, owner, status, result={
            "accuracy_before": result.accuracy_before, "accuracy_after": result.accuracy_after,
            # by name: responses never carry server paths (GET …/checkpoints/{name}/download fetches it)
            "checkpoint": Path(result.checkpoint).name if result.checkpoint else None, "steps": result.step,
            **({"paused_for": rec.pause_for} if rec.pause_for else {}),
        })
        return status.value
    except LeaseLost as e:  # another worker owns the job now: leave every record to it
        return _lease_lost(job_id, e)
    except Exception as e:  # any failure ends the job `failed` with its message, never stuck running
        log.error("job %s failed: %s", job_id, traceback.format_exc())
        try:  # the message is shown to the tenant: server paths in it become file names
            store.finish(job_id, owner, JobStatus.failed, error_code=type(e).__name__,
                         error_message=redact_paths(str(e))[:4000] or type(e).__name__)
        except LeaseLost as lost:  # e.g. a worker frozen mid-transaction: the database ended its session
            return _lease_lost(job_id, lost)
        return JobStatus.failed.value
    finally:
        hb.stopped.set()
