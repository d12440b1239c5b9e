"""The API's reaper thread: jobs of dead or hung workers are handed back, jobs the broker lost are re-sent."""
from __future__ import annotations

import logging
import threading

from fastapi import FastAPI

from ..settings import Settings
from ..store.jobs import Store
from ..tinker.reaper import reap_sessions

log = logging.getLogger("rlvr.api")


def start_reaper(app: FastAPI) -> threading.Event:
    """Background thread: hand back jobs of dead/hung workers, re-send jobs the broker lost."""
    stop = threading.Event()
    settings: Settings = app.state.settings
    store: Store = app.state.store

    def loop():
        from .tasks import enqueue

        while not stop.wait(settings.reaper_interval_s):
            try:
                for job_id in store.reap(settings.requeue_queued_after_s, settings.max_attempts,
                                         settings.on_worker_lost):
                    try:
                        enqueue(job_id, settings)
                    except Exception as e:  # broker down: the next pass tries again
                        log.warning("re-enqueue of %s failed: %s", job_id, e)
            except Exception:
                log.exception("reaper pass failed")
            reap_sessions(store, settings)  # training sessions (service/tinker): their own rules

    threading.Thread(target=loop, daemon=True, name="rlvr-reaper").start()
    return stop
