"""Fair share of one API process's verifier capacity between tenants.

Verifier dry runs, registrations (golden cases) and OpenAI grader runs execute tenants' code in the
sandbox pool. Three limits keep one tenant from taking it all (settings, ``RLVR_`` prefix):

* ``SANDBOX_REQUESTS_PER_TENANT`` such requests in flight per tenant; one more is a 429;
* ``SANDBOX_SHARE_PER_TENANT`` jails one tenant's runs may hold at once (default: half the pool,
  at least one), enforced by ``sandbox.lane`` on every run those requests start;
* ``MAX_REQUEST_SANDBOX_S`` jail-seconds per request: its worst case (every sandbox run its items may
  start × that run's time limit, ``Verifier.sandbox_seconds``) over it is a 422 naming the field
  (:func:`check_budget`), and what its runs actually spend is metered against it (``sandbox.budget``):
  a run is cut to what is left, and none starts once it is spent.

The work runs on a small executor of its own, never on the thread pool that serves status polls,
and ``/healthz`` touches neither.
"""
from __future__ import annotations

import asyncio
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, TypeVar

from fastapi import HTTPException, status
from fastapi.exceptions import RequestValidationError

from ..settings import Settings

T = TypeVar("T")


def check_budget(total_s: float, limit_s: float, loc: tuple, what: str = "items") -> None:
    """422 naming ``loc`` when the request's worst case, ``total_s`` jail-seconds (every sandbox run it may
    start × its time limit: Verifier.sandbox_seconds), exceeds ``limit_s``."""
    if total_s > limit_s:
        raise RequestValidationError([{"loc": list(loc), "type": "value_error", "msg": (
            f"{what} may take up to {total_s:g} s of sandbox time (each sandbox run they start × the timeout_s "
            f"of its verifier; stdin/stdout code tests run once per test), over the {limit_s:g} s per-request "
            f"sandbox budget (RLVR_MAX_REQUEST_SANDBOX_S); send fewer {what}, fewer tests or a lower timeout_s")}])


class FairShare:
    def __init__(self, settings: Settings):
        self.per_tenant = settings.sandbox_requests_per_tenant
        pool = os.cpu_count() or 1  # the local sandbox backend sizes its pool to the cores
        self.share = settings.sandbox_share_per_tenant or max(1, pool // 2)
        self.budget_s = settings.max_request_sandbox_s
        self.threads = settings.verify_threads
        self._executor: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._running: dict[str, int] = {}

    def _enter(self, tenant: str) -> None:
        with self._lock:
            n = self._running.get(tenant, 0)
            if n >= self.per_tenant:
                raise HTTPException(status.HTTP_429_TOO_MANY_REQUESTS,
                                    f"this tenant already has {n} verifier requests running (the limit, "
                                    "RLVR_SANDBOX_REQUESTS_PER_TENANT); retry when one finishes",
                                    headers={"Retry-After": "1"})
            self._running[tenant] = n + 1

    def _leave(self, tenant: str) -> None:
        with self._lock:
            n = self._running.get(tenant, 1) - 1
            if n:
                self._running[tenant] = n
            else:
                self._running.pop(tenant, None)

    def running(self, tenant: str) -> int:
        with self._lock:
            return self._running.get(tenant, 0)

    async def run(self, tenant: str, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the verifier executor, inside the tenant's sandbox lane (429 when the tenant
        is at its request limit). The tenant's slot is held until ``fn`` returns, even if the client
        gave up, so abandoned requests cannot be used to exceed the limit."""
        import sandbox

        self._enter(tenant)

        def work() -> T:
            try:
                with sandbox.lane(f"tenant:{tenant}", self.share, wait_s=self.budget_s), sandbox.budget(self.budget_s):
                    return fn(*args)
            finally:
                self._leave(tenant)

        try:
            fut = asyncio.get_running_loop().run_in_executor(self._pool(), work)
        except BaseException:
            self._leave(tenant)
            raise
        try:  # every wait has a timeout: the budget, plus waiting for a lane and a thread
            return await asyncio.wait_for(asyncio.shield(fut), timeout=3 * self.budget_s + 30)
        except asyncio.TimeoutError:
            raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE,
                                "the verifier did not finish within its budget; retry later") from None

    def _pool(self) -> ThreadPoolExecutor:
        with self._lock:  # made on first use, again after close() (an app can be started more than once)
            if self._executor is None:
                self._executor = ThreadPoolExecutor(self.threads, thread_name_prefix="rlvr-verify")
            return self._executor

    def close(self) -> None:
        with self._lock:
            pool, self._executor = self._executor, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
