"""Checkpoints: an HF folder (safetensors + tokenizer) plus the trainer state needed to resume.

Written to a temporary sibling and renamed into place, so a crash or a full disk mid-write never
leaves a half checkpoint where ``latest()`` would pick it up.
"""
from __future__ import annotations

import os
import random
import shutil
from pathlib import Path
from typing import Any

import torch

STATE_FILE = "trainer_state.pt"


class CheckpointError(RuntimeError):
    pass


def save(ckpt_root: Path, step: int, model, tokenizer, state: dict[str, Any]) -> Path:
    return save_to(ckpt_root / f"step-{step:07d}", model, tokenizer, {**state, "step": step})


def save_to(final: Path, model, tokenizer, state: dict[str, Any]) -> Path:
    """One checkpoint folder, written atomically (a training step's, or a training session's named save)."""
    ckpt_root = final.parent
    tmp = ckpt_root / f".tmp-{final.name}-{os.getpid()}"
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        state = dict(state)
        state.setdefault("rng_by_rank", [rng_state()])
        torch.save(state, tmp / STATE_FILE)
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
    except (OSError, RuntimeError) as e:  # torch.save reports a full disk as a RuntimeError
        shutil.rmtree(tmp, ignore_errors=True)
        free = shutil.disk_usage(ckpt_root).free if ckpt_root.exists() else -1
        why = "No space left on device" if getattr(e, "errno", None) == 28 or 0 <= free < 64 << 20 else str(e)
        raise CheckpointError(f"could not write checkpoint {final.name}: {why} "
                              f"({free} bytes free in {ckpt_root}; the previous checkpoint is intact)") from e
    return final


def latest(ckpt_root: Path) -> Path | None:
    if not ckpt_root.is_dir():
        return None
    done = sorted(p for p in ckpt_root.iterdir() if p.name.startswith("step-") and (p / STATE_FILE).exists())
    return done[-1] if done else None


def rng_state() -> dict[str, Any]:
    """This process's random streams (sampling, shuffles): saved so a resumed run draws the same."""
    out = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        out["cuda"] = torch.cuda.get_rng_state_all()
    return out


def load_state(ckpt: Path, rank: int = 0) -> dict[str, Any]:
    """The trainer state of a checkpoint; restores the RNG streams of ``rank``."""
    state = torch.load(ckpt / STATE_FILE, weights_only=False)
    rngs = state.get("rng_by_rank") or [state["rng"]]  # "rng": checkpoints written before data parallelism
    if rank >= len(rngs):
        raise CheckpointError(f"{ckpt} was written by {len(rngs)} rank(s); cannot resume rank {rank}")
    rng = rngs[rank]
    torch.set_rng_state(rng["torch"])
    random.setstate(rng["python"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    return state
