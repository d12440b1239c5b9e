"""Rollout engines, by name: the job's ``rollout.engine`` picks one from ``ENGINES``.

- ``hf``: our sampling loop on the model's KV cache (``HFEngine``), the default;
- ``hf-generate``: transformers ``model.generate`` on the same batch (``GenerateEngine``), kept as
  the reference the tests and bench/rollout.py compare against;
- ``vllm``: offline vLLM in this process (``trainer.engines.vllm``; optional extra ``rlvr[vllm]``),
  imported only when asked for;
- ``auto``: vLLM when the job runs on a GPU, vLLM is installed and the spec is one vLLM can sample
  for, else ``hf`` (``auto_engine_name``); a job's ``auto`` is resolved before its engine is built.
Every engine is built as ``ENGINES[name](model, tokenizer, **options)`` — ``ENGINE_OPTIONS[name]``
turns the spec into an engine's options — and has ``generate(prompts, n, params)``.
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

    # prompts that are token ids already, never re-rendered (episodes' later turns; not hf-generate)
    def generate_ids(self, ids: list[list[int]], n: int, params: SamplingParams) -> Rollout: ...


def vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None


def _vllm_engine(model, tokenizer, **kwargs):
    from .vllm import VLLMEngine  # lazy: vllm is an optional extra

    return VLLMEngine(model, tokenizer, **kwargs)


def auto_engine_name(spec=None, device: torch.device | None = None, world: int = 1) -> str:
    """What ``engine: auto`` picks: vLLM where it pays off and works — the job runs on a GPU
    (``device``, default: what this host would give a job), vLLM is installed, and the spec is one vLLM
    can sample for (``JobSpec.vllm_blockers``) — else our HF loop."""
    from ..devices import select

    device = device if device is not None else select("auto")
    if device.type != "cuda" or not vllm_available():
        return "hf"
    return "hf" if spec is not None and spec.vllm_blockers(world) else "vllm"


def auto_engine(model, tokenizer, **kwargs):
    return ENGINES[auto_engine_name(device=next(model.parameters()).device)](model, tokenizer, **kwargs)


ENGINES = {"hf": HFEngine, "hf-generate": GenerateEngine, "vllm": _vllm_engine, "auto": auto_engine}


def _vllm_options(spec, dist, sleep: bool | None) -> dict[str, Any]:
    why = spec.vllm_blockers(dist.world)  # the spec validator refuses these; torchrun's WORLD_SIZE it cannot see
    if why:
        raise ValueError("rollout.engine vllm: " + "; ".join(why))
    ro = spec.rollout
    return {"gpu_memory_utilization": ro.gpu_memory_utilization, "max_model_len": ro.max_model_len,
            "sleep": ro.vllm_sleep if sleep is None else sleep, "seed": spec.train.seed, "device": dist.device,
            # bf16 autocast on a GPU: vLLM samples in bf16 too (fp32 rules out its fast attention backends)
            "dtype": "bfloat16" if spec.train.precision == "bf16" and dist.device.type == "cuda" else None}


# The spec's settings an engine takes, by engine name (engines not named here take none).
ENGINE_OPTIONS = {"vllm": _vllm_options}


def job_engine(spec, policy, tok, dist, sleep: bool | None = None):
    """The engine a job's spec asks for, built the same way for the trainer and the async producer:
    ``auto`` is resolved to a concrete engine first, so the engine gets the spec's settings for it.
    Under FSDP it generates with the policy's shards gathered (once per call), since ranks generate
    different lengths and must not meet in per-layer collectives. ``sleep`` overrides
    ``rollout.vllm_sleep`` (the async producer's vLLM samples all the time: it never sleeps)."""
    name = spec.rollout.engine
    if name == "auto":
        name = auto_engine_name(spec, dist.device, dist.world)
    options = ENGINE_OPTIONS.get(name)
    engine = ENGINES[name](policy, tok, **(options(spec, dist, sleep) if options else {}))
    return _Gathered(engine, policy) if dist.sharded else engine


def join(engine) -> None:
    """Take part in a generate round with nothing of this rank's own to sample. Under FSDP every
    generate call all-gathers the policy's shards on every rank, so ranks must make the same number of
    calls: a rank whose share is empty this round (no dead groups to resample, a shorter eval slice)
    calls this instead. Engines without collectives need nothing."""
    take_part = getattr(engine, "join", None)
    if take_part is not None:
        take_part()


class _Gathered:
    def __init__(self, engine, model):
        self.engine, self.model = engine, model
        self.default_tis_cap = getattr(engine, "default_tis_cap", None)

    def generate_ids(self, ids, n, params):
        with gathered(self.model):
            return self.engine.generate_ids(ids, n, params)

    def generate(self, prompts, n, params):
        with gathered(self.model):
            return self.engine.generate(prompts, n, params)

    def join(self) -> None:
        with gathered(self.model):  # the same all-gathers as a generate call, nothing sampled
            pass


__all__ = ["ENGINES", "ENGINE_OPTIONS", "GenerateEngine", "HFEngine", "RolloutEngine", "auto_engine_name",
           "job_engine", "join", "vllm_available"]
