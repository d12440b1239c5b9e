"""Scoring on the `verify` queue (CPU workers) gives exactly the in-process verdicts, and a training
job whose worker scores there runs to the end."""
from __future__ import annotations

import pytest

from tests.faults.cluster import Cluster

pytestmark = [pytest.mark.slow, pytest.mark.redis]


@pytest.fixture
def cluster(tmp_path, models_dir):
    c = Cluster(tmp_path, models_dir)
    c.start_redis()
    try:
        yield c
    finally:
        c.close()


def test_queue_scoring_is_identical_to_in_process(cluster):
    from service.settings import Settings
    from service.worker.verify_queue import queue_scorer
    from trainer.config import VerifierSpec
    from trainer.scoring import Scorer

    cluster.start_worker(queue="verify", concurrency=2)
    specs = [VerifierSpec(name="math", config={"allow_unevaluated": False}),
             VerifierSpec(name="format", weight=0.5, config={"pattern": r"\\boxed\{.+\}"}),
             VerifierSpec(name="string_check", weight=0.25, config={"operation": "contains"})]
    completions = ["so \\boxed{12}", "\\boxed{3+9}", "twelve", "\\boxed{13}", "the answer is 12", "", "\\boxed{12"] * 3
    references = ["12"] * len(completions)
    settings = Settings(home=cluster.tmp / "home", broker_url=cluster.env["RLVR_BROKER_URL"])
    local = Scorer(specs)(completions, references)
    remote = Scorer(specs, remote=queue_scorer(settings, chunks=3))(completions, references)
    assert remote.rewards == local.rewards and remote.correct == local.correct
    for name in local.verdicts:
        assert [v.to_dict() for v in remote.verdicts[name]] == [v.to_dict() for v in local.verdicts[name]]
        assert remote.statuses[name] == local.statuses[name]


def test_a_job_scores_on_cpu_workers(cluster):
    cluster.env["RLVR_SCORE_ON_VERIFY_QUEUE"] = "true"
    cluster.start_api()
    cluster.start_worker(queue="verify", concurrency=2)
    cluster.start_worker(queue="train")
    spec = {"name": "verify-queue", "rollout": {"group_size": 4, "max_new_tokens": 12}, "data": {"eval_size": 10},
            "train": {"steps": 4, "prompts_per_step": 2, "eval_every": 0, "threads": 1}}
    job = cluster.submit(spec)
    done = cluster.wait_done(job, timeout=300)
    assert done["status"] == "succeeded", cluster.logs()
    pts = cluster.metrics(job)
    assert [p["step"] for p in pts] == [0, 1, 2, 3, 4]
    assert pts[-1]["metrics"]["verifier/math/calls"] == 8
    verify_log = (cluster.tmp / "worker-0.log").read_text()
    # the CPU worker ran the scoring (Celery logs "Task NAME[id] received/succeeded"), the train worker none
    assert verify_log.count("Task rlvr.verify_batch[") >= 5, verify_log[-2000:]
    assert "Task rlvr.verify_batch[" not in (cluster.tmp / "worker-1.log").read_text()
