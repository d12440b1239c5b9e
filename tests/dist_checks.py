"""Checks that need a real process group, run on every rank under torchrun (tests/test_distributed.py):

    python -m torch.distributed.run --nproc_per_node 2 -m tests.dist_checks CHECK OUT_DIR MODELS_DIR

Each rank writes what it found to OUT_DIR/rank-R.json and exits non-zero when a check fails.
- ``vllm_push``: the weights the vLLM engine pushes (trainer.checkpoint.merged_weights) of an FSDP2-
  sharded policy, read inside ``gathered()`` as the engine reads them, must be whole plain tensors equal
  to the unsharded model's, and copy into plain tensors as vLLM's weight loader copies them.
- ``cpu_mesh``: ``train.device: cpu`` FSDP on a host whose accelerator is CUDA (mocked: this machine has
  none) must shard onto a CPU mesh, not the accelerator's default one.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch


def _policy(models_dir: Path):
    from transformers import AutoModelForCausalLM

    from trainer.models.tiny_arith import ensure_tiny_model

    return AutoModelForCausalLM.from_pretrained(ensure_tiny_model(models_dir, log=lambda m: None))


def vllm_push(dist, models_dir: Path) -> dict:
    from torch.distributed.tensor import DTensor

    from trainer.checkpoint import merged_weights
    from trainer.distributed import fsdp_wrap, gathered

    whole = {k: v.clone() for k, v in _policy(models_dir).state_dict().items()}
    model = fsdp_wrap(_policy(models_dir), dist)
    with gathered(model):
        items = list(merged_weights(model))
    plain = [k for k, v in items if type(v) is torch.Tensor and not isinstance(v, DTensor)]
    same = [k for k, v in items if k in whole and v.shape == whole[k].shape and torch.equal(v, whole[k])]
    for k, v in items:  # vLLM's default_weight_loader: param.data.copy_(loaded_weight)
        torch.empty_like(whole[k]).copy_(v)
    return {"items": len(items), "whole": len(whole), "plain": len(plain), "equal": len(same),
            "names_match": sorted(k for k, _ in items) == sorted(whole)}


def cpu_mesh(dist, models_dir: Path) -> dict:
    from torch.distributed.tensor import DTensor

    from trainer.distributed import fsdp_wrap

    torch._C._get_accelerator = lambda: torch.device("cuda")  # what a GPU host reports
    model = fsdp_wrap(_policy(models_dir), dist)
    params = list(model.parameters())
    return {"dtensors": sum(isinstance(p, DTensor) for p in params), "params": len(params),
            "devices": sorted({str(p.device) for p in params}),
            "meshes": sorted({p.device_mesh.device_type for p in params if isinstance(p, DTensor)})}


CHECKS = {"vllm_push": vllm_push, "cpu_mesh": cpu_mesh}


def main(check: str, out: str, models_dir: str) -> int:
    import os

    from trainer.distributed import _init

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist = _init(rank, world, int(os.environ["LOCAL_RANK"]), "env://", "cpu")
    try:
        found = CHECKS[check](dist, Path(models_dir))
    finally:
        torch.distributed.destroy_process_group()
    Path(out, f"rank-{rank}.json").write_text(json.dumps(found))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
