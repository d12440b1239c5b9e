"""A live `rlvr serve` + `rlvr worker` for the Tinker SDK tests: auth on, two tenants, the session worker
on the embedded broker. Sessions hold float64 models, with tests/exact.py installed in the worker (a
sitecustomize on its PYTHONPATH), so comparisons across processes are float64 round-off plus the wire's
float32 and nothing else: their tolerances come from those two epsilons."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx

from tests.conftest import REPO, free_port, spawn, stop, wait_for

SITE = "import os\nif os.environ.get('RLVR_TEST_EXACT'):\n    from tests import exact\n    exact.install_on_import()\n"


class Server:
    def __init__(self, tmp: Path, models_dir: Path, dtype: str = "float64", extra_env: dict | None = None):
        site = tmp / "site"
        site.mkdir(parents=True, exist_ok=True)
        (site / "sitecustomize.py").write_text(SITE)
        self.home = tmp / "home"
        self.env = {"RLVR_HOME": str(self.home), "RLVR_MODELS": str(models_dir), "RLVR_AUTH": "true",
                    "RLVR_ADMIN_KEY": "admin-secret-key", "RLVR_TINKER_DTYPE": dtype, "RLVR_WORKER_THREADS": "1",
                    "RLVR_LEASE_S": "20", "RLVR_REAPER_INTERVAL_S": "0.5", "RLVR_TEST_EXACT": "1",
                    "PYTHONPATH": f"{site}:{REPO}", **(extra_env or {})}
        # RLVR_LEASE_S: no test here is about losing a worker (tests/faults are), so a lease a loaded 2-core
        # CI machine cannot starve (one of 4 s once expired mid-run there and failed the GRPO example)
        self.keys = {}
        for tenant in ("acme", "other"):
            out = subprocess.run([sys.executable, "-m", "service.cli", "keys", "create", "--tenant", tenant],
                                 env={**os.environ, **self.env}, cwd=REPO, capture_output=True, text=True, timeout=120)
            assert out.returncode == 0, out.stderr
            self.keys[tenant] = out.stdout.strip().splitlines()[-1]
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.tmp = tmp
        self.api = spawn(["service.cli", "serve", "--port", str(self.port)], self.env, tmp / "api.log")
        self.workers = [spawn(["service.cli", "worker", "--pool", "prefork", "-c", "2"], self.env, tmp / "worker.log")]
        wait_for(self._up, 90, "the API")

    def _up(self) -> bool:
        try:
            return httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def client(self, tenant: str = "acme"):
        import tinker

        return tinker.ServiceClient(base_url=self.url, api_key="tml-" + self.keys[tenant])

    def http(self, tenant: str = "acme") -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {self.keys[tenant]}"}, timeout=30)

    def checkpoint_dir(self, tinker_path: str) -> Path:
        """Where the server wrote a checkpoint (tests read the files; replies never name server paths)."""
        run, kind, name = tinker_path.removeprefix("tinker://").split("/")
        return self.home / "runs" / "sessions" / run.split(":")[0] / run.replace(":", "-") / kind / name

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-4000:]}"
                         for p in sorted(self.tmp.glob("*.log")))

    def close(self) -> None:
        for p in [*self.workers, self.api]:
            stop(p)


def tokenizer(models_dir: Path):
    """The tiny model's tokenizer, client-side (the SDK's get_tokenizer looks names up on the HF hub)."""
    from transformers import AutoTokenizer

    from trainer.models.resolve import resolve_model

    return AutoTokenizer.from_pretrained(resolve_model("builtin:tiny-arith", models_dir, log=lambda m: None))
