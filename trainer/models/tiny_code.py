"""The bundled tiny code model: the tiny arithmetic model taught to answer ``code: a+b`` with a one-line
Python program, for a code-RL learning test that fits in CI.

Built (``python -m trainer.models.tiny_code build``) from the committed tiny-arith weights by a short SFT on the
TRAIN split of ``builtin:code_tiny``: most targets print the value (``print(17)``: right only when the
model's arithmetic is), a few print the expression (``print(8+9)``: always right, the program computes
it). The warm-up stops when held-out greedy accuracy — programs run in the sandbox, judged by the code
verifier — enters ``TARGET_BAND``; RL then has something to find: programs that let Python compute.
Committed like tiny-arith (same tokenizer, 3.5 MB, manifest with hashes and the accuracy it was built to).
"""
from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import sys
import time
from pathlib import Path

import torch

from . import tiny_arith

NAME = "tiny-code"
ASSETS = Path(__file__).parent / "assets" / NAME
EXPR_FRAC = 0.3            # share of SFT targets that print the expression instead of the value
TARGET_BAND = (0.15, 0.35)
MIN_STEPS, MAX_STEPS, EVAL_EVERY = 20, 600, 10
EVAL_SIZE = 400
LR = 5e-4
VERIFIER = {"name": "code", "config": {"timeout_s": 5.0}}


def target(s: dict, rng: random.Random) -> str:
    expr = re.sub(r"^code:\s*", "", s["prompt"])
    value = s["reference"]["tests"][0]["stdout"].strip()
    return f"print({expr})" if rng.random() < EXPR_FRAC else f"print({value})"


def build(out: str | Path, band: tuple[float, float] = TARGET_BAND, seed: int = 0, log=print) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ..config import DataConfig
    from ..tasks.code import _tiny

    out = Path(out)
    t0 = time.time()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(seed)
        tok = AutoTokenizer.from_pretrained(tiny_arith.ASSETS)
        model = AutoModelForCausalLM.from_pretrained(tiny_arith.ASSETS)
        train, held = _tiny(DataConfig(dataset="builtin:code_tiny", eval_size=EVAL_SIZE))
        rng = random.Random(seed)
        opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
        acc, step = 0.0, 0
        while True:
            model.train()
            for _ in range(EVAL_EVERY):
                batch = rng.sample(train, tiny_arith.SFT_BATCH)
                answers = {id(s): target(s, rng) for s in batch}
                loss = tiny_arith.sft_step(model, opt, *tiny_arith.sft_batch(tok, batch, lambda s: answers[id(s)]))
                step += 1
            if step < MIN_STEPS:
                continue
            model.eval()
            acc = tiny_arith.held_out_accuracy(model, tok, held, max_new_tokens=16, verifier=VERIFIER)
            log(f"sft step {step}: loss {loss:.3f}, held-out accuracy {acc:.4f}")
            if band[0] <= acc <= band[1]:
                break
            if acc > band[1] or step >= MAX_STEPS:
                raise tiny_arith.TinyModelError(f"the warm-up missed its band {band}: {acc:.4f} at step {step}")
    finally:
        torch.set_num_threads(threads)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    manifest = {"name": NAME, "base": tiny_arith.NAME, "sft_steps": step, "seed": seed, "held_out_accuracy": acc,
                "eval_size": EVAL_SIZE, "band": list(band), "expr_frac": EXPR_FRAC,
                "seconds": round(time.time() - t0, 1),
                "built_with": {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability()},
                "sha256": tiny_arith._hashes(tmp)}
    (tmp / tiny_arith.MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    log(f"tiny code model built in {time.time() - t0:.0f}s at {out}: {step} SFT steps, held-out accuracy {acc:.4f}")
    return manifest


def ensure_tiny_code(models_dir: str | Path, log=print) -> Path:
    return tiny_arith.install(ASSETS, models_dir, log)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m trainer.models.tiny_code", description=__doc__.split("\n\n")[0])
    ap.add_argument("cmd", choices=["build", "verify"])
    ap.add_argument("out", nargs="?", default=str(ASSETS))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.cmd == "build":
        build(args.out, seed=args.seed)
    else:
        print(json.dumps(tiny_arith.verify_assets(ASSETS), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
