"""GET /metrics scrape time with many running jobs: the live-state scrape (service.api.prom: one query for
every running job's job_live row) against its peer, the scrape it replaced (one metrics query per running
job, reading that job's last step record).

Both read the same store: N running jobs, each with S recorded steps of a realistic step record (~45
keys, one verifier), recorded through the worker's own path (``Store.put_metrics`` + ``Store.put_live``).
Times are wall-clock, median and p95 over R interleaved repetitions.

    python bench/prom_scrape.py [--jobs 200] [--steps 50] [--scrapes 30] [--postgres]
    python bench/prom_scrape.py --quick
    python bench/prom_scrape.py --smoke [--postgres]   # CI: 3 jobs, 2 steps, 2 scrapes (checks it runs; no figure)

Reported apart: the data fetch (the queries and rows a scrape reads) and the whole scrape (fetch plus
Prometheus text; ours through HTTP, and it exposes more: per-job latency histograms and HTTP series).
The last line: ``jobs=… ours_fetch_p50_ms=… peer_fetch_p50_ms=… … ours_queries=… peer_queries=…``.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def step_record(step: int) -> dict:
    from trainer.scoring import LATENCY_BUCKETS_S

    m = {k: 0.1 * step for k in (
        "reward/mean", "reward/std", "reward/infra_fail_frac", "reward/infra_retried", "accuracy",
        "zero_std_group_frac_final", "dead_group_token_frac", "completion/len_mean", "completion/len_max",
        "completion/truncated_frac", "rollout_tokens", "time/rollout_s", "time/score_s", "adv/mean", "adv/std",
        "adv/max_abs", "update/skipped_row_frac", "time/update_s", "loss", "grad_norm", "clip_frac", "entropy",
        "rollout/logp_abs_diff_mean", "rollout/logp_abs_diff_max", "rollout/is_ratio_mean", "lr",
        "data_position", "zero_std_group_frac", "resampled_groups", "verifier/math/mean", "verifier/math/std")}
    m.update({"time/step_s": 0.8, "tokens_per_s": 1500.0, "verifier/math/calls": 64.0,
              "verifier/math/error_rate": 0.0, "verifier/math/timeout_rate": 0.0,
              "verifier/math/unparseable_rate": 0.1, "verifier/math/latency_p50_s": 0.0004,
              "verifier/math/latency_p95_s": 0.002, "verifier/math/latency_sum_s": 0.05,
              "verifier/math/latency_counts": [40, 16, 6, 2] + [0] * (len(LATENCY_BUCKETS_S) - 3)})
    return m


def peer_scrape(store, tenant=None) -> str:
    """The scrape before the live table: list running jobs, then one metrics query per job."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import GaugeMetricFamily

    class Old:
        def collect(self):
            counts = store.count_by_status(tenant)
            jobs = GaugeMetricFamily("rlvr_jobs", "Jobs by status", labels=["status"])
            for st, n in counts.items():
                jobs.add_metric([st], n)
            yield jobs
            steps = GaugeMetricFamily("rlvr_job_step", "step", labels=["job"])
            rate = GaugeMetricFamily("rlvr_job_steps_per_second", "speed", labels=["job"])
            lat = GaugeMetricFamily("rlvr_verifier_seconds", "latency", labels=["job", "verifier", "q"])
            err = GaugeMetricFamily("rlvr_verifier_error_rate", "errors", labels=["job", "verifier"])
            for job in store.list_jobs(tenant, status="running", limit=1000):
                steps.add_metric([job.id], job.step)
                last = store.get_metrics(job.id, after=max(job.step - 1, -1))
                if not last:
                    continue
                m = last[-1].data
                if m.get("time/step_s"):
                    rate.add_metric([job.id], 1.0 / m["time/step_s"])
                for k, v in m.items():
                    parts = k.split("/")
                    if len(parts) == 3 and parts[0] == "verifier" and isinstance(v, (int, float)):
                        if parts[2] == "error_rate":
                            err.add_metric([job.id, parts[1]], v)
                        elif parts[2] in ("latency_p50_s", "latency_p95_s"):
                            lat.add_metric([job.id, parts[1], parts[2][8:11]], v)
            yield from (steps, rate, lat, err)

    reg = CollectorRegistry()
    reg.register(Old())
    return generate_latest(reg).decode()


def timed(fn, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000)
    return out


def count_queries(engine, fn) -> int:
    from sqlalchemy import event

    seen = []
    listener = lambda *a: seen.append(1)  # noqa: E731
    event.listen(engine, "before_cursor_execute", listener)
    try:
        fn()
    finally:
        event.remove(engine, "before_cursor_execute", listener)
    return len(seen)


def fetch_ours(store) -> None:
    store.count_by_status(None)
    store.running_live(None)


def fetch_peer(store) -> None:
    store.count_by_status(None)
    for job in store.list_jobs(None, status="running", limit=1000):
        store.get_metrics(job.id, after=max(job.step - 1, -1))


def postgres_db(name: str) -> tuple[str, callable]:
    """A throw-away database on the local PostgreSQL server, and how to drop it (psycopg 3, the driver the
    project installs: `rlvr[postgres]`)."""
    import psycopg

    admin = psycopg.connect(host="127.0.0.1", port=5432, user="postgres", dbname="postgres", connect_timeout=5,
                            autocommit=True)
    with admin.cursor() as c:
        c.execute(f'CREATE DATABASE "{name}"')

    def drop():
        with admin.cursor() as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()
    return f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}", drop


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--steps", type=int, default=50, help="recorded steps per job")
    ap.add_argument("--scrapes", type=int, default=30)
    ap.add_argument("--postgres", action="store_true", help="a temporary database on 127.0.0.1:5432 "
                    "(default: SQLite in a temporary folder)")
    ap.add_argument("--quick", action="store_true", help="fewer steps and scrapes (well under 5 minutes)")
    ap.add_argument("--smoke", action="store_true", help="3 jobs, 2 steps, 2 scrapes: checks the script runs "
                    "(seconds; not a measurement)")
    args = ap.parse_args()
    if args.quick:
        args.steps, args.scrapes = 10, 10
    if args.smoke:
        args.jobs, args.steps, args.scrapes = 3, 2, 2
    os.environ.setdefault("RLVR_BROKER_URL", "memory://")
    from fastapi.testclient import TestClient

    from service.app import create_app
    from service.settings import Settings
    from service.store.jobs import Store

    home = Path(tempfile.mkdtemp(prefix="rlvr-prom-bench-"))
    db_url, drop = postgres_db(f"rlvr_bench_{os.getpid()}") if args.postgres else (None, lambda: None)
    try:
        settings = Settings(home=home, **({"database_url": db_url} if db_url else {}))
        store = Store(settings.db_url)
        t0 = time.perf_counter()
        for i in range(args.jobs):
            job = store.create_job({"name": f"b{i}", "train": {"steps": 1000}}, tenant="default")
            store.claim(job.id, "bench", 3600, str(home / job.id))
            for step in range(1, args.steps + 1):
                m = step_record(step)
                store.put_metrics(job.id, step, m, owner="bench")
                store.put_live(job.id, step, m, owner="bench")
        setup_s = time.perf_counter() - t0
        with TestClient(create_app(settings, store, reaper=False)) as client:
            runs = {"ours_fetch": lambda: fetch_ours(store), "peer_fetch": lambda: fetch_peer(store),
                    "ours_scrape": lambda: client.get("/metrics").raise_for_status(),
                    "peer_scrape": lambda: peer_scrape(store)}
            for fn in runs.values():
                fn()  # warm
            body = client.get("/metrics").text
            assert body.count("rlvr_job_steps_per_second{") == args.jobs
            assert peer_scrape(store).count("rlvr_job_steps_per_second{") == args.jobs
            queries = {k: count_queries(store.engine, runs[k]) for k in ("ours_scrape", "peer_scrape")}
            times: dict[str, list[float]] = {k: [] for k in runs}
            for _ in range(args.scrapes):  # interleaved, so load on the shared host hits each alike
                for k, fn in runs.items():
                    times[k] += timed(fn, 1)
            series = {"ours": sum(1 for line in body.splitlines() if line and not line.startswith("#")),
                      "peer": sum(1 for line in peer_scrape(store).splitlines() if line and not line.startswith("#"))}
        dialect = store.engine.dialect.name
    finally:
        drop()
    med = {k: statistics.median(v) for k, v in times.items()}
    p95 = {k: (statistics.quantiles(v, n=20)[18] if len(v) > 1 else v[0]) for k, v in times.items()}
    print(f"store={dialect} jobs={args.jobs} steps/job={args.steps} scrapes={args.scrapes} setup={setup_s:.1f}s")
    for k in runs:
        print(f"  {k:12s} p50 {med[k]:7.1f} ms   p95 {p95[k]:7.1f} ms")
    print(f"  queries per scrape: ours {queries['ours_scrape']}, peer {queries['peer_scrape']}; "
          f"samples: ours {series['ours']} (with HTTP series and per-job latency histograms), peer {series['peer']}")
    print(f"jobs={args.jobs} store={dialect} ours_fetch_p50_ms={med['ours_fetch']:.1f} "
          f"peer_fetch_p50_ms={med['peer_fetch']:.1f} fetch_speedup={med['peer_fetch'] / med['ours_fetch']:.0f} "
          f"ours_scrape_p50_ms={med['ours_scrape']:.1f} peer_scrape_p50_ms={med['peer_scrape']:.1f} "
          f"ours_queries={queries['ours_scrape']} peer_queries={queries['peer_scrape']} "
          f"ours_samples={series['ours']} peer_samples={series['peer']} load1={os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
