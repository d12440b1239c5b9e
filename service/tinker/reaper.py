"""One pass of the sessions' reaper (the API runs it with the jobs' reaper): expire unused sessions, hand
back sessions whose worker died (service.tinker.sessions decides what resumes), fail requests no worker
took, drop old results, and (re-)send sessions that wait for a worker."""
from __future__ import annotations

import logging

from ..settings import Settings
from ..store.jobs import Store
from .sessions import Sessions

log = logging.getLogger("rlvr.tinker")


def reap_sessions(store: Store, settings: Settings) -> None:
    from ..worker.tasks import enqueue_session

    try:
        ids = Sessions(store).reap(idle_s=settings.tinker_idle_s, queue_timeout_s=settings.tinker_queue_timeout_s,
                                   retention_s=settings.tinker_retention_s,
                                   requeue_after_s=settings.requeue_queued_after_s)
    except Exception:
        log.exception("session reaper pass failed")
        return
    for sid in ids:
        try:
            enqueue_session(sid, settings)
        except Exception as e:  # broker down: the next pass tries again
            log.warning("re-enqueue of session %s failed: %s", sid, e)
