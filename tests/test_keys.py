"""API keys: list (never the secret) and revoke, over HTTP and the CLI; a revoked key is refused at once by the
process that revoked it, and by another API process within its key cache's lifetime (measured here)."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx
import pytest
from fastapi.testclient import TestClient

from tests.conftest import REPO, free_port, spawn, stop, wait_for

ADMIN = "keys-admin-key-for-tests"


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
def api(tmp_path, models_dir):
    from service.app import create_app
    from service.settings import Settings

    app = create_app(Settings(home=tmp_path / "home", models=models_dir, auth=True, admin_key=ADMIN), reaper=False)
    with TestClient(app) as c:
        keys = {}
        for tenant in ("alice", "alice", "bob"):
            r = c.post("/v1/keys", json={"tenant": tenant}, headers=bearer(ADMIN))
            assert r.status_code == 201, r.text
            keys.setdefault(tenant, []).append(r.json())
        yield c, keys


def test_keys_are_listed_per_tenant_without_their_secret(api):
    c, keys = api
    alice, bob = keys["alice"], keys["bob"][0]
    mine = c.get("/v1/keys", headers=bearer(alice[0]["key"])).json()["data"]
    assert {k["id"] for k in mine} == {k["id"] for k in alice}  # her tenant's keys, not bob's
    assert [k["current"] for k in mine if k["id"] == alice[0]["id"]] == [True]
    every = c.get("/v1/keys", headers=bearer(ADMIN)).json()["data"]
    assert {k["id"] for k in every} == {k["id"] for k in alice + [bob]}  # admin: every tenant's
    for listing in (mine, every):
        text = str(listing)
        for k in alice + [bob]:
            assert k["key"] not in text and k["key"][5:-4] not in text  # no secret, not even most of it
    hints = {k["id"]: k["redacted"] for k in every}
    assert all(hints[k["id"]] == "rlvr_…" + k["key"][-4:] for k in alice + [bob])
    assert {"id", "tenant", "admin", "created_at", "redacted", "revoked"} <= set(every[0])


def test_a_revoked_key_is_refused_at_once_and_revoking_is_scoped(api):
    c, keys = api
    a0, a1, bob = keys["alice"][0], keys["alice"][1], keys["bob"][0]
    assert c.get("/v1/jobs", headers=bearer(a1["key"])).status_code == 200  # now in the auth cache
    # bob cannot revoke alice's key: it reads as a missing one
    theirs = c.delete(f"/v1/keys/{a1['id']}", headers=bearer(bob["key"]))
    none = c.delete("/v1/keys/key-0000000000000000", headers=bearer(bob["key"]))
    assert theirs.status_code == none.status_code == 404
    assert theirs.text.replace(a1["id"], "ID") == none.text.replace("key-0000000000000000", "ID")
    assert c.get("/v1/jobs", headers=bearer(a1["key"])).status_code == 200
    # alice revokes her second key; the very next request with it is refused (cache entry dropped)
    r = c.delete(f"/v1/keys/{a1['id']}", headers=bearer(a0["key"]))
    assert r.status_code == 200 and r.json()["revoked"] and r.json()["revoked_at"]
    assert c.get("/v1/jobs", headers=bearer(a1["key"])).status_code == 401
    assert c.get("/v1/jobs", headers=bearer(a0["key"])).status_code == 200
    listed = c.get("/v1/keys", headers=bearer(a0["key"])).json()["data"]
    assert a1["id"] not in [k["id"] for k in listed]
    with_revoked = c.get("/v1/keys", params={"revoked": True}, headers=bearer(a0["key"])).json()["data"]
    assert a1["id"] in [k["id"] for k in with_revoked]
    # the admin revokes bob's key
    assert c.delete(f"/v1/keys/{bob['id']}", headers=bearer(ADMIN)).status_code == 200
    assert c.get("/v1/jobs", headers=bearer(bob["key"])).status_code == 401


def test_rlvr_keys_list_and_revoke(tmp_path):
    env = {**os.environ, "RLVR_HOME": str(tmp_path / "home")}

    def rlvr(*args):
        out = subprocess.run([sys.executable, "-m", "service.cli", "keys", *args], env=env, cwd=REPO,
                             capture_output=True, text=True, timeout=120)
        return out

    key = rlvr("create", "--tenant", "carol").stdout.strip().splitlines()[-1]
    out = rlvr("list")
    assert out.returncode == 0 and "carol" in out.stdout and key[-4:] in out.stdout and key not in out.stdout
    key_id = out.stdout.split()[0]
    assert rlvr("revoke", key_id).returncode == 0
    assert "carol" not in rlvr("list").stdout and "revoked" in rlvr("list", "--revoked").stdout
    bad = rlvr("revoke", "key-nope")
    assert bad.returncode == 1 and "no key" in bad.stderr


@pytest.mark.slow
def test_another_api_process_refuses_a_revoked_key_within_its_cache_lifetime(tmp_path):
    """Two API processes on one store: revoke through A, poll B until it refuses. Measured, and bounded by
    the key cache's lifetime (plus one poll and one lookup)."""
    from service.access.gate import KEY_CACHE_S

    env = {"RLVR_HOME": str(tmp_path / "home"), "RLVR_AUTH": "true", "RLVR_ADMIN_KEY": ADMIN}
    ports = [free_port(), free_port()]
    procs = [spawn(["service.cli", "serve", "--port", str(p)], env, tmp_path / f"api{i}.log")
             for i, p in enumerate(ports)]
    try:
        a, b = (f"http://127.0.0.1:{p}" for p in ports)
        for url in (a, b):
            wait_for(lambda url=url: _up(url), 90, url)
        key = httpx.post(f"{a}/v1/keys", json={"tenant": "dave"}, headers=bearer(ADMIN), timeout=10).json()
        with httpx.Client(headers=bearer(key["key"]), timeout=10) as client:
            assert client.get(f"{b}/v1/jobs").status_code == 200  # B has it cached now
            t0 = time.monotonic()
            assert httpx.delete(f"{a}/v1/keys/{key['id']}", headers=bearer(ADMIN), timeout=10).status_code == 200
            revoked_in = time.monotonic() - t0
            assert client.get(f"{a}/v1/jobs").status_code == 401  # A: at once
            while client.get(f"{b}/v1/jobs").status_code == 200:
                assert time.monotonic() - t0 < KEY_CACHE_S + 2.0, "B still accepts the revoked key"
                time.sleep(0.02)
            accepted_for = time.monotonic() - t0
        print(f"revoke_s={revoked_in:.3f} other_process_accepted_for_s={accepted_for:.3f} key_cache_s={KEY_CACHE_S}")
    finally:
        for p in procs:
            stop(p)


def _up(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.mark.slow
def test_a_revoked_keys_open_streams_stop(tmp_path):
    """Issue 33: a revoked key's open event stream kept delivering events (for up to 24 h). Against a real
    server (responses really stream): the SSE stream ends with `end` (key revoked) and delivers nothing
    written after the revocation; a checkpoint download being read stops short."""
    import threading

    from service.settings import Settings
    from service.store.jobs import Store

    home = tmp_path / "home"
    env = {"RLVR_HOME": str(home), "RLVR_AUTH": "true", "RLVR_ADMIN_KEY": ADMIN}
    port = free_port()
    proc = spawn(["service.cli", "serve", "--port", str(port)], env, tmp_path / "api.log")
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: _up(url), 90, url)
        key = httpx.post(f"{url}/v1/keys", json={"tenant": "erin"}, headers=bearer(ADMIN), timeout=10).json()
        store = Store(Settings(home=home).db_url)
        job = store.create_job({"name": "watched", "train": {"steps": 1}}, tenant="erin")
        ckpt = tmp_path / "ckpt"
        ckpt.mkdir()
        with open(ckpt / "model.safetensors", "wb") as f:
            f.truncate(256 << 20)  # sparse
        store.put_checkpoint(job.id, 1, "step-0000001", str(ckpt), {})
        lines: list[str] = []
        got = {"bytes": 0}
        first = threading.Event()

        def follow():
            with httpx.stream("GET", f"{url}/v1/jobs/{job.id}/events/stream", params={"timeout": 60},
                              headers=bearer(key["key"]), timeout=30) as r:
                for line in r.iter_lines():
                    lines.append(line)
                    if line.startswith("id: "):
                        first.set()

        def download():
            with httpx.stream("GET", f"{url}/v1/jobs/{job.id}/checkpoints/step-0000001/download",
                              headers=bearer(key["key"]), timeout=30) as r:
                assert r.status_code == 200
                try:
                    for chunk in r.iter_bytes(1 << 20):
                        got["bytes"] += len(chunk)
                        time.sleep(0.02)  # a slow reader: 256 MiB would take over 5 s
                except httpx.HTTPError:
                    pass  # the server ended the body short

        threads = [threading.Thread(target=follow), threading.Thread(target=download)]
        store.add_event(job.id, "status", "before the revocation")
        for t in threads:
            t.start()
        assert first.wait(20), lines
        time.sleep(0.5)
        t0 = time.monotonic()
        assert httpx.delete(f"{url}/v1/keys/{key['id']}", headers=bearer(ADMIN), timeout=10).status_code == 200
        for i in range(20):
            store.add_event(job.id, "status", f"after the revocation {i}")
            time.sleep(0.1)
        for t in threads:
            t.join(30)
        assert not any(t.is_alive() for t in threads)
        assert time.monotonic() - t0 < 10
        text = "\n".join(lines)
        assert "before the revocation" in text and "after the revocation" not in text, text
        assert "event: end" in text and "key revoked" in text
        assert 0 < got["bytes"] < 200 << 20, got  # cut short, well before the end of the archive
    finally:
        stop(proc)


@pytest.mark.slow
def test_nothing_written_after_a_revocation_reaches_a_stream_whatever_its_phase(tmp_path):
    """CI (2026-12-03): a stream asked about its key once a second, so an event written just after the
    revocation reached it when its 0.5 s poll came before its next check. Eight streams, opened 0.13 s apart so
    their checks fall at different points of the second, each on its own key of one tenant; every key revoked,
    then one event written: no stream may deliver it (the old code delivered it to some: this test failed on it)."""
    import threading

    from service.settings import Settings
    from service.store.jobs import Store

    home = tmp_path / "home"
    port = free_port()
    proc = spawn(["service.cli", "serve", "--port", str(port)],
                 {"RLVR_HOME": str(home), "RLVR_AUTH": "true", "RLVR_ADMIN_KEY": ADMIN}, tmp_path / "api.log")
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: _up(url), 90, url)
        store = Store(Settings(home=home).db_url)
        job = store.create_job({"name": "watched", "train": {"steps": 1}}, tenant="erin")
        keys = [httpx.post(f"{url}/v1/keys", json={"tenant": "erin"}, headers=bearer(ADMIN), timeout=10).json()
                for _ in range(8)]
        texts: list[list[str]] = [[] for _ in keys]
        opened = [threading.Event() for _ in keys]

        def follow(i):
            with httpx.stream("GET", f"{url}/v1/jobs/{job.id}/events/stream", params={"timeout": 60},
                              headers=bearer(keys[i]["key"]), timeout=30) as r:
                for line in r.iter_lines():
                    texts[i].append(line)
                    if line.startswith("id: "):
                        opened[i].set()

        threads = [threading.Thread(target=follow, args=(i,)) for i in range(len(keys))]
        for t, seen in zip(threads, opened):
            t.start()
            assert seen.wait(20)
            time.sleep(0.13)
        for k in keys:
            assert httpx.delete(f"{url}/v1/keys/{k['id']}", headers=bearer(ADMIN), timeout=10).status_code == 200
        store.add_event(job.id, "status", "after the revocation")
        for t in threads:
            t.join(30)
        assert not any(t.is_alive() for t in threads)
        for lines in texts:
            text = "\n".join(lines)
            assert "after the revocation" not in text and "key revoked" in text, text
    finally:
        stop(proc)


def test_an_ordinary_key_cannot_see_or_revoke_an_admin_key_of_its_tenant_name(api):
    """Issue 33: alice's ordinary key listed and revoked an admin key that carried the tenant name alice."""
    c, keys = api
    alice = keys["alice"][0]
    boss = c.post("/v1/keys", json={"tenant": "alice", "admin": True}, headers=bearer(ADMIN)).json()
    mine = c.get("/v1/keys", headers=bearer(alice["key"]), params={"revoked": True}).json()["data"]
    assert boss["id"] not in {k["id"] for k in mine} and not any(k["admin"] for k in mine)
    r = c.delete(f"/v1/keys/{boss['id']}", headers=bearer(alice["key"]))
    assert r.status_code == 404 and r.json() == {"detail": f"key {boss['id']!r} not found"}  # like a missing key
    assert c.get("/v1/jobs", headers=bearer(boss["key"])).status_code == 200  # still good
    assert c.post("/v1/keys", json={"tenant": "alice", "admin": True}, headers=bearer(alice["key"])).status_code == 403
    # an admin key sees and revokes it
    assert boss["id"] in {k["id"] for k in c.get("/v1/keys", headers=bearer(ADMIN)).json()["data"]}
    assert c.delete(f"/v1/keys/{boss['id']}", headers=bearer(boss["key"])).status_code == 200  # itself, too
    assert c.get("/v1/jobs", headers=bearer(boss["key"])).status_code == 401
