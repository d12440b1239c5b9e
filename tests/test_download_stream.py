"""A checkpoint larger than the API's memory cap downloads whole: the tar is streamed as it is read.

The API runs as a real `rlvr serve` process inside a memory control group capped at 384 MiB (the
sandbox's cgroup code makes it; page cache is reclaimable, the process's own memory is not) and serves a
checkpoint holding a 1 GiB file. Building the archive in memory, as the API once did, would be
OOM-killed; streaming it must arrive byte-complete, with the trainer state left out unless asked for.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tarfile

import httpx
import pytest

from tests.conftest import REPO, free_port, wait_for

CAP = 384 << 20  # the API process itself needs ~150 MiB
BIG = 1 << 30


@pytest.fixture
def capped():
    try:
        from sandbox import cgroups

        if os.geteuid() != 0:
            raise PermissionError("not root")
        cg = cgroups.CgroupSet("apitest")
        cg.set_memory(CAP)
    except Exception as e:  # noqa: BLE001 - any reason we cannot cap memory here: say it and skip
        pytest.skip(f"cannot make a memory-capped control group here: {e}")
    yield cg
    cg.kill()
    cg.remove()


def test_a_checkpoint_bigger_than_the_memory_cap_streams_whole(tmp_path, capped):
    from service.settings import Settings
    from service.store.jobs import Store

    home = tmp_path / "home"
    settings = Settings(home=home)
    store = Store(settings.db_url)
    job = store.create_job({"name": "big", "train": {"steps": 1}}, tenant="default")
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    with open(ckpt / "model.safetensors", "wb") as f:  # sparse: 1 GiB on disk costs nothing
        f.truncate(BIG)
    (ckpt / "trainer_state.pt").write_bytes(b"optimiser state")
    store.put_checkpoint(job.id, 1, "step-0000001", str(ckpt), {})
    small = tmp_path / "small"
    small.mkdir()
    (small / "config.json").write_text("{}")
    (small / "trainer_state.pt").write_bytes(b"optimiser state")
    store.put_checkpoint(job.id, 2, "step-0000002", str(small), {})
    port = free_port()
    env = {**os.environ, "RLVR_HOME": str(home), "RLVR_PORT": str(port)}
    proc = subprocess.Popen([sys.executable, "-m", "service.cli", "serve", "--port", str(port)], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=capped.join_self)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_for(lambda: _ok(base), 60, "the API")
        got = tmp_path / "got.tar"
        with httpx.stream("GET", f"{base}/v1/jobs/{job.id}/checkpoints/step-0000001/download", timeout=120) as r:
            assert r.status_code == 200
            with open(got, "wb") as out:
                for chunk in r.iter_bytes(1 << 20):
                    out.write(chunk)
        assert proc.poll() is None and capped.oom_kills() == 0  # it never came near the cap
        with tarfile.open(got) as tar:
            members = {m.name: m.size for m in tar.getmembers()}
        assert members["step-0000001/model.safetensors"] == BIG
        assert "step-0000001/trainer_state.pt" not in members  # the servable folder unless asked for
        r = httpx.get(f"{base}/v1/jobs/{job.id}/checkpoints/step-0000002/download", params={"state": "true"},
                      timeout=60)
        (tmp_path / "small.tar").write_bytes(r.content)
        with tarfile.open(tmp_path / "small.tar") as tar:  # asked for: the trainer state comes too
            assert tar.extractfile("step-0000002/trainer_state.pt").read() == b"optimiser state"
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def _ok(base: str) -> bool:
    try:
        return httpx.get(f"{base}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
