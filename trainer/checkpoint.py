"""Checkpoints: an HF folder (safetensors + tokenizer) plus the trainer state needed to resume.

Written to a temporary sibling and renamed into place, so a crash or a full disk mid-write never
leaves a half checkpoint where ``latest()`` would pick it up.
"""
from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import torch

STATE_FILE = "trainer_state.pt"


class CheckpointError(RuntimeError):
    pass


def save(ckpt_root: Path, step: int, model, tokenizer, state: dict[str, Any],
         model_state: dict[str, Any] | None = None) -> Path:
    """``model_state``: the full weights when the live model is sharded (FSDP), gathered by the caller."""
    return save_to(ckpt_root / f"step-{step:07d}", model, tokenizer, {**state, "step": step}, model_state)


def save_to(final: Path, model, tokenizer, state: dict[str, Any], model_state: dict[str, Any] | None = None) -> Path:
    """One checkpoint folder, written atomically (a training step's, or a training session's named save)."""
    ckpt_root = final.parent
    tmp = ckpt_root / f".tmp-{final.name}-{os.getpid()}"
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        model.save_pretrained(tmp, safe_serialization=True, **({"state_dict": model_state} if model_state else {}))
        _plain_architecture(tmp)
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
    """The trainer state of a checkpoint; restores the RNG streams of ``rank``. Tensors load onto the
    CPU (the optimiser's go to its parameters' devices in load_state_dict): saved on cuda:0, they would
    otherwise land on cuda:0 in every rank, and not load at all on a host without that GPU."""
    state = torch.load(ckpt / STATE_FILE, weights_only=False, map_location="cpu")
    rngs = state.get("rng_by_rank") or [state["rng"]]  # "rng": checkpoints written before data parallelism
    if rank >= len(rngs):
        raise CheckpointError(f"{ckpt} was written by {len(rngs)} rank(s); cannot resume rank {rank}")
    rng = rngs[rank]
    torch.set_rng_state(rng["torch"])
    random.setstate(rng["python"])
    if "cuda" in rng and torch.cuda.is_available():
        # one state per GPU the saving process saw: restore those this host has (a job saved where 8
        # were visible resumes on a worker that sees 1); GPUs beyond the saved ones keep their own
        for i, cuda_state in enumerate(rng["cuda"][: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(cuda_state, i)
    return state


def _plain_architecture(folder: Path) -> None:
    """FSDP2 swaps a module's class for a generated ``FSDP<Name>`` subclass, and save_pretrained records
    the class name: put the model's own class back, so the folder loads into transformers."""
    cfg = folder / "config.json"
    if not cfg.exists():
        return
    data = json.loads(cfg.read_text())
    archs = data.get("architectures") or []
    fixed = [a[4:] if a.startswith("FSDP") else a for a in archs]
    if fixed != archs:
        data["architectures"] = fixed
        cfg.write_text(json.dumps(data, indent=2) + "\n")


# ---------------------------------------------------------------------------------------------- sharded state
def full_states(model, opt, sharded: bool) -> tuple[dict | None, dict]:
    """(full model weights or None, full optimiser state) to save. Sharded (FSDP): gathered from every
    rank — a collective every rank must call; rank 0 gets the tensors (on the CPU)."""
    if not sharded:
        return None, opt.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    weights = get_model_state_dict(model, options=opts)
    for key in (getattr(model, "all_tied_weights_keys", None) or {}):  # tied: saved once, as unsharded
        weights.pop(key, None)
    return weights, get_optimizer_state_dict(model, opt, options=opts)


def load_optimizer(opt, model, saved: dict, sharded: bool) -> None:
    if not sharded:
        opt.load_state_dict(saved)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(model, opt, saved, options=StateDictOptions(full_state_dict=True))


# ---------------------------------------------------------------------------------------------- pruning
INDEX = "index.json"


def record(ckpt_root: Path, name: str, eval_accuracy: float | None) -> None:
    """Remember a checkpoint's held-out accuracy (pruning keeps the best one without reading states)."""
    path = ckpt_root / INDEX
    index = json.loads(path.read_text()) if path.exists() else {}
    index[name] = eval_accuracy
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(index))
    tmp.replace(path)


def prune(ckpt_root: Path, keep_last: int) -> list[str]:
    """Delete all but the newest ``keep_last`` checkpoints, the best-accuracy one and the last one;
    returns the names removed."""
    done = sorted(p.name for p in ckpt_root.iterdir() if p.name.startswith("step-") and (p / STATE_FILE).exists())
    path = ckpt_root / INDEX
    index = json.loads(path.read_text()) if path.exists() else {}
    scored = [(acc, name) for name, acc in index.items() if acc is not None and name in done]
    keep = set(done[-keep_last:]) | ({max(scored)[1]} if scored else set())
    gone = [n for n in done if n not in keep]
    for n in gone:
        shutil.rmtree(ckpt_root / n, ignore_errors=True)
        index.pop(n, None)
    if gone:
        path.write_text(json.dumps(index))
    return gone


# ---------------------------------------------------------------------------------------------- LoRA
def merged_weights(model):
    """(name, tensor) of the weights vLLM serves: a plain model's state dict (whole tensors, FSDP shards
    gathered), or for a LoRA (PEFT) policy
    the base weights with each adapter's delta (scale * B @ A) added, under the base model's names —
    what ``merge_and_unload`` would give, without touching the trained model."""
    if not hasattr(model, "get_base_model"):
        for k, v in model.state_dict().items():
            yield k, _full(v.detach())
        return
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    deltas = {}
    for name, mod in base.named_modules():
        if isinstance(mod, LoraLayer):
            for adapter in mod.active_adapters:
                if adapter in getattr(mod, "lora_A", {}):
                    d = mod.get_delta_weight(adapter).detach()
                    deltas[f"{name}.weight"] = deltas[f"{name}.weight"] + d if f"{name}.weight" in deltas else d
    for k, v in base.state_dict().items():
        if "lora_" in k:
            continue
        k = k.replace(".base_layer.", ".")
        yield k, (v + deltas[k].to(v.dtype)).detach() if k in deltas else v.detach()


def _full(t):
    """An FSDP2 model's state dict holds its shards (DTensors) even while unsharded for generation: the
    whole tensor, all-gathered (a collective: every rank reads the weights in the same order)."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def save_merged(ckpt: Path, model, tokenizer) -> Path:
    """A LoRA checkpoint's adapters merged into the base weights, as a plain HF folder ``ckpt/merged``
    (servable anywhere, no peft needed); the trained model is left as it is."""
    out = ckpt / "merged"
    tmp = ckpt / ".merged-tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    base = model.get_base_model()
    weights = dict(merged_weights(model))
    for key in (getattr(base, "all_tied_weights_keys", None) or {}):
        weights.pop(key, None)
    base.save_pretrained(tmp, state_dict=weights, safe_serialization=True)
    _plain_architecture(tmp)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out
