"""The one way a job enters the service, whichever door it came through (native /v1/jobs, OpenAI's
/v1/fine_tuning/jobs): :func:`check` before anything is written, :func:`submit` to store and queue it."""
from __future__ import annotations

from typing import Any

from fastapi.exceptions import RequestValidationError

from trainer.config import JobSpec

from ..access.keys import Scope
from ..settings import Settings
from ..store.jobs import Store
from ..store.tables import Job
from ..worker.tasks import enqueue_or_warn
from .specs import check_spec


def check(spec: JobSpec, settings: Settings, store: Store, scope: Scope) -> JobSpec:
    """Everything a spec must pass before the service writes anything for it: its trackers are installed here,
    what it names exists and ``scope`` may use it, its costs are within this server's bounds. Returns the spec
    with stored verifiers pinned; a RequestValidationError (422, each field named) otherwise."""
    _check_trackers(spec)
    return check_spec(spec, settings, store, scope)


def submit(pinned: JobSpec, store: Store, settings: Settings, scope: Scope,
           origin: dict[str, Any] | None = None) -> Job:
    """Store a checked spec as the scope's job, warn about what its owner should know (a reward looser than
    its task's judge), and queue it. Returns the stored job."""
    from trainer.evaluation import loosened

    job = store.create_job(pinned.model_dump(mode="json"), tenant=scope.tenant, origin=origin)
    for warning in loosened(pinned):
        store.add_event(job.id, "warning", warning, level="warning")
    enqueue_or_warn(store, settings, job.id)
    return store.get_job(job.id)


def _check_trackers(spec: JobSpec) -> None:
    """A tracker whose package this deployment lacks is a 422 now, not a job failing at its start."""
    from trainer.trackers import missing

    gone = missing(spec.train.report_to)
    if gone:
        raise RequestValidationError([{"loc": ("body", "train", "report_to"), "type": "value_error",
                                       "msg": f"{', '.join(gone)} not installed on this server "
                                              "(pip install 'rlvr[trackers]')"}])
