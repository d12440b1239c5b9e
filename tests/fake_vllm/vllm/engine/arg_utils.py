"""The fake's EngineArgs: the fields of vLLM 0.33's that trainer.engines.vllm passes or feature-detects."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EngineArgs:
    model: str = ""
    tokenizer: str | None = None
    dtype: str = "auto"
    seed: int = 0
    max_model_len: int | None = None
    enable_prefix_caching: bool | None = None
    gpu_memory_utilization: float = 0.9
    logprobs_mode: str = "raw_logprobs"
    enforce_eager: bool = False
    enable_sleep_mode: bool = False
    device_ids: list | None = None
