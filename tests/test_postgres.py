"""The store's concurrency-sensitive paths on PostgreSQL (the distributed mode's database)."""
from __future__ import annotations

import threading
import time

import pytest

from service.store.jobs import IllegalTransition, JobStatus, LeaseLost, Store

pytestmark = pytest.mark.postgres
SPEC = {"name": "pg", "train": {"steps": 5}}


def test_claim_is_exclusive_under_concurrency(pg_url):
    store = Store(pg_url)
    job = store.create_job(SPEC).id
    winners = []

    def grab(i):
        if store.claim(job, f"w{i}", 30, "/tmp/r") is not None:
            winners.append(i)

    threads = [threading.Thread(target=grab, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(winners) == 1
    assert store.get_job(job).attempts == 1


def test_lease_expiry_requeue_and_fencing(pg_url):
    store = Store(pg_url)
    job = store.create_job(SPEC).id
    assert store.claim(job, "w1", 0.3, "/tmp/r")
    store.put_metrics(job, 1, {"x": 1}, owner="w1")
    time.sleep(0.5)
    assert store.reap(requeue_after_s=3600, max_attempts=3) == [job]
    assert store.get_job(job).status == "queued"
    assert store.claim(job, "w2", 30, "/tmp/r")
    with pytest.raises(LeaseLost):
        store.put_metrics(job, 2, {"x": 2}, owner="w1")  # the old worker is fenced off
    store.put_metrics(job, 1, {"x": 10}, owner="w2")  # replayed step overwrites
    store.put_metrics(job, 2, {"x": 20}, owner="w2")
    assert [(m.step, m.data) for m in store.get_metrics(job)] == [(1, {"x": 10}), (2, {"x": 20})]
    store.finish(job, "w2", JobStatus.succeeded, result={"ok": True})
    assert store.get_job(job).status == "succeeded"
    with pytest.raises(IllegalTransition):
        store.request(job, "resume")


def test_migrations_are_idempotent_and_concurrent(pg_url):
    stores = []
    threads = [threading.Thread(target=lambda: stores.append(Store(pg_url))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(stores) == 3
    assert stores[0].count_by_status() == {}


def test_api_on_postgres(pg_url, tmp_path, models_dir):
    from fastapi.testclient import TestClient

    from service.app import create_app
    from service.settings import Settings

    settings = Settings(home=tmp_path, models=models_dir, database_url=pg_url)
    with TestClient(create_app(settings)) as c:
        r = c.post("/v1/jobs", json={**SPEC, "metadata": {"team": "a"}})
        assert r.status_code == 201, r.text
        c.post("/v1/jobs", json={**SPEC, "metadata": {"team": "b"}})
        assert [j["metadata"]
                for j in c.get("/v1/jobs", params={"metadata": "team=a"}).json()["data"]] == [{"team": "a"}]
        page1 = c.get("/v1/jobs", params={"limit": 1}).json()
        page2 = c.get("/v1/jobs", params={"limit": 1, "after": page1["next_cursor"]}).json()
        assert page1["has_more"] and not page2["has_more"]
        assert page1["data"][0]["id"] != page2["data"][0]["id"]
        assert c.post(f"/v1/jobs/{r.json()['id']}/cancel").json()["status"] == "cancelled"
