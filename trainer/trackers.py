"""Experiment trackers (``train.report_to``): every step's record, evals included, also goes to
TensorBoard, Weights & Biases and/or MLflow — from rank 0, into the job's run dir, never over the network.

Left alone, their libraries do more: MLflow reports telemetry (``config.mlflow-telemetry.io``) and keeps an
installation id in ~/.config, wandb sends error reports to its server even offline and its service logs
every run (job ids included) into a shared ~/.cache, and both make temporary directories in /tmp. So the
worker turns their telemetry and error reporting off for its whole process (:data:`NO_NETWORK`: it never
needs them), and each tracker starts and stops with its libraries' cache, config, data and temporary
directories inside the run dir (:func:`_contained`); wandb's service ends with the run, so the next job's
starts afresh in its own run dir (tests/test_trackers.py checks both, with a proxy canary).

- ``tensorboard``: event files under ``run_dir/tb`` (``tensorboard --logdir run_dir/tb``).
- ``wandb``: an OFFLINE run under ``run_dir/wandb`` (``wandb sync run_dir/wandb/offline-run-*`` uploads it
  later, from a machine with credentials; the worker never needs any).
- ``mlflow``: a FILE store under ``run_dir/mlruns`` (``mlflow ui --backend-store-uri run_dir/mlruns``).

Each backend is one small class behind the same two calls, ``log(step, metrics)`` and ``close()``; the
packages are optional (``pip install 'rlvr[trackers]'``) and imported only when a job names them.
"""
from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping, Protocol, Sequence

# name in the spec -> the package that provides it (import name, pip name)
PACKAGES: dict[str, tuple[str, str]] = {"tensorboard": ("tensorboard", "tensorboard"),
                                        "wandb": ("wandb", "wandb"), "mlflow": ("mlflow", "mlflow")}


# Forced, not defaults: "never over the network" is the worker's promise, whatever its environment says.
NO_NETWORK = {"MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true", "WANDB_MODE": "offline",
              "WANDB_ERROR_REPORTING": "false", "WANDB_DISABLE_GIT": "true"}
# Where the libraries put caches, settings, data and temporary files (wandb's Go service reads these when it
# starts; Python's tempfile its ``tempdir``).
_DIRS = {"WANDB_CACHE_DIR": "cache", "WANDB_CONFIG_DIR": "config", "WANDB_DATA_DIR": "data",
         "XDG_CACHE_HOME": "cache", "XDG_CONFIG_HOME": "config", "XDG_DATA_HOME": "data", "TMPDIR": "tmp"}


def no_network() -> None:
    """Turn the trackers' telemetry and error reports off for this process (before their packages import)."""
    os.environ.update(NO_NETWORK)


@contextmanager
def _contained(root: Path) -> Iterator[None]:
    """While a tracker starts or stops: its libraries' cache, config, data and temp dirs under ``root``.
    (Process-wide while it lasts: a worker process runs one job, and its other threads make no files.)"""
    env = {k: str(root / sub) for k, sub in _DIRS.items()}
    for d in set(env.values()):
        Path(d).mkdir(parents=True, exist_ok=True)
    saved, saved_tmp = {k: os.environ.get(k) for k in env}, tempfile.tempdir
    os.environ.update(env)
    tempfile.tempdir = env["TMPDIR"]
    try:
        yield
    finally:
        tempfile.tempdir = saved_tmp
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class TrackerUnavailable(RuntimeError):
    """A tracker the spec names whose package is not installed here."""


class Tracker(Protocol):
    def log(self, step: int, metrics: Mapping[str, float]) -> None: ...
    def close(self) -> None: ...


def missing(names: Sequence[str]) -> list[str]:
    """The pip packages that ``names`` need and this environment lacks (none: every tracker can start)."""
    return [PACKAGES[n][1] for n in dict.fromkeys(names) if importlib.util.find_spec(PACKAGES[n][0]) is None]


def require(names: Sequence[str]) -> None:
    """Fail at the start of a run, naming the package, rather than after the first step."""
    gone = missing(names)
    if gone:
        raise TrackerUnavailable(f"train.report_to needs {', '.join(gone)}, not installed on this worker: "
                                 "pip install 'rlvr[trackers]'")


def scalars(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The numbers of a step record: trackers take scalars (a checkpoint name, a latency histogram's
    bucket list and non-finite values are left out)."""
    out = {}
    for k, v in metrics.items():
        if isinstance(v, bool):
            v = float(v)
        if isinstance(v, (int, float)) and math.isfinite(v):
            out[k] = float(v)
    return out


class TensorBoard:
    def __init__(self, run_dir: Path, spec: Any):
        from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package

        self.writer = SummaryWriter(log_dir=str(run_dir / "tb"))
        self.writer.add_text("spec", "```\n" + json.dumps(_spec(spec), indent=2) + "\n```", 0)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        for k, v in metrics.items():
            self.writer.add_scalar(k, v, step)
        self.writer.flush()  # a killed worker keeps every step it logged

    def close(self) -> None:
        self.writer.close()


class WandB:
    def __init__(self, run_dir: Path, spec: Any):
        root = run_dir / "wandb"
        root.mkdir(parents=True, exist_ok=True)
        self.home = root / "home"
        # offline: nothing leaves the machine and no credentials are needed; one id per run dir, so a
        # resumed job's runs are recognisably the same job
        with _contained(self.home):  # its import makes temp dirs, its service starts now: with these dirs
            import wandb

            self.run = wandb.init(mode="offline", dir=str(run_dir), project="rlvr", name=getattr(spec, "name", None),
                                  id=_run_id(run_dir), config=_spec(spec), reinit="create_new",
                                  settings=wandb.Settings(console="off", silent=True, x_disable_stats=True))
        self.step = -1

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        if step <= self.step:  # wandb drops non-increasing steps with a warning; a resume replays some
            return
        self.step = step
        self.run.log(dict(metrics), step=step)

    def close(self) -> None:
        import wandb

        with _contained(self.home):
            self.run.finish()
            wandb.teardown()  # its service (and its log) ends with this run: the next job's starts in its own dir


class MLflow:
    # MLflow refuses metric names outside this set (e.g. `eval/pass@1`, `verifier/math#2/mean`)
    _BAD = re.compile(r"[^A-Za-z0-9_\-. /]")

    def __init__(self, run_dir: Path, spec: Any):
        # MLflow 3 keeps the file store in maintenance mode and refuses it unless asked: a file store is what
        # needs no server and no database, and `mlflow ui --backend-store-uri` reads it (a user's own
        # setting of the variable wins)
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        store = run_dir / "mlruns"
        store.mkdir(parents=True, exist_ok=True)
        with _contained(run_dir / "mlruns-home"):
            from mlflow.tracking import MlflowClient

            self.client = MlflowClient(tracking_uri=store.resolve().as_uri())
            exp = self.client.get_experiment_by_name("rlvr")
            exp_id = exp.experiment_id if exp else self.client.create_experiment("rlvr")
            runs = self.client.search_runs([exp_id], max_results=1, order_by=["attributes.start_time DESC"])
            if runs:  # a resumed job goes on logging into its run
                self.run_id = runs[0].info.run_id
                self.client.update_run(self.run_id, status="RUNNING")
            else:
                self.run_id = self.client.create_run(exp_id, run_name=getattr(spec, "name", None)).info.run_id
                self.client.log_text(self.run_id, json.dumps(_spec(spec), indent=2), "spec.json")

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(self._BAD.sub("_", k), v, now, step) for k, v in metrics.items()]
        for i in range(0, len(batch), 1000):  # MLflow's limit per batch
            self.client.log_batch(self.run_id, metrics=batch[i:i + 1000])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


BACKENDS: dict[str, type] = {"tensorboard": TensorBoard, "wandb": WandB, "mlflow": MLflow}


class Trackers:
    """Every tracker a job names, fed the same scalar record."""

    def __init__(self, names: Sequence[str], run_dir: Path, spec: Any):
        require(names)
        if names:
            no_network()
        self.open: list[Tracker] = []
        try:
            for name in dict.fromkeys(names):
                self.open.append(BACKENDS[name](Path(run_dir), spec))
        except BaseException:
            self.close()
            raise

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        numbers = scalars(metrics)
        if numbers:
            for t in self.open:
                t.log(step, numbers)

    def close(self) -> None:
        while self.open:
            self.open.pop().close()


def _spec(spec: Any) -> dict[str, Any]:
    return spec.model_dump(mode="json") if hasattr(spec, "model_dump") else dict(spec or {})


def _run_id(run_dir: Path) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "-", Path(run_dir).resolve().name)[-64:] or "run"
