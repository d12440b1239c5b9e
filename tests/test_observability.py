"""Events (paged + SSE), Prometheus metrics, API keys and tenancy."""
from __future__ import annotations

import json

from service.jobs.runner import execute_job

SMALL = {"name": "obs", "rollout": {"group_size": 4, "max_new_tokens": 12}, "data": {"eval_size": 10},
         "train": {"steps": 3, "prompts_per_step": 2, "eval_every": 0, "checkpoint_every": 2, "threads": 1}}


def test_sse_stream_replays_and_ends_when_the_job_ends(client, store, settings):
    job = client.post("/v1/jobs", json=SMALL).json()["id"]
    assert execute_job(job, settings, store) == "succeeded"
    events = []
    with client.stream("GET", f"/v1/jobs/{job}/events/stream", params={"timeout": 30}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        kind = None
        for line in r.iter_lines():
            if line.startswith("event:"):
                kind = line[6:].strip()
            elif line.startswith("data:"):
                events.append((kind, json.loads(line[5:])))
    kinds = [k for k, _ in events]
    assert kinds[-1] == "end"
    assert kinds.count("metrics") == 4 and "checkpoint" in kinds and kinds[0] == "status"
    # status changes (the job's first event on a worker, where it trains, is a status event without one)
    statuses = [d["data"]["status"] for k, d in events if k == "status" and "status" in d["data"]]
    assert statuses == ["queued", "running", "succeeded"]
    ids = [d["id"] for k, d in events if k != "end"]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    # resume the stream after an event id: only what came later
    with client.stream("GET", f"/v1/jobs/{job}/events/stream", headers={"Last-Event-ID": str(ids[-2])}) as r:
        later = [line for line in r.iter_lines() if line.startswith("id:")]
    assert later == [f"id: {ids[-1]}"]
    # paged JSON
    page = client.get(f"/v1/jobs/{job}/events", params={"limit": 2}).json()
    assert len(page["data"]) == 2 and page["has_more"]
    rest = client.get(f"/v1/jobs/{job}/events", params={"after": page["next_after"], "limit": 1000}).json()
    assert [e["id"] for e in page["data"] + rest["data"]] == ids


def _worker_records(store, settings, job_id, records):
    """Record steps as a worker does (service.jobs.runner's on_step: metrics, events, live state)."""
    from types import SimpleNamespace

    from service.jobs.runner import _Recorder

    store.claim(job_id, "w1", 60, "/tmp/x")
    hb = SimpleNamespace(lost=False, progress=lambda: None)  # a heartbeat that never loses the lease
    rec = _Recorder(store, job_id, "w1", hb, settings.runs_dir / job_id, settings)
    for step, m in records:
        rec.on_step(step, m)


def _step(step_s: float, counts: list[int], **extra) -> dict:
    return {"time/step_s": step_s, "tokens_per_s": 120.0, "verifier/math/calls": float(sum(counts)),
            "verifier/math/error_rate": 0.25, "verifier/math/latency_p50_s": 0.002,
            "verifier/math/latency_p95_s": 0.01, "verifier/math/latency_counts": counts,
            "verifier/math/latency_sum_s": 0.05, **extra}


def test_prometheus_metrics(client, store, settings):
    from trainer.scoring import LATENCY_BUCKETS_S

    a = client.post("/v1/jobs", json=SMALL).json()["id"]
    b = client.post("/v1/jobs", json=SMALL).json()["id"]
    client.post(f"/v1/jobs/{b}/cancel")
    n = len(LATENCY_BUCKETS_S) + 1
    one = [0, 0, 3, 1] + [0] * (n - 4)       # 3 calls <= 2.5 ms, 1 <= 5 ms
    two = [0, 0, 1, 0] + [0] * (n - 5) + [2]  # 1 call <= 2.5 ms, 2 slower than every bound
    _worker_records(store, settings, a, [(0, {"eval/accuracy": 0.1}), (1, _step(0.5, one)),
                                         (2, _step(0.25, two, **{"gpu/mem_allocated_gb": 0.5,
                                                                 "gpu/mem_peak_gb": 2.0}))])
    client.get(f"/v1/jobs/{a}")
    text = client.get("/metrics").text
    assert 'rlvr_jobs{status="running"} 1.0' in text and 'rlvr_jobs{status="cancelled"} 1.0' in text
    assert "rlvr_queue_depth 0.0" in text
    assert f'rlvr_job_step{{job="{a}"}} 2.0' in text
    assert f'rlvr_job_steps_per_second{{job="{a}"}} 4.0' in text  # the last step: 0.25 s
    assert f'rlvr_job_tokens_per_second{{job="{a}"}} 120.0' in text
    assert f'rlvr_job_gpu_memory_bytes{{job="{a}",kind="allocated"}} 5.36870912e+08' in text  # 0.5 GiB
    assert f'rlvr_job_gpu_memory_bytes{{job="{a}",kind="peak"}} 2.147483648e+09' in text
    assert f'rlvr_verifier_error_rate{{job="{a}",verifier="math"}} 0.25' in text
    assert f'rlvr_verifier_seconds{{job="{a}",q="p95",verifier="math"}} 0.01' in text
    # the latency histogram sums every recorded step's calls: cumulative buckets, +Inf = all 7 calls
    assert f'rlvr_verifier_latency_seconds_bucket{{job="{a}",le="0.001",verifier="math"}} 0.0' in text
    assert f'rlvr_verifier_latency_seconds_bucket{{job="{a}",le="0.0025",verifier="math"}} 4.0' in text
    assert f'rlvr_verifier_latency_seconds_bucket{{job="{a}",le="0.005",verifier="math"}} 5.0' in text
    assert f'rlvr_verifier_latency_seconds_bucket{{job="{a}",le="30.0",verifier="math"}} 5.0' in text
    assert f'rlvr_verifier_latency_seconds_bucket{{job="{a}",le="+Inf",verifier="math"}} 7.0' in text
    assert f'rlvr_verifier_latency_seconds_count{{job="{a}",verifier="math"}} 7.0' in text
    assert f'rlvr_verifier_latency_seconds_sum{{job="{a}",verifier="math"}} 0.1' in text
    # HTTP series: labelled by route template and status, never by the raw path
    http = [line for line in text.splitlines() if line.startswith("rlvr_http_")]
    assert any('method="GET",route="/v1/jobs/{job_id}",status="200"' in line for line in http), http
    assert any('route="/v1/jobs",status="201"' in line for line in http)
    assert any(line.startswith('rlvr_http_request_duration_seconds_bucket{le="0.005",method="GET",'
                               'route="/v1/jobs/{job_id}"}') for line in http)
    assert not any(a in line or b in line for line in http)
    client.get("/no/such/path/job-123")
    assert 'route="<unrouted>",status="404"' in client.get("/metrics").text
    assert "job-123" not in client.get("/metrics").text


def test_a_scrape_costs_the_same_queries_for_1_or_30_running_jobs(client, store, settings):
    """No query per running job: the live rows come in one query whatever their number."""
    from sqlalchemy import event

    def queries() -> int:
        seen = []
        listener = lambda *args: seen.append(1)  # noqa: E731
        event.listen(store.engine, "before_cursor_execute", listener)
        try:
            assert client.get("/metrics").status_code == 200
        finally:
            event.remove(store.engine, "before_cursor_execute", listener)
        return len(seen)

    def start_jobs(k: int) -> None:
        for _ in range(k):
            job = client.post("/v1/jobs", json=SMALL).json()["id"]
            _worker_records(store, settings, job, [(1, _step(0.5, [1] + [0] * 15))])

    start_jobs(1)
    few = queries()
    start_jobs(29)
    many = queries()
    assert few == many and many <= 3, (few, many)
    assert client.get("/metrics").text.count("rlvr_verifier_latency_seconds_count{") == 30


def test_live_state_folds_step_records():
    from service.store.live import fold

    s = fold(None, _step(0.5, [1] + [0] * 15, **{"gpu/mem_peak_gb": 1.5}))
    s = fold(s, {"eval/accuracy": 0.5})  # an eval-only record changes nothing it does not carry
    assert s["steps_per_s"] == 2.0 and s["gpu"] == {"peak": 1.5 * 2**30}
    s = fold(s, _step(0.25, [0, 2] + [0] * 14) | {"verifier/math/error_rate": 0.5})
    v = s["verifiers"]["math"]
    assert s["steps_per_s"] == 4.0 and v["counts"][:2] == [1, 2] and sum(v["counts"]) == 3
    assert v["sum"] == 0.1 and v["error_rate"] == 0.5
    # a malformed histogram (another build's bucket count) is ignored, not mixed in
    assert fold(s, _step(0.25, [5, 5]))["verifiers"]["math"]["counts"] == v["counts"]


def test_server_wide_series_need_an_all_tenant_scrape(tmp_path, models_dir):
    from fastapi.testclient import TestClient

    from service.app import create_app
    from service.settings import Settings

    admin = {"Authorization": "Bearer " + "a" * 24}
    with TestClient(create_app(Settings(home=tmp_path, models=models_dir, auth=True, admin_key="a" * 24),
                               reaper=False)) as c:
        key = c.post("/v1/keys", json={"tenant": "t1"}, headers=admin).json()["key"]
        tenant = {"Authorization": f"Bearer {key}"}
        assert c.get("/metrics").status_code == 401
        job = c.post("/v1/jobs", json=SMALL, headers=tenant).json()["id"]
        assert "rlvr_http_requests" in c.get("/metrics", headers=admin).text
        mine = c.get("/metrics", headers=tenant).text
        assert "rlvr_jobs" in mine and "rlvr_http_" not in mine and job not in mine.split("rlvr_jobs", 1)[0]


def test_keys_tenants_and_admin(tmp_path, models_dir):
    from fastapi.testclient import TestClient

    from service.app import create_app
    from service.settings import Settings

    admin = {"Authorization": "Bearer " + "a" * 24}
    with TestClient(create_app(Settings(home=tmp_path, models=models_dir, auth=True, admin_key="a" * 24),
                               reaper=False)) as c:
        assert c.post("/v1/jobs", json=SMALL).status_code == 401
        assert c.post("/v1/jobs", json=SMALL, headers={"Authorization": "Bearer nope"}).status_code == 401
        k1 = c.post("/v1/keys", json={"tenant": "t1"}, headers=admin).json()["key"]
        k2 = c.post("/v1/keys", json={"tenant": "t2"}, headers=admin).json()["key"]
        h1, h2 = {"Authorization": f"Bearer {k1}"}, {"Authorization": f"Bearer {k2}"}
        assert c.post("/v1/keys", json={"tenant": "x"}, headers=h1).status_code == 403  # not admin
        job = c.post("/v1/jobs", json=SMALL, headers=h1).json()["id"]
        assert c.get(f"/v1/jobs/{job}", headers=h1).status_code == 200
        for path in (f"/v1/jobs/{job}", f"/v1/jobs/{job}/metrics", f"/v1/jobs/{job}/events",
                     f"/v1/jobs/{job}/checkpoints", f"/v1/jobs/{job}/rollouts"):
            assert c.get(path, headers=h2).status_code == 404, path
        assert c.post(f"/v1/jobs/{job}/cancel", headers=h2).status_code == 404
        assert c.get("/v1/jobs", headers=h2).json()["data"] == []
        assert [j["id"] for j in c.get("/v1/jobs", headers=admin).json()["data"]] == [job]
        fid = c.post("/v1/files", files={"file": ("d.jsonl", b'{"prompt": "a", "reference": "b"}\n')},
                     headers=h1).json()["id"]
        assert c.get(f"/v1/files/{fid}", headers=h2).status_code == 404
        assert c.get(f"/v1/files/{fid}/content", headers=h1).text.startswith('{"prompt"')
        assert c.delete(f"/v1/files/{fid}", headers=h1).json()["deleted"] is True
