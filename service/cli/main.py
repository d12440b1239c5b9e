"""The `rlvr` command line: serve, worker, submit, status, train, demo."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

import typer
import yaml

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="rlvr: reinforcement learning with verifiable rewards, as a service.")
URL = typer.Option(os.environ.get("RLVR_URL", "http://127.0.0.1:8000"), "--url", help="API base URL ($RLVR_URL).")
KEY = typer.Option(os.environ.get("RLVR_API_KEY"), "--api-key", help="API key ($RLVR_API_KEY).")


def _load_spec(path: Path) -> dict:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as e:
        raise typer.BadParameter(f"cannot read job spec {path}: {e}") from None
    if not isinstance(data, dict):
        raise typer.BadParameter(f"{path}: a job spec is a mapping")
    return data


@app.command()
def serve(host: str = typer.Option(None, help="Bind address (default $RLVR_HOST or 127.0.0.1)."),
          port: int = typer.Option(None, help="Port (default $RLVR_PORT or 8000)."),
          workers: int = typer.Option(1, help="Server processes (each runs its own reaper; that is safe). One "
                                      "serves best on 2 cores shared with a load generator; see README.")) -> None:
    """Run the HTTP API."""
    from ..settings import get_settings
    from .serve import serve as run_server

    s = get_settings()
    run_server(host or s.host, port or s.port, workers)


@app.command()
def worker(queue: str = typer.Option(None, "--queue", "-Q", help="Queue(s) to consume (default: train)."),
           concurrency: int = typer.Option(1, "--concurrency", "-c", help="Jobs at once (1 per GPU)."),
           pool: str = typer.Option("prefork", help="Celery pool: prefork | solo | threads."),
           gpus: Optional[str] = typer.Option(None, help="One worker per GPU (e.g. 0,1 or all): each sees only "
                                              "its GPU (CUDA_VISIBLE_DEVICES), runs one job at a time, and a "
                                              "fresh process per job."),
           loglevel: str = typer.Option("info")) -> None:
    """Run a Celery worker that executes training jobs."""
    from ..settings import get_settings
    from ..worker.celery_app import celery_app

    s = get_settings()
    argv = ["worker", "-Q", queue or s.train_queue, "-c", str(concurrency), "-P", pool, "-l", loglevel,
            "--without-gossip", "--without-mingle"]
    if os.environ.get("RLVR_WORKER_NAME"):  # one worker per GPU on a host: each needs its own node name
        argv += ["-n", os.environ["RLVR_WORKER_NAME"]]
    if gpus:
        from ..worker.gpus import run_gpu_workers

        raise typer.Exit(run_gpu_workers(gpus, queue or s.train_queue, loglevel))
    celery_app.worker_main(argv=argv)


@app.command()
def submit(spec_file: Path, url: str = URL, api_key: Optional[str] = KEY,
           wait: bool = typer.Option(False, help="Wait for the job to finish.")) -> None:
    """Submit a job spec (YAML or JSON) to the service; prints the job as JSON."""
    from .client import APIError, Client

    c = Client(url, api_key)
    try:
        job = c.submit(_load_spec(spec_file))
        if wait:
            job = c.wait(job["id"])
    except APIError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1)
    typer.echo(json.dumps(job, indent=2, default=str))


@app.command()
def status(job_id: str, url: str = URL, api_key: Optional[str] = KEY) -> None:
    """Show a job's status and progress as JSON."""
    from .client import APIError, Client

    try:
        job = Client(url, api_key).job(job_id)
    except APIError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1)
    typer.echo(json.dumps({k: job[k] for k in ("id", "name", "status", "progress", "error", "result")},
                          indent=2, default=str))


def _client(url: str, api_key: Optional[str]):
    from .client import Client

    return Client(url, api_key)


def _run(fn):
    from .client import APIError

    try:
        return fn()
    except APIError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1)


@app.command()
def cancel(job_id: str, url: str = URL, api_key: Optional[str] = KEY) -> None:
    """Cancel a job (a running one stops at its next step)."""
    typer.echo(_run(lambda: _client(url, api_key).cancel(job_id))["status"])


@app.command()
def pause(job_id: str, url: str = URL, api_key: Optional[str] = KEY) -> None:
    """Pause a job: checkpoint, then release the worker."""
    typer.echo(_run(lambda: _client(url, api_key).pause(job_id))["status"])


@app.command()
def resume(job_id: str, url: str = URL, api_key: Optional[str] = KEY) -> None:
    """Resume a paused job from its last checkpoint."""
    typer.echo(_run(lambda: _client(url, api_key).resume(job_id))["status"])


@app.command()
def checkpoints(job_id: str, url: str = URL, api_key: Optional[str] = KEY) -> None:
    """List a job's checkpoints with their step metrics."""
    for c in _run(lambda: _client(url, api_key).checkpoints(job_id)):
        acc = c["metrics"].get("eval/accuracy")
        typer.echo(f"{c['name']}  step {c['step']}" + (f"  held-out accuracy {acc:.3f}" if acc is not None else ""))


@app.command()
def logs(job_id: str, follow: bool = typer.Option(False, "--follow", "-f", help="Follow the live event stream."),
         url: str = URL, api_key: Optional[str] = KEY) -> None:
    """Print a job's events; with -f follow them live with a progress bar until the job ends (a dropped
    connection resumes where it broke)."""
    import httpx
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn

    c = _client(url, api_key)
    job = _run(lambda: c.job(job_id))
    console = Console()
    if not follow:
        after = 0
        while True:
            page = _run(lambda: c.events(job_id, after))
            for e in page["data"]:
                console.print(f"{e['created_at'][:19]}  {e['type']:<10} {e['message']}")
            after = page["next_after"]
            if not page["has_more"]:
                return
    with Progress(TextColumn("[bold]{task.fields[name]}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TextColumn("{task.fields[info]}"), console=console) as bar:
        task = bar.add_task("job", total=job["progress"]["total_steps"], completed=job["progress"]["step"],
                            name=job["name"], info=job["status"])
        try:  # the stream resumes by itself after a drop (Last-Event-ID); this is after 20 drops in a row
            _run(lambda: list(_iter_events(c, job_id, bar, task)))
        except httpx.TransportError as e:
            typer.echo(f"error: lost the event stream: {e}", err=True)
            raise typer.Exit(1) from None


def _iter_events(c, job_id, bar, task):
    for e in c.stream_events(job_id):
        if e["type"] == "metrics":
            m = e["data"].get("metrics", {})
            bar.update(task, completed=e["data"].get("step", 0),
                       info=f"reward {m.get('reward/mean', 0):.3f}  acc {m.get('accuracy', 0):.3f}")
        else:
            bar.console.print(f"{e['created_at'][:19]}  {e['type']:<10} {e['message']}")
        yield e


from .models import models_app  # noqa: E402  (light: imports trainer.models.pull lazily)

app.add_typer(models_app, name="models")

keys_app = typer.Typer(help="API keys (work against the $RLVR_HOME store; no server needed).")
app.add_typer(keys_app, name="keys")


@keys_app.command("create")
def keys_create(tenant: str = typer.Option(..., help="Tenant the key belongs to."),
                admin: bool = typer.Option(False, help="May create other keys.")) -> None:
    """Create an API key; prints it as the last line (it is stored only as a hash)."""
    from ..access.keys import check_tenant_name, create_key
    from ..settings import get_settings
    from ..store.jobs import Store

    try:
        check_tenant_name(tenant)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--tenant") from None
    key = create_key(Store(get_settings().db_url), tenant, admin)
    typer.echo(f"created {'admin ' if admin else ''}key for tenant {tenant!r} (shown once):", err=True)
    typer.echo(key)


@keys_app.command("list")
def keys_list(tenant: Optional[str] = typer.Option(None, help="Only this tenant's keys."),
              revoked: bool = typer.Option(False, "--revoked", help="Include revoked keys.")) -> None:
    """List API keys: id, tenant, admin flag, created, the key's last 4 characters (never the key)."""
    from ..access.keys import KEY_PREFIX, list_keys
    from ..settings import get_settings
    from ..store.jobs import Store

    for k in list_keys(Store(get_settings().db_url), tenant, revoked):
        flags = ("admin " if k.admin else "") + ("revoked" if k.revoked else "")
        typer.echo(f"{k.id}\t{k.tenant}\t{k.created_at:%Y-%m-%d %H:%M}\t"
                   f"{KEY_PREFIX + '…' + k.hint if k.hint else '-'}\t{flags}".rstrip())


@keys_app.command("revoke")
def keys_revoke(key_id: str = typer.Argument(..., help="The key's id (`rlvr keys list`).")) -> None:
    """Revoke an API key: refused from then on (API processes within their key cache's 1 s)."""
    from ..access.keys import revoke_key
    from ..settings import get_settings
    from ..store.jobs import Store

    if revoke_key(Store(get_settings().db_url), key_id, None) is None:
        typer.echo(f"error: no key {key_id!r}", err=True)
        raise typer.Exit(1)
    typer.echo(f"revoked {key_id}")


@app.command()
def train(spec_file: Path, run_dir: Path = typer.Option(None, help="Default: ./runs/<name>."),
          steps: Optional[int] = typer.Option(None, help="Override train.steps.")) -> None:
    """Run a job locally in this process (no service): metrics.jsonl and checkpoints in the run dir."""
    from pydantic import ValidationError

    from trainer.cluster import use_ray
    from trainer.config import JobSpec
    from trainer.loop import train as run_train

    from ..settings import get_settings

    data = _load_spec(spec_file)
    try:
        spec = JobSpec.model_validate(data)
    except ValidationError as e:
        typer.echo(f"invalid job spec {spec_file}:\n{e}", err=True)
        raise typer.Exit(2)
    if steps:
        spec.train.steps = steps
    run_dir = run_dir or Path("runs") / spec.name

    def on_step(step: int, m: dict) -> None:
        keys = ("reward/mean", "accuracy", "eval/accuracy", "kl", "time/step_s")
        shown = "  ".join(f"{k}={m[k]:.3f}" for k in keys if k in m)
        typer.echo(f"step {step:5d}  {shown}")

    settings = get_settings()
    log = lambda msg: typer.echo(msg, err=True)  # noqa: E731
    if use_ray(spec, settings.ray_address, settings.ray_every_job):  # its ranks on the cluster, driven from here
        from trainer.cluster.driver import train_on_ray

        result = train_on_ray(spec, run_dir, models_dir=settings.models_dir, address=settings.ray_address,
                              name=f"rlvr-train-{spec.name}", on_step=on_step, log=log,
                              restarts=settings.ray_rank_restarts, stop_grace_s=settings.ray_stop_grace_s,
                              place_timeout_s=settings.ray_place_timeout_s)
    else:
        result = run_train(spec, run_dir, models_dir=settings.models_dir, on_step=on_step, log=log)
    typer.echo(json.dumps(result.__dict__))


@app.command()
def doctor(as_json: bool = typer.Option(False, "--json", help="Last line: one JSON object.")) -> None:
    """What this host gives us: torch and CPU kernels, CUDA, the rollout engine, the sandbox, store, broker."""
    from ..settings import get_settings
    from .doctor import report

    r = report(get_settings())
    if as_json:
        typer.echo(json.dumps(r))
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(title="rlvr doctor", show_header=False)
    t.add_row("torch", f"{r['torch']} (CUDA build {r['cuda_build'] or 'none'}), CPU kernels {r['cpu_capability']}")
    t.add_row("device", r["device"] + "".join(f"\n  cuda:{d['index']} {d['name']} {d['memory_gb']} GB"
                                               for d in r["cuda_devices"]))
    t.add_row("rollout engine (auto)", r["engine"] + ("" if r["vllm_installed"] else " (vLLM not installed)"))
    for name in ("sandbox", "database", "broker"):
        c = r[name]
        detail = ", ".join(f"{k}: {v}" for k, v in c.items() if k not in ("ok", "reason", "seconds"))
        t.add_row(name, ("[green]ok[/green] " + detail) if c["ok"] else f"[red]unavailable[/red]: {c['reason']}")
    Console().print(t)
    if not all(r[n]["ok"] for n in ("sandbox", "database", "broker")):
        raise typer.Exit(1)


@app.command()
def demo(steps: int = typer.Option(None, help="GRPO steps (default: the demo's)."),
         as_json: bool = typer.Option(False, "--json", help="Quiet; last line is one JSON object."),
         port: int = typer.Option(0, help="API port (0 = pick a free one)."),
         keep_serving: bool = typer.Option(False, help="Keep the service up after the job ends (Ctrl-C stops)."),
         task: str = typer.Option("auto", help="tools (episodes: the model calls Python in the sandbox between "
                                  "turns), math (arithmetic, no sandbox), code (programs run in the sandbox), or "
                                  "auto: tools where the sandbox starts, else math."),
         model: Optional[str] = typer.Option(None, help="A pulled model (e.g. smollm2-135m): the real-model recipe "
                                             "of bench/learning.py instead of the bundled tiny models.")) -> None:
    """Start the service and a worker (embedded defaults), run a real GRPO job, show before/after."""
    from .demo import run_demo

    code = run_demo(steps=steps, as_json=as_json, port=port, keep_serving=keep_serving, task=task, model=model)
    raise typer.Exit(code)


def main() -> None:  # pragma: no cover
    app()

