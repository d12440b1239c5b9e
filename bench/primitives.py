"""Training primitives over HTTP vs in-process: what one forward_backward + optim_step round trip costs
through the official Tinker SDK against `rlvr serve` + a session worker, next to the very same work done
in this process by trainer.primitives (same model, batch, loss, optimiser, thread count).

overhead_ms = http_ms - inproc_ms: serialising the batch (protobuf), HTTP, the request's trip through the
store (SQLite + WAL by default) to the worker and back, and the long-poll that returns the result. Both
sides run the tiny model single-threaded on the same machine; the figures are medians.
Last line: overhead_ms= inproc_ms= http_ms= (plus the run's parameters).

    python bench/primitives.py --quick
    python bench/primitives.py --smoke    # CI: 2 round trips each, both sides; checks it runs, measures nothing
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def batch(tok, n: int):
    rows = []
    for i in range(n):
        ids = tok(f"{i + 3}+{2 * i + 1}={3 * i + 4}", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        rows.append(ids)
    return rows


def inproc(models: Path, rows, iters: int) -> list[float]:
    import torch

    from trainer import primitives as prim

    torch.set_num_threads(1)
    model, tok = prim.load_model(models / "tiny-arith", torch.float32, None)
    st = prim.TrainState(model, tok)
    data = [prim.Datum(torch.tensor(r[:-1]), {"target_tokens": torch.tensor(r[1:]), "weights": torch.ones(len(r) - 1)})
            for r in rows]
    hp = prim.AdamHyper(lr=1e-4)
    out = []
    for _ in range(iters + 3):
        t0 = time.perf_counter()
        st.forward_backward(data, "cross_entropy", {})
        st.optim_step(hp)
        out.append(time.perf_counter() - t0)
    return out[3:]  # warm-up


def http(models: Path, rows, iters: int, tmp: Path) -> list[float]:
    import tinker
    from tinker import types

    from tests.conftest import free_port, spawn, stop, wait_for

    env = {"RLVR_HOME": str(tmp / "home"), "RLVR_MODELS": str(models), "RLVR_WORKER_THREADS": "1"}
    port = free_port()
    procs = [spawn(["service.cli", "serve", "--port", str(port)], env, tmp / "api.log"),
             spawn(["service.cli", "worker", "--pool", "solo", "-c", "1"], env, tmp / "worker.log")]

    def up():
        try:
            return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(up, 90, "the API")
        sc = tinker.ServiceClient(base_url=f"http://127.0.0.1:{port}", api_key="tml-local")
        tc = sc.create_lora_training_client(base_model="builtin:tiny-arith", rank=0).result(timeout=180)
        data = [types.Datum(model_input=types.ModelInput.from_ints(r[:-1]),
                            loss_fn_inputs={"target_tokens": r[1:], "weights": [1.0] * (len(r) - 1)}) for r in rows]
        adam = types.AdamParams(learning_rate=1e-4)
        out = []
        for _ in range(iters + 3):
            t0 = time.perf_counter()
            fb = tc.forward_backward(data, "cross_entropy")  # submitted back to back, as a training loop does
            opt = tc.optim_step(adam)
            fb.result(timeout=120)
            opt.result(timeout=120)
            out.append(time.perf_counter() - t0)
        sc.close("success").result(timeout=60)
        return out[3:]
    finally:
        for p in procs:
            stop(p)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="20 round trips each (default 100)")
    ap.add_argument("--smoke", action="store_true", help="2 round trips each: checks the script runs "
                    "(seconds; not a measurement)")
    ap.add_argument("--datums", type=int, default=8, help="datums per forward_backward")
    args = ap.parse_args()
    iters = 2 if args.smoke else 20 if args.quick else 100
    from transformers import AutoTokenizer

    from trainer.models.tiny_arith import ensure_tiny_model

    models = Path(os.environ.get("RLVR_TEST_MODELS", REPO / ".cache" / "models"))
    ensure_tiny_model(models, log=lambda m: None)
    rows = batch(AutoTokenizer.from_pretrained(models / "tiny-arith"), args.datums)
    tmp = Path(tempfile.mkdtemp(prefix="rlvr-bench-primitives-"))
    try:
        a = statistics.median(inproc(models, rows, iters)) * 1000
        b = statistics.median(http(models, rows, iters, tmp)) * 1000
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"in-process: {a:.1f} ms per forward_backward+optim_step; over HTTP (SDK → serve → worker): {b:.1f} ms")
    print(f"overhead_ms={b - a:.1f} inproc_ms={a:.1f} http_ms={b:.1f} iters={iters} datums={args.datums} "
          f"store=sqlite threads=1 load={os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
