"""API load: requests/s of `rlvr serve` with 1 and 2 worker processes on /healthz and on a job-status
poll, next to a bare uvicorn + Starlette app returning a constant JSON body (the framework's ceiling on
the same machine, served the same way), plus submit latency.

The load comes from wrk (C, one event loop), never from a Python client measuring itself: without wrk
this refuses to report a figure (`apt-get install wrk`; `make system-deps` installs it). For every run
it also reports what each request cost the server processes — CPU time and time spent runnable but
waiting for a CPU (/proc/<pid>/task/*/schedstat) — so a worker count that loses is explained, not guessed.
One ablation runs 2 workers with uvicorn's default protocol (no TCP_NODELAY; see service/cli/serve.py).

Loopback only, bounded in count and time; embedded mode (SQLite + filesystem broker).
Last line: key=value figures (polls_per_s is the default, 1 worker).
``--smoke`` (CI, tests/test_bench_smoke.py): every run above for 1 s, 10 submits: checks the script runs end to
end (seconds); its figures are not measurements.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
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


def wrk_or_refuse() -> str:
    path = shutil.which("wrk")
    if path is None:
        sys.exit("bench/api.py: wrk is not installed (apt-get install wrk, or `make system-deps`); refusing to "
                 "report a figure measured by a Python client that competes with the server for the same cores")
    out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10)
    return (out.stdout + out.stderr).split("Copyright")[0].strip() or "wrk"


def process_tree(root: int) -> list[int]:
    """``root`` and its descendants (uvicorn's supervisor and its workers)."""
    parents: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            parents.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(parents.get(pid, []))
    return out


def schedstat(pids: list[int]) -> tuple[int, int]:
    """(CPU ns, run-queue wait ns) summed over every thread of ``pids``."""
    cpu = wait = 0
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                c, w, _ = (task / "schedstat").read_text().split()
            except (OSError, ValueError):
                continue
            cpu, wait = cpu + int(c), wait + int(w)
    return cpu, wait


def wrk(url: str, seconds: int, connections: int, server_root: int) -> dict[str, float]:
    pids = process_tree(server_root)
    c0, w0 = schedstat(pids)
    out = subprocess.run(["wrk", "-t", "1", "-c", str(connections), "-d", f"{seconds}s", "--latency", url],
                         capture_output=True, text=True, timeout=seconds + 60).stdout
    c1, w1 = schedstat(pids)
    n = int(re.search(r"(\d+) requests in", out).group(1))
    lat = re.search(r"Latency\s+([\d.]+)(us|ms|s)", out)
    scale = {"us": 1e-3, "ms": 1.0, "s": 1e3}[lat.group(2)]
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    return {"rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),
            "latency_ms": float(lat.group(1)) * scale,
            "errors": (int(bad.group(1)) if bad else 0) + (sum(map(int, errors.groups())) if errors else 0),
            "cpu_ms": (c1 - c0) / 1e6 / max(n, 1), "runq_ms": (w1 - w0) / 1e6 / max(n, 1)}


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


class Server:
    def __init__(self, argv: list[str], env: dict[str, str], probe: str):
        self.proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.probe = probe

    def __enter__(self) -> "Server":
        wait_up(self.probe)
        return self

    def __exit__(self, *exc) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="5 s per measurement (about 2 minutes in all)")
    ap.add_argument("--smoke", action="store_true", help="1 s per run, 10 submits: checks the script runs "
                    "(seconds; not a measurement)")
    ap.add_argument("--workers", default="1,2", help="worker counts to compare")
    ap.add_argument("--concurrency", type=int, default=32)
    args = ap.parse_args()
    generator = wrk_or_refuse()
    seconds, submits = (1, 10) if args.smoke else (5, 200) if args.quick else (20, 1000)
    counts = [int(w) for w in args.workers.split(",")]
    home = Path(tempfile.mkdtemp(prefix="rlvr-bench-api-"))
    env = {**os.environ, "RLVR_HOME": str(home), "RLVR_REAPER_INTERVAL_S": "3600"}
    for k in ("RLVR_BROKER_URL", "RLVR_DATABASE_URL", "RLVR_AUTH"):
        env.pop(k, None)
    (home / "bare.py").write_text(BARE_APP)
    rows: dict[str, dict[str, float]] = {}
    lat: list[float] = []
    for w in counts:
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        with Server([sys.executable, "-m", "service.cli", "serve", "--port", str(port), "--workers", str(w)], env,
                    base + "/healthz") as s:
            if not lat:
                lat = submit_latencies(base, submits)
            job_id = httpx.post(base + "/v1/jobs", json={"name": "poll-me"}, timeout=60).json()["id"]
            rows[f"healthz_w{w}"] = wrk(base + "/healthz", seconds, args.concurrency, s.proc.pid)
            rows[f"poll_w{w}"] = wrk(f"{base}/v1/jobs/{job_id}", seconds, args.concurrency, s.proc.pid)
    # ablation: uvicorn's default protocol, i.e. `rlvr serve` before TCP_NODELAY was set per connection
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with Server([sys.executable, "-m", "uvicorn", "service.app:create_app", "--factory", "--port", str(port),
                 "--workers", "2", "--log-level", "warning"], env, base + "/healthz") as s:
        job_id = httpx.post(base + "/v1/jobs", json={"name": "poll-me"}, timeout=60).json()["id"]
        rows["poll_w2_nagle"] = wrk(f"{base}/v1/jobs/{job_id}", seconds, args.concurrency, s.proc.pid)
    for w in counts:
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        with Server([sys.executable, "-m", "uvicorn", "bare:app", "--port", str(port), "--workers", str(w),
                     "--http", "service.cli.serve:NoDelayHTTP", "--log-level", "warning", "--app-dir", str(home)],
                    env, base + "/v1/jobs/x") as s:
            rows[f"bare_w{w}"] = wrk(base + "/v1/jobs/x", seconds, args.concurrency, s.proc.pid)

    print(f"load generator: {generator} (1 thread, {args.concurrency} connections, {seconds}s per run, same cores)")
    print(f"{'run':<16} {'req/s':>8} {'latency ms':>11} {'server CPU ms/req':>18} {'run-queue wait ms/req':>22} errors")
    for name, r in rows.items():
        print(f"{name:<16} {r['rps']:>8.0f} {r['latency_ms']:>11.2f} {r['cpu_ms']:>18.3f} {r['runq_ms']:>22.3f} "
              f"{r['errors']:.0f}")
    q = statistics.quantiles(lat, n=100)
    print(f"submit: n={len(lat)} p50={q[49]:.1f} ms p99={q[98]:.1f} ms max={max(lat):.1f} ms (1 worker)")
    figures = {"polls_per_s": rows[f"poll_w{counts[0]}"]["rps"]}
    figures |= {f"{k}_per_s": r["rps"] for k, r in rows.items()}
    figures |= {"submit_p50_ms": q[49], "submit_p99_ms": q[98],
                "errors": sum(r["errors"] for r in rows.values()), "load1": os.getloadavg()[0]}
    print(" ".join(f"{k}={v:.1f}" if isinstance(v, float) and v < 100 else f"{k}={v:.0f}" for k, v in figures.items())
          + f" generator=wrk cores={os.cpu_count()}")


if __name__ == "__main__":
    main()
