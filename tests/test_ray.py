"""One job across machines, on Ray (issue 31), without a second machine: Ray's local multi-node cluster.

Two raylets with one CPU each beside a head with none, so a job's placement group of two one-CPU bundles
must spread over both "machines". Through the service's own path (submit, then execute_job as the Celery
task runs it, with RLVR_RAY_ADDRESS set): a 2-rank gloo job reaches the parameters one process reaches; a
rank killed with SIGKILL is survived once when configured, then fails the job with its reason and log
tail; pause and cancel stop the group — a hung one too, within a bound; the rollout producer on the other
node trains on exactly the synchronous loop's groups. After each: no actor and no placement group left,
asked of Ray's state API.
"""
from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest
import ray
from safetensors.torch import load_file

from service.jobs.runner import execute_job
from tests.conftest import wait_for
from tests.test_distributed import SPEC, TOL, _run

pytestmark = pytest.mark.slow
GRACE_S = 3.0  # RLVR_RAY_STOP_GRACE_S here: a hung group is killed this long after the stop reached it


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    # the head runs the dashboard (the state API answers through it) and no job process: num_cpus 0
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": True,
                                                       "dashboard_port": 0, "object_store_memory": 80 * 2**20})
    for name in ("a", "b"):
        c.add_node(num_cpus=1, resources={f"machine_{name}": 1}, object_store_memory=80 * 2**20)
    c.wait_for_nodes()
    ray.init(address=c.address, log_to_driver=False)
    yield c
    ray.shutdown()
    c.shutdown()


@pytest.fixture
def ray_settings(settings, cluster, monkeypatch):
    settings.ray_address = cluster.address
    settings.ray_stop_grace_s = GRACE_S
    monkeypatch.setenv("RLVR_DIST_TIMEOUT_S", "300")  # far beyond every bound below: a rank's peers never time out
    monkeypatch.setenv("RLVR_RANK_PRELUDE", "tests.scripted_engine:install_exact")
    return settings


def _submit(client, spec: dict) -> str:
    r = client.post("/v1/jobs", json=spec)
    assert r.status_code == 201, r.text
    return r.json()["id"]


def _spec(**train) -> dict:
    return {**SPEC, "train": {**SPEC["train"], "world_size": 2, **train}}


def _leftovers(job_id: str) -> list:
    """Placement groups of the job not yet removed, and job actors not yet dead (Ray's state API)."""
    from ray.util.state import list_actors, list_placement_groups

    pgs = [p.placement_group_id for p in list_placement_groups(filters=[("name", "=", f"rlvr-{job_id}")])
           if p.state != "REMOVED"]
    actors = [f"{a.class_name} {a.state}" for a in list_actors(filters=[("state", "!=", "DEAD")])
              if a.class_name in ("RankActor", "ProducerActor")]
    return pgs + actors


def _nothing_left(job_id: str) -> None:
    """Within 30 s (the state API trails the cluster by its polling): nothing of the job alive."""
    left = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        left = _leftovers(job_id)
        if not left:
            return
        time.sleep(0.5)
    assert left == []


def _events(store, job_id: str) -> list:
    return store.get_events(job_id, 0, 100_000)


def _started(store, job_id: str) -> dict:
    """The job's first group's start event's data: where its ranks (and producer) run."""
    return next(e.data for e in _events(store, job_id) if e.type == "status" and "ray" in (e.data or {}))


def _rank_1_of_each_group(store, job_id: str) -> list[dict]:
    return [r for e in _events(store, job_id) if e.type == "status" and "ray" in (e.data or {})
            for r in e.data["ray"]["ranks"] if r["rank"] == 1]


def _in_thread(job_id, settings, store):
    out: dict = {}
    t = threading.Thread(target=lambda: out.setdefault("status", execute_job(job_id, settings, store)), daemon=True)
    t.start()
    return t, out


def _steps(store, job_id: str) -> list[int]:
    from service.store.tables import Metric

    with store.Session() as s:
        return sorted(m.step for m in s.query(Metric).filter(Metric.job_id == job_id))


def test_two_ranks_on_two_nodes_train_to_one_process_parameters(tmp_path, tiny_model, models_dir, client, store,
                                                               ray_settings):
    """tests/test_distributed.py's invariance, through the Ray path: float64, the scripted engine (every
    rank's completions depend on its prompts alone), TOL of the largest weight move."""
    single = _run(tmp_path, "single", 1, models_dir)
    job = _submit(client, _spec(placement="spread"))
    assert execute_job(job, ray_settings, store) == "succeeded"
    placed = _started(store, job)["ray"]
    assert placed["strategy"] == "SPREAD" and len({r["node"] for r in placed["ranks"]}) == 2  # two "machines"
    run = ray_settings.runs_dir / job
    pair = load_file(run / "checkpoints" / "step-0000003" / "model.safetensors")
    start = load_file(tiny_model / "model.safetensors")
    moved = max((single["params"][k] - start[k].double()).abs().max().item() for k in start)
    assert moved > 1e-4
    for k, v in single["params"].items():
        assert (pair[k] - v).abs().max().item() <= TOL * moved, k
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    for a, b in zip(single["metrics"], rows, strict=True):
        for key in ("reward/mean", "accuracy", "data_position", "eval/accuracy"):
            assert a.get(key) == b.get(key), (a["step"], key)
    assert _steps(store, job) == [0, 1, 2, 3]  # the driver recorded every step in the store
    _nothing_left(job)


def test_a_killed_rank_is_resumed_once_then_fails_the_job_with_its_reason(client, store, ray_settings):
    """RLVR_RAY_RANK_RESTARTS=1: the first SIGKILL of rank 1 places the group again from the last checkpoint;
    the second fails the job at once — long before the 300 s its peer would wait in the collective — naming
    the rank, Ray's reason and its log's tail."""
    ray_settings.ray_rank_restarts = 1
    job = _submit(client, _spec(steps=40, checkpoint_every=1, placement="pack"))
    t, out = _in_thread(job, ray_settings, store)
    wait_for(lambda: 1 in _steps(store, job), 240, "step 1")
    first = wait_for(lambda: _rank_1_of_each_group(store, job), 30, "the group's start")[0]
    os.kill(first["pid"], signal.SIGKILL)
    wait_for(lambda: _lost(store, job), 60, "the restart")  # the old group is gone: no step of it comes after
    done = max(_steps(store, job))
    second = wait_for(lambda: _rank_1_of_each_group(store, job)[1:], 240, "the second group's start")[0]
    wait_for(lambda: max(_steps(store, job)) > done, 240, "a step of the second group")
    os.kill(second["pid"], signal.SIGKILL)
    t0 = time.monotonic()
    t.join(timeout=120)
    assert not t.is_alive() and out["status"] == "failed"
    assert time.monotonic() - t0 < 60
    body = client.get(f"/v1/jobs/{job}").json()
    assert body["error"]["code"] == "RankDied"
    msg = body["error"]["message"]
    assert msg.startswith("rank 1 of 2 (node ") and "died:" in msg, msg
    assert "the tail of rank-1.log" in msg and "[rank 1] rank 1 of 2 starting" in msg, msg
    lost = _lost(store, job)
    assert len(lost) == 1 and "restart 1 of 1" in lost[0].message and "rank 1 of 2" in lost[0].message
    steps = _steps(store, job)
    assert steps == list(range(len(steps))) and len(steps) > done + 1  # every step once, across the restart
    _nothing_left(job)


def _lost(store, job_id: str) -> list:
    return [e for e in _events(store, job_id) if (e.data or {}).get("reason") == "rank_lost"]


def test_pause_stops_the_group_at_a_checkpoint_and_resume_finishes_it(client, store, ray_settings, monkeypatch):
    # slower steps: at full speed the 11 steps after the first could end the job before the pause reached it
    monkeypatch.setenv("RLVR_RANK_PRELUDE", "tests.scripted_engine:install_exact_slow")
    job = _submit(client, _spec(steps=12, placement="pack"))  # checkpoint_every 0: only a stop or the end saves
    t, out = _in_thread(job, ray_settings, store)
    wait_for(lambda: 1 in _steps(store, job), 240, "step 1")
    t0 = time.monotonic()
    assert client.post(f"/v1/jobs/{job}/pause").status_code == 200
    t.join(timeout=120)
    took = time.monotonic() - t0
    assert not t.is_alive() and out["status"] == "paused"
    body = client.get(f"/v1/jobs/{job}").json()
    paused_at = body["result"]["steps"]
    assert body["result"]["checkpoint"] == f"step-{paused_at:07d}"  # the graceful stop saved it, at its step
    assert took < GRACE_S + 30, took  # one step and a stop check, not a kill (that would be at GRACE_S)
    _nothing_left(job)
    assert client.post(f"/v1/jobs/{job}/resume").json()["status"] == "queued"
    assert execute_job(job, ray_settings, store) == "succeeded"
    assert _steps(store, job) == list(range(13))
    _nothing_left(job)


def test_cancel_stops_a_hung_group_within_the_grace(client, store, ray_settings, monkeypatch):
    """Rank 1's generation never returns from step 2 on (rank 0 waits in the collective): the cancel reaches
    rank 0, which cannot act on it, so the driver kills the group GRACE_S later."""
    monkeypatch.setenv("RLVR_RANK_PRELUDE", "tests.scripted_engine:install_hanging")
    monkeypatch.setenv("RLVR_TEST_HANG_RANK", "1")
    monkeypatch.setenv("RLVR_TEST_HANG_AFTER", "2")  # the step-0 eval and step 1 sample; step 2 hangs
    job = _submit(client, _spec(steps=5, placement="pack"))
    t, out = _in_thread(job, ray_settings, store)
    wait_for(lambda: 1 in _steps(store, job), 240, "step 1")
    time.sleep(2)  # well into step 2's hang
    t0 = time.monotonic()
    assert client.post(f"/v1/jobs/{job}/cancel").status_code == 200
    t.join(timeout=GRACE_S + 60)
    took = time.monotonic() - t0
    assert not t.is_alive() and out["status"] == "cancelled"
    from trainer.cluster.driver import POLL_S, STOP_CHECK_S

    # the grace, one stop check, one poll, and the kill itself (seconds on a loaded machine)
    assert GRACE_S <= took < GRACE_S + STOP_CHECK_S + POLL_S + 10, took
    assert _steps(store, job) == [0, 1]
    _nothing_left(job)


def test_the_producer_on_another_node_trains_on_the_synchronous_loops_groups(tmp_path, client, store, models_dir,
                                                                           ray_settings, monkeypatch):
    """tests/test_async.py's exactness check across nodes: the scripted engine's groups depend on their prompts
    alone, so at k = 3 (two batches per call) step s trains on exactly the groups the synchronous loop
    trains on at step s — with the producer in the other bundle of a SPREAD group, its weights through the
    object store."""
    from tests import scripted_engine
    from trainer.config import JobSpec
    from trainer.engines import ENGINES
    from trainer.loop import train

    monkeypatch.setenv("RLVR_PRODUCER_PRELUDE", "tests.scripted_engine:install")
    monkeypatch.setenv("RLVR_RANK_PRELUDE", "tests.scripted_engine:install")
    spec = {"data": {"eval_size": 16}, "rollout": {"group_size": 4, "max_new_tokens": 10, "max_staleness": 3},
            "optim": {"lr": 1e-4}, "train": {"steps": 6, "prompts_per_step": 4, "eval_every": 0, "threads": 1,
                                             "seed": 3, "producer": "ray", "placement": "spread"}}
    job = _submit(client, spec)
    assert execute_job(job, ray_settings, store) == "succeeded"
    started = _started(store, job)
    assert started["producer"]["node"] != started["ray"]["ranks"][0]["node"]
    keys = ("reward/mean", "reward/std", "accuracy", "completion/len_mean", "rollout_tokens", "data_position")
    rows = [json.loads(x) for x in (ray_settings.runs_dir / job / "metrics.jsonl").read_text().splitlines()][1:]
    assert all(r["async/batches_per_call"] == 2 and 0 <= r["async/staleness"] <= 3 for r in rows)
    assert any(r["async/staleness"] > 0 for r in rows)  # the producer did run ahead of the trainer
    monkeypatch.setitem(ENGINES, "hf", scripted_engine.ScriptedEngine)
    sync = {**spec, "rollout": {**spec["rollout"], "max_staleness": 0}, "train": {**spec["train"], "producer": "local",
                                                                                  "placement": "auto"}}
    train(JobSpec.model_validate(sync), tmp_path / "sync", models_dir=models_dir, log=lambda m: None)
    want = [json.loads(x) for x in (tmp_path / "sync" / "metrics.jsonl").read_text().splitlines()][1:]
    assert [{k: r[k] for k in keys} for r in rows] == [{k: r[k] for k in keys} for r in want]
    _nothing_left(job)


def test_a_group_the_cluster_cannot_place_fails_the_job_saying_what_it_has(client, store, ray_settings):
    """Three ranks, each on a node of its own, on a cluster of two: not placed within the timeout, the job
    fails naming the cluster's resources, and the pending placement group is removed."""
    ray_settings.ray_place_timeout_s = 2.0
    job = _submit(client, _spec(world_size=3, prompts_per_step=6, placement="strict_spread"))
    assert execute_job(job, ray_settings, store) == "failed"
    err = client.get(f"/v1/jobs/{job}").json()["error"]
    assert err["code"] == "ClusterError" and "could not place 3 bundle(s)" in err["message"], err
    assert "STRICT_SPREAD within 2 s; it has CPU 2 over 3 node(s)" in err["message"], err
    _nothing_left(job)


def test_a_job_that_asks_for_ray_is_refused_where_there_is_none(client, settings):
    for field, spec in (("placement", _spec(placement="spread")),
                        ("producer", {**SPEC, "rollout": {**SPEC["rollout"], "max_staleness": 1},
                                      "train": {**SPEC["train"], "producer": "ray"}})):
        r = client.post("/v1/jobs", json=spec)
        assert r.status_code == 422, r.text
        assert r.json()["detail"][0]["loc"] == ["body", "train", field] and "RLVR_RAY_ADDRESS" in r.text


def test_which_jobs_go_to_ray():
    """Fitting jobs keep the local path even with a cluster; the rest go to it; asking for Ray without one
    is an error naming the field, not a silent local run."""
    from trainer.cluster import ClusterError, use_ray
    from trainer.config import JobSpec
    from trainer.distributed import local_devices

    def spec(**train):
        return JobSpec.model_validate({**SPEC, "train": {**SPEC["train"], **train}})

    assert not use_ray(spec(), "head:6379") and not use_ray(spec(), None)
    assert use_ray(spec(), "head:6379", every_job=True)
    too_many = 2 * local_devices("auto")
    assert use_ray(spec(world_size=too_many, prompts_per_step=too_many), "head:6379")
    assert use_ray(spec(placement="pack"), "head:6379")
    with pytest.raises(ClusterError, match="train.placement needs a Ray cluster"):
        use_ray(spec(placement="strict_spread"), None)
