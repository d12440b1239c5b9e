"""`rlvr doctor`: what this host gives a worker and the API, checked live, each with the reason when not.

Torch build and CPU kernel path, CUDA devices and the device a job would train on, the rollout engine
``auto`` would pick, the sandbox (bubblewrap, seccomp, cgroup layout, the interpreter jailed code runs
on), the job store and the broker. Every probe has a timeout; none raises.
"""
from __future__ import annotations

import shutil
import time
from typing import Any, Callable

from ..settings import Settings

TIMEOUT_S = 5.0


def _check(fn: Callable[[], Any]) -> dict[str, Any]:
    t0 = time.monotonic()
    try:
        detail = fn()
        out = {"ok": True, "reason": ""}
        if isinstance(detail, dict):
            out.update(detail)
        elif detail:
            out["detail"] = str(detail)
    except Exception as e:  # a doctor reports failures, it does not have them
        out = {"ok": False, "reason": f"{type(e).__name__}: {e}"}
    out["seconds"] = round(time.monotonic() - t0, 3)
    return out


def _sandbox() -> dict[str, Any]:
    from sandbox import local, seccomp

    info = local.probe()  # bwrap + setpriv, the interpreter, seccomp, cgroups: raises with the reason
    info["bwrap"] = shutil.which("bwrap") or "/usr/bin/bwrap"
    info["seccomp"] = f"{len(seccomp.bpf_program())} bytes of BPF"
    from sandbox import Limits

    backend = local.LocalBackend(workers=1)
    try:
        r = backend.run(b"print(6 * 7)", b"", Limits(wall_s=TIMEOUT_S))
    finally:
        backend.close()
    if r.stdout.strip() != b"42":
        raise RuntimeError(f"a jailed print(6 * 7) gave {r.status.value}: {r.reason or r.stderr[-200:]!r}")
    return info


def _database(settings: Settings) -> str:
    from sqlalchemy import create_engine, text

    url = settings.db_url
    args = {"connect_timeout": int(TIMEOUT_S)} if url.startswith("postgresql") else {"timeout": TIMEOUT_S}
    engine = create_engine(url, connect_args=args)
    try:
        with engine.connect() as c:
            c.execute(text("select 1"))
    finally:
        engine.dispose()
    return url.split("://")[0] + "://" + url.rsplit("@", 1)[-1].split("://")[-1]  # no credentials


def _broker(settings: Settings) -> str:
    if settings.embedded_broker:
        d = settings.broker_dir
        d.mkdir(parents=True, exist_ok=True)
        probe = d / ".doctor"
        probe.write_text("ok")
        probe.unlink()
        return "filesystem broker (embedded)"
    from kombu import Connection

    with Connection(settings.broker, connect_timeout=TIMEOUT_S) as c:
        c.ensure_connection(max_retries=1, timeout=TIMEOUT_S)
    return settings.broker.split("://")[0] + "://" + settings.broker.rsplit("@", 1)[-1].split("://")[-1]


def report(settings: Settings) -> dict[str, Any]:
    from trainer import devices
    from trainer.engines import auto_engine_name, vllm_available

    host = devices.describe()
    return {
        "device": host["device"], "engine": auto_engine_name(), "cpu_capability": host["cpu_capability"],
        "torch": host["torch"], "cuda_build": host["cuda_build"], "cuda_devices": host["cuda_devices"],
        "vllm_installed": vllm_available(),
        "sandbox": _check(_sandbox),
        "database": _check(lambda: _database(settings)),
        "broker": _check(lambda: _broker(settings)),
    }
