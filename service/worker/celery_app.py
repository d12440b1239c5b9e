"""The Celery app. Redis in the distributed setup; with no broker configured, kombu's filesystem
transport under $RLVR_HOME/broker, so the embedded mode runs the very same task code with no server.
"""
from __future__ import annotations

import os

from celery import Celery

from ..settings import Settings, get_settings


def make_celery(settings: Settings | None = None) -> Celery:
    settings = settings or get_settings()
    app = Celery("rlvr", include=["service.worker.tasks", "service.worker.verify_queue"])
    conf: dict = {
        "broker_url": settings.broker,
        "task_ignore_result": True,  # results live in the job store, not in Celery
        "task_acks_late": True,  # a job whose worker dies is redelivered, not lost
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,  # a training job holds its worker for a long time
        "task_routes": {"rlvr.run_job": {"queue": settings.train_queue},
                        "rlvr.run_session": {"queue": settings.train_queue},
                        "rlvr.verify_batch": {"queue": settings.verify_queue}},
        # only verify_batch keeps results (the caller waits for its verdicts); they expire quickly
        "result_backend": None if settings.embedded_broker else settings.broker,
        "result_expires": 3600,
        "task_default_queue": settings.train_queue,
        "broker_connection_retry_on_startup": True,
        "broker_connection_timeout": 5,
        # Redis redelivers an unacked message after visibility_timeout: it must outlast the longest step
        # (acks_late: a job's message stays unacked for the whole job; the lease, not redelivery, is what
        # fences a duplicate), so a long step is never handed to a second worker meanwhile
        "broker_transport_options": {"max_retries": 3, "interval_start": 0.2, "interval_step": 0.5,
                                     "interval_max": 2,
                                     "visibility_timeout": max(3600.0, 2 * settings.step_timeout_s)},
        "worker_hijack_root_logger": False,
        # a GPU worker (`rlvr worker --gpus`) gets a fresh process per job: a fresh CUDA context, no
        # fragmentation or leaked memory carried from one job's model into the next
        "worker_max_tasks_per_child": 1 if os.environ.get("RLVR_GPU_WORKER") else None,
    }
    if settings.embedded_broker:
        q = settings.broker_dir
        for sub in ("queue", "processed", "control"):
            (q / sub).mkdir(parents=True, exist_ok=True)
        conf["broker_transport_options"] = {
            "data_folder_in": str(q / "queue"), "data_folder_out": str(q / "queue"),
            "processed_folder": str(q / "processed"), "store_processed": False,
            "control_folder": str(q / "control"), "polling_interval": 0.5,
        }
    app.conf.update(conf)
    return app


_apps: dict[tuple, Celery] = {}


def celery_for(settings: Settings) -> Celery:
    """One app per broker configuration (tests and the API may use a settings object of their own)."""
    key = (settings.broker, str(settings.broker_dir), settings.train_queue)
    if key not in _apps:
        _apps[key] = make_celery(settings)
    return _apps[key]


celery_app = celery_for(get_settings())
