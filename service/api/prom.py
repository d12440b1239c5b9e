"""GET /metrics in Prometheus text format, computed from the store at scrape time
(the API holds no training state of its own, so any replica answers the same).

Scoped like every other route: with auth on it needs a key, and a tenant key's scrape covers that
tenant's jobs only (counts and per-job series); an admin key's covers every tenant.
"""
from __future__ import annotations

from fastapi import Response
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily

from ..auth import Scope
from ..deps import ScopeDep, StoreDep
from ..guard import api_router
from ..store import JobStatus, Store

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
        rate = GaugeMetricFamily("rlvr_job_steps_per_second", "Training speed of running jobs", labels=["job"])
        lat = GaugeMetricFamily("rlvr_verifier_seconds", "Verifier latency (last step)", labels=["job", "verifier", "q"])
        err = GaugeMetricFamily("rlvr_verifier_error_rate", "Verifier error rate (last step)", labels=["job", "verifier"])
        for job in self.store.list_jobs(self.scope.only, status="running", limit=1000):
            steps.add_metric([job.id], job.step)
            last = self.store.get_metrics(job.id, after=max(job.step - 1, -1))
            if not last:
                continue
            m = last[-1].data
            step_s = m.get("time/step_s")
            if isinstance(step_s, (int, float)) and step_s > 0:
                rate.add_metric([job.id], 1.0 / step_s)
            for k, v in m.items():
                parts = k.split("/")
                if len(parts) == 3 and parts[0] == "verifier" and isinstance(v, (int, float)):
                    if parts[2] == "error_rate":
                        err.add_metric([job.id, parts[1]], v)
                    elif parts[2] in ("latency_p50_s", "latency_p95_s"):
                        lat.add_metric([job.id, parts[1], parts[2][8:11]], v)
        yield steps
        yield rate
        yield lat
        yield err


@router.get("/metrics", include_in_schema=False)
def prometheus(store: StoreDep, scope: ScopeDep) -> Response:
    reg = CollectorRegistry()
    reg.register(StoreCollector(store, scope))
    return Response(generate_latest(reg), media_type="text/plain; version=0.0.4")
