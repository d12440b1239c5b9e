"""API load: status polls/s and submit latency against a running rlvr server, next to a bare
uvicorn app returning a constant JSON body (the framework's ceiling on the same machine).

Loopback only, bounded in count and time. Embedded mode (SQLite + filesystem broker) by default.
Last line: polls_per_s=… submit_p99_ms=… (and more key=value figures).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
BARE_APP = '''
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route
BODY = {"id": "job-0", "status": "running", "progress": {"step": 1, "total_steps": 2}}
app = Starlette(routes=[Route("/v1/jobs/{job_id}", lambda r: JSONResponse(BODY))])
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_up(url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            httpx.get(url, timeout=2)
            return
        except httpx.HTTPError:
            time.sleep(0.2)
    raise TimeoutError(url)


async def poll_load(base: str, path: str, seconds: float, concurrency: int) -> tuple[float, int]:
    """Closed-loop load: `concurrency` clients poll as fast as answers come back."""
    done, errors = 0, 0
    deadline = time.monotonic() + seconds
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=10) as c:
        async def client():
            nonlocal done, errors
            while time.monotonic() < deadline:
                r = await c.get(path)
                done += 1
                errors += r.status_code != 200
        t0 = time.monotonic()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        elapsed = time.monotonic() - t0
    return done / elapsed, errors


def wrk_load(url: str, seconds: float, concurrency: int) -> tuple[float, int]:
    """wrk (C, event loop) when installed: the load generator costs far less CPU than the server."""
    import re
    import shutil

    out = subprocess.run([shutil.which("wrk"), "-t", "1", "-c", str(concurrency), "-d", f"{seconds:.0f}s", url],
                         capture_output=True, text=True, timeout=seconds + 30).stdout
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return rate, int(bad.group(1)) if bad else 0


def load(base: str, path: str, seconds: float, concurrency: int) -> tuple[float, int, str]:
    import shutil

    if shutil.which("wrk"):
        return (*wrk_load(base + path, seconds, concurrency), "wrk")
    return (*asyncio.run(poll_load(base, path, seconds, concurrency)), "httpx")


def submit_latencies(base: str, n: int) -> list[float]:
    spec = {"name": "bench", "train": {"steps": 1}}
    out = []
    with httpx.Client(base_url=base, timeout=10) as c:
        for _ in range(n):
            t0 = time.perf_counter()
            r = c.post("/v1/jobs", json=spec)
            out.append((time.perf_counter() - t0) * 1000)
            assert r.status_code == 201, r.text
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="short run (< 1 minute)")
    ap.add_argument("--workers", type=int, default=2, help="API worker processes")
    ap.add_argument("--concurrency", type=int, default=32)
    args = ap.parse_args()
    seconds, submits = (5, 200) if args.quick else (20, 1000)
    home = Path(tempfile.mkdtemp(prefix="rlvr-bench-api-"))
    env = {**os.environ, "RLVR_HOME": str(home), "RLVR_REAPER_INTERVAL_S": "3600"}
    env.pop("RLVR_BROKER_URL", None)
    env.pop("RLVR_DATABASE_URL", None)
    procs = []
    try:
        port, bare_port = free_port(), free_port()
        procs.append(subprocess.Popen([sys.executable, "-m", "service.cli", "serve", "--port", str(port),
                                       "--workers", str(args.workers)], cwd=REPO, env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        (home / "bare.py").write_text(BARE_APP)
        procs.append(subprocess.Popen([sys.executable, "-m", "uvicorn", "bare:app", "--port", str(bare_port),
                                       "--workers", str(args.workers), "--log-level", "warning", "--app-dir",
                                       str(home)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        base, bare = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{bare_port}"
        wait_up(base + "/healthz")
        wait_up(bare + "/v1/jobs/x")
        lat = submit_latencies(base, submits)
        job_id = httpx.post(base + "/v1/jobs", json={"name": "poll-me"}).json()["id"]
        ours, err, tool = load(base, f"/v1/jobs/{job_id}", seconds, args.concurrency)
        peer, _, _ = load(bare, "/v1/jobs/x", seconds, args.concurrency)
    finally:
        for p in procs:
            p.terminate()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
    q = statistics.quantiles(lat, n=100)
    print(f"submit: n={len(lat)} p50={q[49]:.1f} ms p99={q[98]:.1f} ms max={max(lat):.1f} ms")
    print(f"status polls: rlvr {ours:.0f}/s ({err} errors) vs bare uvicorn+starlette constant JSON {peer:.0f}/s "
          f"({args.workers} server workers, {args.concurrency} connections, {seconds}s, load from {tool} on the same cores)")
    print(f"polls_per_s={ours:.0f} submit_p99_ms={q[98]:.1f} submit_p50_ms={q[49]:.1f} bare_polls_per_s={peer:.0f} "
          f"poll_errors={err} load1={os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
