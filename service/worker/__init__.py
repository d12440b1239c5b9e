"""Celery: ids in, plain functions out — the app, the job and session tasks, the verify queue, GPU workers,
and the API's reaper thread."""
