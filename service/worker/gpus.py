"""`rlvr worker --gpus 0,1`: one Celery worker process per GPU, each seeing only its own.

Each child is `rlvr worker` with ``CUDA_VISIBLE_DEVICES`` set to one GPU (so the trainer's ``cuda:0`` is
that GPU, trainer/devices.py), concurrency 1 (one job per GPU), a node name of its own, and
``RLVR_GPU_WORKER=1`` (service/worker/celery_app.py: a fresh process per job, so every job starts on a clean
CUDA context). The parent forwards SIGTERM/SIGINT and exits when every child has.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys


def commands(gpus: str, queue: str, loglevel: str = "info") -> list[tuple[list[str], dict[str, str]]]:
    """(argv, extra environment) of each GPU's worker."""
    from trainer.devices import visible_gpus

    host = socket.gethostname()
    return [([sys.executable, "-m", "service.cli", "worker", "--queue", queue, "-c", "1", "--loglevel", loglevel,
              "--pool", "prefork"],
             {"CUDA_VISIBLE_DEVICES": gpu, "RLVR_GPU_WORKER": "1", "RLVR_WORKER_NAME": f"gpu{gpu}@{host}"})
            for gpu in visible_gpus(gpus)]


def run_gpu_workers(gpus: str, queue: str, loglevel: str = "info") -> int:
    procs = [subprocess.Popen(argv, env={**os.environ, **env}) for argv, env in commands(gpus, queue, loglevel)]

    def forward(sig, _frame):
        for p in procs:
            if p.poll() is None:
                p.send_signal(sig)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    codes = [p.wait() for p in procs]
    return max(codes, default=0)
