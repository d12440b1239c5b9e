"""`rlvr demo`: the whole path on one machine with embedded defaults.

Starts the API and a Celery worker as real subprocesses (SQLite store, filesystem broker under
$RLVR_HOME), builds the bundled tiny model once, submits a GRPO job on the built-in arithmetic
task over HTTP, follows its metrics, and prints held-out accuracy before and after.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

from ..settings import get_settings

# Tuned on 2 CPU cores (see tests/test_learning.py): ~2-3 minutes of training that roughly doubles
# held-out accuracy. Tiny models need a small-but-not-too-small lr and large groups (G=16): at 5e-4
# the policy's entropy collapses without learning; at 1e-4 it learns but oscillates.
DEMO_SPEC = {
    "name": "demo-arithmetic-grpo",
    "model": {"path": "builtin:tiny-arith"},
    "data": {"dataset": "builtin:arithmetic", "eval_size": 400},
    # the answer must be stated: echoing "30-15" into the box is not a correct answer to 30-15
    "verifiers": [{"name": "math", "config": {"allow_unevaluated": False}}],
    "rollout": {"group_size": 16, "max_new_tokens": 12, "temperature": 1.0},
    "algo": {"kl_coef": 0.0},
    "optim": {"lr": 5e-5},
    "train": {"steps": 150, "prompts_per_step": 16, "eval_every": 50, "seed": 0},
}
# The code task at CI size: the tiny code model (trainer/models/tiny_code.py) writes one-line programs that the
# sandbox runs; GRPO finds that printing the expression lets Python compute it (held-out ~0.19 -> ~0.7).
CODE_SPEC = {
    "name": "demo-code-grpo",
    "model": {"path": "builtin:tiny-code"},
    "data": {"dataset": "builtin:code_tiny", "eval_size": 400},
    "verifiers": [{"name": "code", "config": {"timeout_s": 5}}],
    "rollout": {"group_size": 16, "max_new_tokens": 16, "temperature": 1.0},
    "optim": {"lr": 1e-4},
    "train": {"steps": 100, "prompts_per_step": 16, "eval_every": 50, "seed": 0},
}
# A real small instruct model (SmolLM2-135M-Instruct: `rlvr models pull smollm2-135m`) on real tasks, at
# sizes 2 CPU cores train in ~30 minutes each; bench/learning.py runs exactly these (and TRL beside them).
REAL_SPECS = {
    "math": {
        "name": "real-math-grpo",
        "model": {"path": "smollm2-135m"},
        # SmolLM2 starts at 0.35 here (greedy, 100 held-out; bench/RESULTS.md): room to learn, signal to learn from
        "data": {"dataset": "builtin:chain_sum", "eval_size": 200, "train_size": 2000,
                 "params": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2},
                 "instruction": "Give only the final number in \\boxed{}."},
        "verifiers": [{"name": "math"}],
        "rollout": {"group_size": 8, "max_new_tokens": 24, "temperature": 1.0},
        "optim": {"lr": 2e-6},
        "train": {"steps": 120, "prompts_per_step": 4, "eval_every": 20, "seed": 0},
    },
    "code": {
        "name": "real-code-grpo",
        "model": {"path": "smollm2-135m"},
        # difficulty 2 (two-step transformations): SmolLM2 starts at 0.22 (level 1: 0.61, little room)
        "data": {"dataset": "builtin:code_functions", "eval_size": 100, "params": {"difficulty": [2]}},
        "verifiers": [{"name": "code", "config": {"timeout_s": 5}}],
        # temperature 0.7: at 1.0 a 135M model's samples pass 6% here (most groups all-zero, no signal),
        # at 0.7 25%; the stop ends an answer at its closing fence (mean length 105 -> 58 tokens)
        "rollout": {"group_size": 8, "max_new_tokens": 128, "temperature": 0.7, "stop": ["\n```\n"]},
        "optim": {"lr": 5e-6},
        "train": {"steps": 60, "prompts_per_step": 4, "eval_every": 10, "seed": 0},
    },
}
JOB_TIMEOUT_S = 1800


def learning_spec(algorithm: str = "grpo", seed: int = 0):
    """The learning tests' job (and bench/learning_spread.py's): the demo's recipe with only the algorithm
    changed ("ppo-critic": PPO with a separate critic model), single-threaded so a run is reproducible on
    a given CPU kernel path."""
    from trainer.config import JobSpec

    base = CODE_SPEC if algorithm == "code" else DEMO_SPEC  # "code": GRPO on the tiny code task
    extra = {"algorithm": "ppo", "ppo": {"critic": "builtin:tiny-arith"}} if algorithm == "ppo-critic" else \
        {"algorithm": "grpo" if algorithm == "code" else algorithm}
    # online DPO learns from one pair per group (not G completions): twice the steps (each is 4x cheaper)
    budget = {"steps": 300, "eval_every": 100} if algorithm == "dpo" else {}
    return JobSpec.model_validate({**base, "name": f"learn-{algorithm}", **extra,
                                   "train": {**base["train"], "seed": seed, "threads": 1, **budget}})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(args: list[str], log_path: Path, env: dict) -> subprocess.Popen:
    log = open(log_path, "ab")
    return subprocess.Popen([sys.executable, "-m", "service.cli", *args], stdout=log, stderr=subprocess.STDOUT,
                            env=env, start_new_session=True)


def _stop(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=timeout)
    except (subprocess.TimeoutExpired, ProcessLookupError):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=timeout)


def demo_spec(task: str = "math", model: str | None = None) -> dict:
    """The demo's job: the tiny models' recipes, or with ``model`` (a pulled model such as
    smollm2-135m) the real-model recipe of bench/learning.py for that task."""
    if model:
        if task not in REAL_SPECS:
            raise ValueError(f"unknown demo task {task!r}; known: {', '.join(REAL_SPECS)}")
        spec = json.loads(json.dumps(REAL_SPECS[task]))
        spec["model"]["path"] = model
        return spec
    base = {"math": DEMO_SPEC, "code": CODE_SPEC}.get(task)
    if base is None:
        raise ValueError(f"unknown demo task {task!r}; known: math, code")
    return json.loads(json.dumps(base))


def _sandbox_missing(spec: dict) -> str | None:
    """Why the sandbox cannot run here, when the spec's verifiers need it (the code verifier); else None."""
    if not any(v["name"] == "code" for v in spec["verifiers"]):
        return None
    import sandbox

    try:
        sandbox.get_backend("local")
    except sandbox.SandboxError as e:
        return str(e) or type(e).__name__
    return None


def run_demo(steps: int | None = None, as_json: bool = False, port: int = 0, keep_serving: bool = False,
             task: str = "math", model: str | None = None) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from .client import Client

    console = Console(stderr=as_json, quiet=as_json)
    settings = get_settings()
    home = settings.home_dir
    (home / "logs").mkdir(parents=True, exist_ok=True)
    spec = demo_spec(task, model)
    reason = _sandbox_missing(spec)
    if reason:  # say why now, rather than a job that pauses with every verdict an error
        console.print(f"[red]the {task} task runs programs in the sandbox, which this machine cannot start: "
                      f"{reason}[/]\n`make demo` installs bubblewrap when run as root "
                      "(else: apt-get install bubblewrap); `rlvr doctor` checks the rest.")
        if as_json:
            print(json.dumps({"status": "sandbox_unavailable", "error": reason}), flush=True)
        return 2
    if steps:
        spec["train"]["steps"] = steps
        spec["train"]["eval_every"] = max(1, steps // 3)

    with console.status("loading the model into the model cache…"):
        from trainer.models.resolve import resolve_model

        resolve_model(spec["model"]["path"], settings.models_dir, log=lambda m: console.log(m))

    port = port or _free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "RLVR_HOME": str(home), "RLVR_PORT": str(port)}
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    with ExitStack() as stack:
        api = _spawn(["serve", "--port", str(port)], home / "logs" / "api.log", env)
        stack.callback(_stop, api)
        wrk = _spawn(["worker", "--loglevel", "warning"], home / "logs" / "worker.log", env)
        stack.callback(_stop, wrk)
        client = Client(url)
        client.wait_healthy(timeout=60)
        job = client.submit(spec)
        job_id, total = job["id"], spec["train"]["steps"]
        console.print(f"submitted [bold]{job_id}[/] — dashboard: {url}/dashboard?job={job_id}")

        before = after = None
        deadline = time.monotonic() + JOB_TIMEOUT_S
        cols = [TextColumn(f"[bold]GRPO · {task}"), BarColumn(), TextColumn("{task.completed}/{task.total} steps"),
                TextColumn("{task.fields[info]}"), TimeElapsedColumn()]
        with Progress(*cols, console=console, transient=False) as bar:
            task = bar.add_task("train", total=total, info="starting worker…")
            seen = -1
            while True:
                for p in client.metrics(job_id, after=seen):
                    seen = p["step"]
                    m = p["metrics"]
                    if "eval/accuracy" in m:
                        after = m["eval/accuracy"]
                        before = m["eval/accuracy"] if p["step"] == 0 else before
                    info = f"reward {m.get('reward/mean', 0):.3f}  acc {m.get('accuracy', 0):.3f}"
                    if after is not None:
                        info += f"  held-out {after:.3f}"
                    bar.update(task, completed=p["step"], info=info)
                state = client.job(job_id)
                if state["status"] in ("succeeded", "failed", "cancelled", "paused"):
                    break
                if api.poll() is not None or wrk.poll() is not None:
                    console.print(f"[red]a demo process exited; see {home / 'logs'}[/]")
                    break
                if time.monotonic() > deadline:
                    console.print(f"[red]timed out after {JOB_TIMEOUT_S}s[/]")
                    break
                time.sleep(0.5)
        state = client.job(job_id)
        result = state.get("result") or {}
        before = result.get("accuracy_before", before)
        after = result.get("accuracy_after", after)
        table = Table(title=f"held-out accuracy ({spec['data']['eval_size']} unseen problems, greedy)")
        for col in ("", "step", "accuracy"):
            table.add_column(col)
        table.add_row("before", "0", f"{before:.3f}" if before is not None else "–")
        table.add_row("after", str(state["progress"]["step"]), f"{after:.3f}" if after is not None else "–")
        console.print(table)
        if state.get("error"):
            console.print(f"[red]{state['error']['code']}: {state['error']['message']}[/]")
        warnings = [e["message"] for e in client.events(job_id, limit=1000)["data"] if e["type"] == "warning"]
        for w in warnings:
            console.print(f"[yellow]warning: {w}[/]")
        console.print(f"dashboard: {url}/dashboard?job={job_id}")
        if keep_serving and not as_json:
            console.print("serving; press Ctrl-C to stop")
            try:
                while api.poll() is None:
                    time.sleep(1)
            except KeyboardInterrupt:
                pass
    out = {"job_id": job_id, "status": state["status"], "accuracy_before": before, "accuracy_after": after,
           "steps": state["progress"]["step"], "dashboard": f"{url}/dashboard?job={job_id}",
           **({"warnings": warnings} if warnings else {})}
    if as_json:
        print(json.dumps(out), flush=True)
    return 0 if state["status"] == "succeeded" else 1
