"""Events (paged + SSE), Prometheus metrics, API keys and tenancy."""
from __future__ import annotations

import json

from service.runner import execute_job

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
    statuses = [d["data"]["status"] for k, d in events if k == "status"]
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


def test_prometheus_metrics(client, store):
    a = client.post("/v1/jobs", json=SMALL).json()["id"]
    b = client.post("/v1/jobs", json=SMALL).json()["id"]
    client.post(f"/v1/jobs/{b}/cancel")
    store.claim(a, "w1", 60, "/tmp/x")
    store.put_metrics(a, 1, {"time/step_s": 0.5, "verifier/math/error_rate": 0.25,
                             "verifier/math/latency_p95_s": 0.01}, owner="w1")
    text = client.get("/metrics").text
    assert 'rlvr_jobs{status="running"} 1.0' in text and 'rlvr_jobs{status="cancelled"} 1.0' in text
    assert "rlvr_queue_depth 0.0" in text
    assert f'rlvr_job_steps_per_second{{job="{a}"}} 2.0' in text
    assert f'rlvr_verifier_error_rate{{job="{a}",verifier="math"}} 0.25' in text
    assert f'rlvr_verifier_seconds{{job="{a}",q="p95",verifier="math"}} 0.01' in text


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
