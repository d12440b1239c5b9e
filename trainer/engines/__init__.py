"""Rollout engines, by name: the job's ``rollout.engine`` picks one from ``ENGINES``.

- ``hf``: our sampling loop on the model's KV cache (``HFEngine``), the default;
- ``hf-generate``: transformers ``model.generate`` on the same batch (``GenerateEngine``), kept as
  the reference the tests and bench/rollout.py compare against;
- ``vllm``: offline vLLM in this process (``trainer.engines.vllm``; optional extra ``rlvr[vllm]``),
  imported only when asked for;
- ``auto``: vLLM when a GPU and vLLM are both there, else ``hf`` (``auto_engine_name``).
Every engine is built as ``ENGINES[name](model, tokenizer)`` and has ``generate(prompts, n, params)``.
"""
from __future__ import annotations

import importlib.util
from typing import Any, Protocol, Sequence

import torch

from ..rollout import Rollout, SamplingParams
from .hf import GenerateEngine, HFEngine


class RolloutEngine(Protocol):
    def generate(self, prompts: Sequence[Any], n: int, params: SamplingParams) -> Rollout: ...


def vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None


def _vllm_engine(model, tokenizer, **kwargs):
    from .vllm import VLLMEngine  # lazy: vllm is an optional extra

    return VLLMEngine(model, tokenizer, **kwargs)


def auto_engine_name() -> str:
    """What ``engine: auto`` picks here: vLLM when a GPU and vLLM are both present (where it pays off),
    else our HF loop."""
    return "vllm" if torch.cuda.is_available() and vllm_available() else "hf"


def auto_engine(model, tokenizer, **kwargs):
    return ENGINES[auto_engine_name()](model, tokenizer, **kwargs)


ENGINES = {"hf": HFEngine, "hf-generate": GenerateEngine, "vllm": _vllm_engine, "auto": auto_engine}

__all__ = ["ENGINES", "GenerateEngine", "HFEngine", "RolloutEngine", "auto_engine_name", "vllm_available"]
