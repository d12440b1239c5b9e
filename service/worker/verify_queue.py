"""Scoring on the `verify` queue: CPU workers run the verifiers, GPU workers only train.

With ``RLVR_SCORE_ON_VERIFY_QUEUE=true`` (needs a broker with a result backend, i.e. Redis) a training
worker cuts each step's completions into chunks and sends them to ``rlvr.verify_batch`` on the
verify queue, then waits for the verdicts (bounded by ``RLVR_VERIFY_TIMEOUT_S``). Waiting on another
task inside a task is normally a deadlock risk; here it cannot deadlock because the waiting task
(train queue) and the awaited ones (verify queue) run in different worker pools, and verify tasks
never wait on anything. Verdicts come back as plain dicts and are rebuilt exactly, so scores,
statuses and rewards are identical to scoring in-process (tests/integration/test_verify_queue.py).
"""
from __future__ import annotations

from typing import Any

from verifiers import Status, Verdict

from ..settings import Settings
from .celery_app import celery_app, celery_for


@celery_app.task(name="rlvr.verify_batch", ignore_result=False, acks_late=True)
def verify_batch(specs: list[dict[str, Any]], completions: list[str], references: list[Any]) -> list[dict]:
    from trainer.scoring import run_specs

    return [{"verdicts": [v.to_dict() for v in verdicts], "latencies": lat, "seconds": seconds}
            for verdicts, lat, seconds in run_specs(specs, completions, references)]


def queue_scorer(settings: Settings, chunks: int = 4):
    """A ``remote`` for trainer.scoring.Scorer that scores on the verify queue."""
    app = celery_for(settings)
    if settings.embedded_broker:
        raise RuntimeError("scoring on the verify queue needs a broker with a result backend (Redis)")

    from trainer.scoring import Call

    def remote(specs, completions, references, timeout_s):
        n = len(completions)
        k = max(1, min(chunks, n))
        bounds = [(n * i // k, n * (i + 1) // k) for i in range(k)]
        results = [app.send_task("rlvr.verify_batch", args=[specs, completions[a:b], references[a:b]],
                                 queue=settings.verify_queue) for a, b in bounds]
        timeout = min(timeout_s, settings.verify_timeout_s)
        parts = [r.get(timeout=timeout, disable_sync_subtasks=False) for r in results]
        out = []
        for i in range(len(specs)):
            verdicts = [Verdict(d["score"], Status(d["status"]), d["reason"], d["details"])
                        for p in parts for d in p[i]["verdicts"]]
            out.append(Call(verdicts, [x for p in parts for x in p[i]["latencies"]],
                            max(p[i]["seconds"] for p in parts)))
        return out

    return remote
