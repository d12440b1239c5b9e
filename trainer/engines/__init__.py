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

from ..distributed import gathered
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


def job_engine(spec, policy, tok, dist, sleep: bool | None = None):
    """The engine a job's spec asks for, built the same way for the trainer and the async producer.
    Under FSDP it generates with the policy's shards gathered (once per call), since ranks generate
    different lengths and must not meet in per-layer collectives. ``sleep`` overrides
    ``rollout.vllm_sleep`` (the async producer's vLLM samples all the time: it never sleeps)."""
    ro = spec.rollout
    kw = ({"gpu_memory_utilization": ro.gpu_memory_utilization, "max_model_len": ro.max_model_len,
           "sleep": ro.vllm_sleep if sleep is None else sleep, "seed": spec.train.seed} if ro.engine == "vllm" else {})
    engine = ENGINES[ro.engine](policy, tok, **kw)
    return _Gathered(engine, policy) if dist.sharded else engine


class _Gathered:
    def __init__(self, engine, model):
        self.engine, self.model = engine, model

    def generate(self, prompts, n, params):
        with gathered(self.model):
            return self.engine.generate(prompts, n, params)


__all__ = ["ENGINES", "GenerateEngine", "HFEngine", "RolloutEngine", "auto_engine_name", "job_engine", "vllm_available"]
