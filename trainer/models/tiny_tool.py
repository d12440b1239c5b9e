"""The bundled tiny tool model: the tiny arithmetic model taught the episodes' tool format, for a learning test
of multi-turn tool-using RL (spec.episodes) that fits in CI.

Built (``python -m trainer.models.tiny_tool build``) from the committed tiny-arith weights by a fixed SFT on the
TRAIN split of ``builtin:arithmetic``: ``TOOL_FRAC`` of the targets are whole tool episodes —
``<code>\\nprint(a+b)\\n</code>``, the sandbox's ``<output>…</output>`` (masked out of the loss: the model never
learns to write it), then ``\\boxed{value}`` — and the rest answer at once, with only the choice trained (the
``\\boxed{`` prefix), not the digits: the model's own arithmetic stays as weak as tiny-arith's, so the tool is
what pays. The build checks the share of held-out episodes sampled at temperature 1 that call the tool is in
``TARGET_BAND`` (rare enough that greedy answers do without it, common enough that RL finds it) and records
the share of those that end right. ``held_out_accuracy`` in the manifest is greedy pass@1 played as episodes
(tool calls run in the sandbox): low, since greedy answers at once; a GRPO run on episodes lifts it past
0.5 in ~20 steps while tools-off accuracy stays near 0 (tests/test_learning_tools.py).
Committed like tiny-arith (same tokenizer, 3.5 MB, manifest with hashes and the accuracy it was built to).
"""
from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import time
from pathlib import Path

import torch

from . import tiny_arith

NAME = "tiny-tool"
ASSETS = Path(__file__).parent / "assets" / NAME
TOOL_FRAC = 0.3             # share of SFT targets that are tool episodes
TARGET_BAND = (0.10, 0.35)  # share of sampled (T = 1) held-out episodes that call the tool: rare, not absent
SFT_STEPS = 300             # enough that a call copies the question (fewer: garbled code RL cannot repair)
EVAL_SIZE = 400
LR = 1e-3
MAX_NEW_TOKENS = 32       # one model turn, a call included (the learning test's rollout.max_new_tokens)
EPISODE_TOKENS = 80       # the model's context is 128 positions: prompt + episode fit


def episodes_config():
    from ..config import EpisodesConfig

    return EpisodesConfig(max_turns=2, max_tool_calls=1, max_observation_tokens=24, max_episode_tokens=EPISODE_TOKENS,
                          eval_tools_off=True, tools=[{"limits": {"wall_s": 4.0, "cpu_s": 2.0}}])


def trace(s: dict, rng: random.Random, cfg) -> list[tuple[str, int]]:
    """An SFT target as (text, trained) pieces: a tool episode, or an answer at once."""
    value = str(s["reference"])
    if rng.random() >= TOOL_FRAC:  # the choice to answer at once is taught, the digits are not: the model's
        return [("\\boxed{", 1), (value + "}", 0)]  # own arithmetic stays tiny-arith's (what the tool must beat)
    call = f"{cfg.call_open}\nprint({s['prompt']})\n{cfg.call_close}"
    observation = cfg.observation.replace("{output}", value + "\n")
    return [(call, 1), (observation, 0), ("\\boxed{" + value + "}", 1)]


def sft_batch(tok, samples, rng, cfg) -> tuple[torch.Tensor, torch.Tensor]:
    from ..rollout import render_prompt

    seqs, masks = [], []
    for s in samples:
        ids = tok(render_prompt(tok, s["prompt"]), add_special_tokens=False)["input_ids"]
        mask = [0] * len(ids)
        for text, trained in trace(s, rng, cfg):  # the tokenizer is character-level: pieces concatenate exactly
            piece = tok(text, add_special_tokens=False)["input_ids"]
            ids, mask = ids + piece, mask + [trained] * len(piece)
        seqs.append(ids + [tok.eos_token_id])
        masks.append(mask + [1])
    width = max(map(len, seqs))
    out = torch.full((len(seqs), width), tok.pad_token_id)
    m = torch.zeros((len(seqs), width))
    for i, (x, k) in enumerate(zip(seqs, masks)):
        out[i, : len(x)], m[i, : len(k)] = torch.tensor(x), torch.tensor(k, dtype=torch.float)
    return out, m


def sampled_tool_use(model, tok, samples, cfg, seed: int = 0) -> tuple[float, float]:
    """Of held-out episodes sampled at temperature 1: the share that call the tool, and the share of those that
    end with the right boxed answer."""
    from ..engines import HFEngine
    from ..episodes import Tools, run
    from ..rollout import SamplingParams

    torch.manual_seed(seed)
    eps, _ = run(HFEngine(model, tok), tok, [s["prompt"] for s in samples], 1, SamplingParams(MAX_NEW_TOKENS), cfg,
                 Tools.from_spec(cfg, 0))
    called = [(s, e) for s, e in zip(samples, eps) if e.tool_calls > 0]
    right = sum(("\\boxed{" + str(s["reference"]) + "}") in "".join(t["text"] for t in e.turns) for s, e in called)
    return len(called) / len(eps), right / max(1, len(called))


def held_out_accuracy(model, tok, samples, cfg) -> float:
    """Greedy pass@1 with the tool (each problem an episode, calls run in the sandbox), strict math verifier."""
    from verifiers.spec import VerifierSpec

    from ..engines import HFEngine
    from ..episodes import Tools
    from ..evaluation import Episodes, evaluate
    from ..scoring import Scorer

    scorer = Scorer([VerifierSpec.model_validate(tiny_arith.EVAL_VERIFIER)])
    m = evaluate(HFEngine(model, tok), scorer, samples, MAX_NEW_TOKENS,
                 play=Episodes(tok, cfg, Tools.from_spec(cfg, 0)))
    return m["eval/accuracy"]


def build(out: str | Path, band: tuple[float, float] = TARGET_BAND, seed: int = 0, log=print) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ..data import arithmetic_split

    out = Path(out)
    t0 = time.time()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    cfg = episodes_config()
    try:
        torch.manual_seed(seed)
        tok = AutoTokenizer.from_pretrained(tiny_arith.ASSETS)
        model = AutoModelForCausalLM.from_pretrained(tiny_arith.ASSETS)
        train, held = arithmetic_split(eval_size=EVAL_SIZE)
        rng = random.Random(seed)
        opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
        model.train()
        for step in range(1, SFT_STEPS + 1):
            loss = tiny_arith.sft_step(model, opt, *sft_batch(tok, rng.sample(train, tiny_arith.SFT_BATCH), rng, cfg))
            if step % 50 == 0:
                log(f"sft step {step}: loss {loss:.3f}")
        model.eval()
        rate, tool_acc = sampled_tool_use(model, tok, held, cfg)
        log(f"sampled held-out episodes calling the tool {rate:.4f} (right when they do: {tool_acc:.4f})")
        if not band[0] <= rate <= band[1]:
            raise tiny_arith.TinyModelError(f"the warm-up missed its band {band}: {rate:.4f}")
        acc = held_out_accuracy(model, tok, held, cfg)
    finally:
        torch.set_num_threads(threads)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    manifest = {"name": NAME, "base": tiny_arith.NAME, "sft_steps": SFT_STEPS, "seed": seed, "held_out_accuracy": acc,
                "tool_rate": rate, "tool_accuracy": tool_acc,
                "eval_size": EVAL_SIZE, "band": list(band), "tool_frac": TOOL_FRAC,
                "seconds": round(time.time() - t0, 1),
                "built_with": {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability()},
                "sha256": tiny_arith._hashes(tmp)}
    (tmp / tiny_arith.MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    log(f"tiny tool model built in {time.time() - t0:.0f}s at {out}: greedy accuracy with the tool {acc:.4f}")
    return manifest


def ensure_tiny_tool(models_dir: str | Path, log=print) -> Path:
    return tiny_arith.install(ASSETS, models_dir, log)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m trainer.models.tiny_tool", description=__doc__.split("\n\n")[0])
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
