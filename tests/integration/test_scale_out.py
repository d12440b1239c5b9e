"""Scale-out with Celery: two workers on the train queue run two jobs at the same time."""
from __future__ import annotations

import pytest

from tests.conftest import wait_for
from tests.faults.cluster import Cluster

pytestmark = [pytest.mark.slow, pytest.mark.redis]
SPEC = {"name": "parallel", "rollout": {"group_size": 4, "max_new_tokens": 12}, "data": {"eval_size": 10},
        "train": {"steps": 40, "prompts_per_step": 2, "eval_every": 0, "threads": 1}}


def test_two_workers_run_two_jobs_in_parallel(tmp_path, models_dir):
    c = Cluster(tmp_path, models_dir)
    try:
        c.start_redis()
        c.start_api()
        c.start_worker()
        c.start_worker()
        a, b = c.submit(SPEC), c.submit(SPEC)
        both = lambda: all(c.job(j)["status"] == "running" for j in (a, b))  # noqa: E731
        wait_for(both, 120, "both jobs running at once")
        for j in (a, b):
            done = c.wait_done(j)
            assert done["status"] == "succeeded" and done["attempts"] == 1
        owners = {e["data"]["worker"] for j in (a, b) for e in c.events(j)
                  if e["type"] == "status" and e["data"].get("status") == "running"}
        assert len(owners) == 2  # one job per worker (concurrency 1 each)
    finally:
        c.close()
