"""Service settings from the environment (prefix ``RLVR_``), with embedded defaults.

With nothing set, everything lives under ``RLVR_HOME`` (default ``~/.rlvr``): a SQLite job store,
a filesystem Celery broker (no server needed), models, runs and checkpoints. Point
``RLVR_DATABASE_URL`` at Postgres and ``RLVR_BROKER_URL`` at Redis for the distributed setup.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="RLVR_", extra="ignore")

    home: Path = Field(Path("~/.rlvr"), description="State directory for the embedded mode.")
    models: Path | None = Field(None, description="Model cache; default $RLVR_HOME/models.")
    database_url: str | None = Field(None, description="SQLAlchemy URL; default sqlite:///$RLVR_HOME/rlvr.db")
    broker_url: str | None = Field(None, description="Celery broker; default: filesystem broker in $RLVR_HOME")
    train_queue: str = "train"
    verify_queue: str = "verify"
    host: str = "127.0.0.1"
    port: int = 8000
    max_body_bytes: int = Field(10 * 1024 * 1024, ge=1024)
    validate_paths: bool = Field(True, description="Check model/dataset paths exist at submission.")
    worker_threads: int | None = Field(None, description="torch threads per training job.")
    score_on_verify_queue: bool = Field(False, description="Score completions on the verify queue (CPU "
                                        "workers: `rlvr worker --queue verify`); needs Redis.")
    verify_timeout_s: float = Field(600.0, gt=0, description="Wait at most this long for one step's verdicts.")
    step_timeout_s: float = Field(1800.0, gt=0, description="A job whose next step (or its start-up) takes "
                                  "longer fails with StepTimeout; its worker process is replaced.")
    lease_s: float = Field(30.0, gt=0, description="A worker must renew its job lease within this time.")
    reaper_interval_s: float = Field(5.0, gt=0, description="How often the API looks for lost jobs.")
    requeue_queued_after_s: float = Field(120.0, gt=0, description="Re-send a job still queued after this.")
    max_attempts: int = Field(3, ge=1, description="Worker losses before a job is failed.")
    on_worker_lost: str = Field("requeue", pattern="^(requeue|fail)$")
    verifier_error_pause_threshold: float = Field(0.5, ge=0, le=1)
    auth: bool = Field(False, description="Require API keys (bearer) on every /v1 request.")
    allow_local_paths: bool | None = Field(None, description="Let job specs name server paths for models and "
                                           "datasets; default: only when auth is off (one trusted user).")
    admin_key: str | None = Field(None, description="Bootstrap admin key (can create other keys).")
    max_upload_bytes: int = Field(100 * 1024 * 1024, ge=1024)
    max_world_size: int = Field(8, ge=1, le=1024, description="The most data-parallel ranks (train.world_size) a "
                                "job may ask for; a worker also refuses more ranks than it has devices.")
    # one job across machines (trainer/cluster, docs/cluster.md)
    ray_address: str | None = Field(None, description="A Ray cluster for jobs past one worker: `host:6379` (this "
                                    "host runs a Ray node of it), `auto`, or `ray://host:10001`. Jobs whose ranks "
                                    "do not fit the worker, or that ask for train.placement / train.producer: ray, "
                                    "run there as a placement group; unset: every job runs on its worker.")
    ray_every_job: bool = Field(False, description="With RLVR_RAY_ADDRESS: place every job on the cluster, even one "
                                "that fits this worker (a worker that only drives, with no GPU of its own).")
    ray_rank_restarts: int = Field(0, ge=0, le=100, description="Times a Ray job's group is placed again after one "
                                   "of its ranks' processes or nodes is lost, resuming from the last checkpoint, "
                                   "before the job fails.")
    ray_stop_grace_s: float = Field(60.0, gt=0, description="A Ray job's group still running this long after a "
                                    "pause or cancel reached it (a hung step) is killed; the job stops at its last "
                                    "checkpoint.")
    ray_place_timeout_s: float = Field(600.0, gt=0, description="A Ray job whose placement group the cluster "
                                       "cannot place within this long fails, saying what the cluster has.")
    # fair share of the API's verifier capacity (service/access/fairshare.py)
    sandbox_requests_per_tenant: int = Field(2, ge=1, le=1024, description="Verifier dry runs, registrations "
                                             "and grader runs one tenant may have in flight at once in one API "
                                             "process; one more is a 429.")
    sandbox_share_per_tenant: int | None = Field(None, ge=1, le=1024, description="Sandbox jails one tenant's "
                                                 "requests may hold at once (default: half the pool, at least 1), "
                                                 "so other tenants' verifier calls always find a jail.")
    max_request_sandbox_s: float = Field(120.0, gt=0, le=3600, description="Jail-seconds one dry run, "
                                         "registration or grader run may spend: its worst case (each sandbox "
                                         "run × its timeout_s) over it is a 422 naming the field, and its runs' "
                                         "actual time is metered against it.")
    # environments over HTTP (trainer/envs): the trainer reads these same RLVR_ variables in the worker
    env_allow: str = Field("", max_length=4096, description="CIDRs (comma-separated) an environment URL may "
                           "resolve into besides public addresses, e.g. 10.0.0.0/8 for servers on the cluster's "
                           "network; loopback, link-local (169.254.x: cloud metadata) and private ranges are "
                           "refused otherwise.")
    env_max_sessions: int = Field(16, ge=1, le=4096, description="Environment calls one tenant may have in "
                                  "flight at once, across its jobs: on every worker sharing env_slots_redis "
                                  "together, else per worker machine.")
    env_slots_redis: str | None = Field(None, max_length=2048, description="Redis URL holding the env_max_sessions "
                                        "slots for the whole cluster; default: the broker when it is Redis "
                                        "(redis:// or rediss://), else per machine (file locks).")
    sse_ping_s: float = Field(15.0, gt=0, le=3600, description="Seconds between keep-alive comments on an idle "
                              "event stream (proxies close silent connections).")
    verify_threads: int = Field(8, ge=1, le=256, description="Threads running verifier requests in the API, apart "
                                "from the pool serving status polls, so those never wait behind verifiers.")

    # training primitives (service/tinker: Tinker-compatible sessions)
    tinker_dtype: Literal["float32", "bfloat16", "float64"] = Field(
        "float32", description="Weights' dtype of session models (float64: exactness checks, slow).")
    tinker_sessions_per_tenant: int = Field(4, ge=1, le=1024, description="Sessions one tenant may have holding "
                                            "(or waiting for) a worker at once; one more is a 429.")
    tinker_max_pending: int = Field(256, ge=1, le=100_000, description="Requests one session may have queued.")
    tinker_long_poll_s: float = Field(20.0, gt=0, le=40, description="retrieve_future waits this long for a "
                                      "result before answering try_again (under the SDK's 45 s timeout).")
    tinker_request_timeout_s: float = Field(900.0, gt=0, description="A request running longer fails; its "
                                            "worker process is replaced.")
    tinker_queue_timeout_s: float = Field(900.0, gt=0, description="A request no worker took within this "
                                          "fails with that reason.")
    tinker_idle_s: float = Field(600.0, gt=0, description="A session with no heartbeat and no request for "
                                 "this long expires.")
    tinker_release_idle_s: float = Field(300.0, gt=0, description="A worker gives up a session with no request "
                                         "for this long (changed models are saved first; the next request "
                                         "restores them on a worker).")
    tinker_retention_s: float = Field(3600.0, gt=0, description="Finished requests' results are kept this long.")
    tinker_poll_min_s: float = Field(0.001, gt=0, le=1, description="Queue polling interval while busy.")
    tinker_poll_max_s: float = Field(0.05, gt=0, le=5, description="Queue polling interval when idle.")
    tinker_hot_s: float = Field(2.0, ge=0, le=60, description="Poll at the busy interval for this long after "
                                "the last request (a training loop's next call comes within milliseconds).")
    tinker_max_sample_tokens: int = Field(65_536, ge=1, description="num_samples × max_tokens per sample request.")

    @property
    def local_paths_allowed(self) -> bool:
        return (not self.auth) if self.allow_local_paths is None else self.allow_local_paths

    @property
    def home_dir(self) -> Path:
        return self.home.expanduser().resolve()

    @property
    def models_dir(self) -> Path:
        return self.models.expanduser().resolve() if self.models else self.home_dir / "models"

    @property
    def runs_dir(self) -> Path:
        return self.home_dir / "runs"

    @property
    def db_url(self) -> str:
        return sqlalchemy_url(self.database_url) if self.database_url else f"sqlite:///{self.home_dir / 'rlvr.db'}"

    @property
    def broker_dir(self) -> Path:
        return self.home_dir / "broker"

    @property
    def broker(self) -> str:
        return self.broker_url or "filesystem://"

    @property
    def embedded_broker(self) -> bool:
        return self.broker.startswith("filesystem://")


def sqlalchemy_url(url: str) -> str:
    """The driver we install for PostgreSQL is psycopg 3 (``postgresql+psycopg://``): a URL naming no driver
    (``postgresql://``, ``postgres://``), or psycopg2 where psycopg2 is not installed, is pointed at it."""
    from importlib.util import find_spec

    scheme, sep, rest = url.partition("://")
    if sep and (scheme in ("postgres", "postgresql")
                or (scheme == "postgresql+psycopg2" and find_spec("psycopg2") is None)):
        return "postgresql+psycopg://" + rest
    return url


@lru_cache
def get_settings() -> Settings:
    return Settings()
