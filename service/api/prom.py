"""GET /metrics in Prometheus text format.

Job series come from the store (the API holds no training state of its own, so any replica answers the
same) in two queries per scrape whatever the number of jobs: counts by status, and every running job's
``job_live`` row, which the worker folds forward as it records each step (service.store.live). No scrape reads
a job's metrics series.

Scoped like every other route: with auth on it needs a key, and a tenant key's scrape covers that
tenant's jobs only (counts and per-job series). Server-wide series — HTTP requests and latencies — are
in an all-tenant scrape only (an admin key, or auth off): they would show a tenant other tenants' traffic.
"""
from __future__ import annotations

from fastapi import Response
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily

from ..access.keys import Scope
from ..deps import ScopeDep, StoreDep
from ..http.guard import api_router
from ..http.metrics import collector_registry
from ..store.jobs import JobStatus, Store
from ..store.live import histogram

router = api_router(tags=["metrics"])


class StoreCollector:
    def __init__(self, store: Store, scope: Scope):
        self.store, self.scope = store, scope

    def collect(self):
        counts = self.store.count_by_status(self.scope.only)
        jobs = GaugeMetricFamily("rlvr_jobs", "Jobs by status", labels=["status"])
        for st in JobStatus:
            jobs.add_metric([st.value], counts.get(st.value, 0))
        yield jobs
        yield GaugeMetricFamily("rlvr_queue_depth", "Jobs waiting for a worker", value=counts.get("queued", 0))
        steps = GaugeMetricFamily("rlvr_job_step", "Current step of running jobs", labels=["job"])
        rate = GaugeMetricFamily("rlvr_job_steps_per_second", "Training speed of running jobs (last step)",
                                 labels=["job"])
        tokens = GaugeMetricFamily("rlvr_job_tokens_per_second", "Sampled tokens per second of running jobs "
                                   "(last step)", labels=["job"])
        gpu = GaugeMetricFamily("rlvr_job_gpu_memory_bytes", "GPU memory of running jobs' rank 0 at the last "
                                "step: allocated, and the peak during that step (absent on CPU)",
                                labels=["job", "kind"])
        lat = GaugeMetricFamily("rlvr_verifier_seconds", "Verifier latency quantiles (last step)",
                                labels=["job", "verifier", "q"])
        err = GaugeMetricFamily("rlvr_verifier_error_rate", "Verifier error rate (last step)",
                                labels=["job", "verifier"])
        hist = HistogramMetricFamily("rlvr_verifier_latency_seconds", "Verifier latency per call, over the job's "
                                     "recorded steps", labels=["job", "verifier"])
        for job_id, step, live in self.store.running_live(self.scope.only):
            steps.add_metric([job_id], step)
            live = live or {}
            if "steps_per_s" in live:
                rate.add_metric([job_id], live["steps_per_s"])
            if "tokens_per_s" in live:
                tokens.add_metric([job_id], live["tokens_per_s"])
            for kind, value in (live.get("gpu") or {}).items():
                gpu.add_metric([job_id, kind], value)
            for name, v in (live.get("verifiers") or {}).items():
                if "error_rate" in v:
                    err.add_metric([job_id, name], v["error_rate"])
                for q in ("p50", "p95"):
                    if q in v:
                        lat.add_metric([job_id, name, q], v[q])
                if "counts" in v:
                    hist.add_metric([job_id, name], histogram(v["counts"]), v.get("sum", 0.0))
        yield from (steps, rate, tokens, gpu, lat, err, hist)


@router.get("/metrics", include_in_schema=False)
def prometheus(store: StoreDep, scope: ScopeDep) -> Response:
    reg = CollectorRegistry()
    reg.register(StoreCollector(store, scope))
    body = generate_latest(reg)
    if scope.all_tenants:
        body += generate_latest(collector_registry())
    return Response(body, media_type="text/plain; version=0.0.4")
