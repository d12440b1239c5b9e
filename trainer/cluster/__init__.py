"""One job across machines, on Ray (optional extra ``rlvr[ray]``; docs/cluster.md).

A job is placed on a Ray cluster when the server has ``RLVR_RAY_ADDRESS`` and the job asks for it
(``train.placement`` other than auto, ``train.producer: ray``) or its ranks do not fit the worker that
claimed it (``train.world_size`` over its devices). The job's processes then run as Ray actors in one
placement group — a bundle per rank (a GPU, else ``train.threads`` CPUs), plus one for the rollout producer —
and the process that called :func:`trainer.cluster.driver.train_on_ray` (the service's Celery task) drives
them: it relays rank 0's step records to its callbacks, forwards stop requests, and removes the group
whatever happens. Ray is imported only on this path: without it nothing here runs.
"""
from __future__ import annotations

import os

from ..distributed import local_devices

START_TIMEOUT_S = 300.0  # a job actor's process starts on its node (imports torch, loads the model)


class ClusterError(RuntimeError):
    """The job cannot be placed, or a rank died."""


def needs_ray(spec) -> bool:
    """Whether this job's processes are placed on the cluster rather than as children of this worker: asked
    for by the spec, or more ranks than this worker has devices (one per GPU, else per CPU core)."""
    tc = spec.train
    return tc.placement != "auto" or tc.producer == "ray" or tc.world_size > local_devices(tc.device)


def asks_for_ray(spec) -> str | None:
    """The spec field that can only be met on a Ray cluster, if any (for a server without one)."""
    if spec.train.placement != "auto":
        return "placement"
    return "producer" if spec.train.producer == "ray" else None


def use_ray(spec, address: str | None, every_job: bool = False) -> bool:
    """Whether this job runs on the Ray cluster at ``address``; a job that asks for Ray where there is none
    fails saying so (the API refuses it at submission; this catches a worker or `rlvr train` apart)."""
    if address:
        return every_job or needs_ray(spec)
    field = asks_for_ray(spec)
    if field:
        raise ClusterError(f"train.{field} needs a Ray cluster, and there is none here (RLVR_RAY_ADDRESS)")
    return False


def job_env() -> dict[str, str]:
    """The RLVR_* environment the job's remote processes get: ranks started as subprocesses inherit this
    process's environment, so ranks on other nodes see the same settings (RLVR_DIST_TIMEOUT_S, preludes)."""
    return {k: v for k, v in os.environ.items() if k.startswith("RLVR_")}


def tail(path, lines: int = 20, chars: int = 2000) -> str:
    """The last lines of a log file ('' when there is none)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 64 * 1024))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])[-chars:]
