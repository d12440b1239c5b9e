"""The JSON requests of the training primitives, as the Tinker SDK sends them (our own pydantic models of
its wire shapes; unknown fields are ignored so a newer SDK's additions do not break old servers, and
anything we cannot honour is refused by name). Every field is described: they are the HTTP schema."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

NAME = r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$"
MAX_PROMPT = 65_536


class _In(BaseModel):
    model_config = ConfigDict(extra="ignore", protected_namespaces=())


class ClientConfigIn(_In):
    sdk_version: str = Field("", max_length=64, description="The SDK's version.")


class CreateSessionIn(_In):
    tags: list[str] = Field(default_factory=list, max_length=64, description="Free-form tags.")
    user_metadata: dict[str, Any] | None = Field(None, description="Stored with the session.")
    sdk_version: str = Field("", max_length=64, description="The SDK's version.")
    project_id: str | None = Field(None, max_length=200, description="Accepted and ignored (no projects here).")
    display_name: str | None = Field(None, max_length=256, description="Shown in session listings.")


class SessionIn(_In):
    session_id: str = Field(..., min_length=1, max_length=64, description="The session.")


class FinishIn(_In):
    reason: dict[str, Any] = Field(default_factory=dict, description="{type: success | errored | interrupted}.")
    detail: str | None = Field(None, max_length=2000, description="Why, in words.")


class LoraIn(_In):
    rank: int = Field(..., ge=0, le=1024, description="Adapter rank; 0 trains every weight (full fine-tuning).")
    seed: int | None = Field(None, ge=0, le=2**31 - 1, description="Seeds the adapters' initialisation.")
    train_unembed: bool = Field(True, description="Adapter on the output layer (skipped when tied to the embeddings).")
    train_mlp: bool = Field(True, description="Adapters on the MLP projections.")
    train_attn: bool = Field(True, description="Adapters on the attention projections.")


class OptimizerConfigIn(_In):
    type: str = Field("adamw", max_length=32, description="Only `adamw` is served.")


class CreateModelIn(_In):
    session_id: str = Field(..., min_length=1, max_length=64, description="The session that owns the model.")
    model_seq_id: int = Field(..., ge=0, le=2**31 - 1, description="The client's counter; the model id is "
                              "`{session_id}:train:{model_seq_id}`.")
    base_model: str = Field(..., min_length=1, max_length=1024, description="A name from get_server_capabilities.")
    lora_config: LoraIn | None = Field(None, description="LoRA adapters; absent (or rank 0): full fine-tuning.")
    optimizer_config: OptimizerConfigIn = Field(default_factory=OptimizerConfigIn, description="The optimiser family.")
    user_metadata: dict[str, Any] | None = Field(None, description="Accepted; not used.")


class ModelIdIn(_In):
    model_id: str = Field(..., min_length=1, max_length=200, description="A training model's id.")


class AdamIn(_In):
    learning_rate: float = Field(1e-4, ge=0, le=10, allow_inf_nan=False, description="Step size.")
    beta1: float = Field(0.9, ge=0, lt=1, allow_inf_nan=False, description="First-moment decay.")
    beta2: float = Field(0.95, ge=0, lt=1, allow_inf_nan=False, description="Second-moment decay.")
    eps: float = Field(1e-12, gt=0, le=1, allow_inf_nan=False, description="Added to the denominator.")
    weight_decay: float = Field(0.0, ge=0, le=1, allow_inf_nan=False, description="Decoupled weight decay (AdamW).")
    grad_clip_norm: float = Field(0.0, ge=0, allow_inf_nan=False, description="Clip the global gradient norm to "
                                  "this; 0 = no clipping.")
    type: Literal["adam", "adamw"] | None = Field(None, description="Only Adam is served.")


class OptimStepIn(_In):
    model_id: str = Field(..., min_length=1, max_length=200, description="The training model.")
    seq_id: int = Field(..., ge=1, le=2**31 - 1, description="The client's request counter (orders its requests).")
    adam_params: AdamIn | None = Field(None, description="This step's Adam hyper-parameters.")
    optimizer_params: AdamIn | None = Field(None, description="Same as adam_params (newer SDKs' name).")
    optim_params: AdamIn | None = Field(None, description="Same as adam_params.")


class SaveWeightsIn(_In):
    model_id: str = Field(..., min_length=1, max_length=200, description="The training model.")
    path: str | None = Field(None, pattern=NAME, description="The checkpoint's name (default: from seq_id).")
    seq_id: int = Field(..., ge=1, le=2**31 - 1, description="The client's request counter.")
    ttl_seconds: int | None = Field(None, ge=0, le=10 * 365 * 86400, description="Accepted; checkpoints are kept.")
    overwrite: bool = Field(False, description="Replace a checkpoint of the same name.")
    user_metadata: dict[str, str] | None = Field(None, description="Accepted; not used.")


class SaveForSamplerIn(_In):
    model_id: str = Field(..., min_length=1, max_length=200, description="The training model.")
    path: str | None = Field(None, pattern=NAME, description="A name: persistent sampler weights. Absent: a "
                             "snapshot for one sampling client (save_weights_and_get_sampling_client).")
    sampling_session_seq_id: int | None = Field(None, ge=0, le=2**31 - 1, description="The snapshot's sampler counter.")
    kind: Literal["snapshot", "inflight"] = Field("snapshot", description="Both are served as snapshots.")
    seq_id: int = Field(..., ge=1, le=2**31 - 1, description="The client's request counter.")
    ttl_seconds: int | None = Field(None, ge=0, le=10 * 365 * 86400, description="Accepted; checkpoints are kept.")
    user_metadata: dict[str, str] | None = Field(None, description="Accepted; not used.")


class LoadWeightsIn(_In):
    model_id: str | None = Field(None, min_length=1, max_length=200, description="Load into this model (with seq_id).")
    seq_id: int | None = Field(None, ge=1, le=2**31 - 1, description="The client's request counter.")
    session_id: str | None = Field(None, min_length=1, max_length=64, description="Create a model from the "
                                   "checkpoint in this session (with model_seq_id).")
    model_seq_id: int | None = Field(None, ge=0, le=2**31 - 1, description="The new model's counter.")
    base_model: str | None = Field(None, max_length=1024, description="Must be the checkpoint's base model if given.")
    path: str = Field(..., min_length=1, max_length=512, description="A tinker:// checkpoint path.")
    optimizer: bool = Field(..., description="Also restore the optimiser's state.")
    optimizer_config: OptimizerConfigIn | None = Field(None, description="Only adamw.")
    weights_access_token: str | None = Field(None, max_length=4096, description="Not supported (refused if set).")
    user_metadata: dict[str, Any] | None = Field(None, description="Accepted; not used.")


class CreateSamplerIn(_In):
    session_id: str = Field(..., min_length=1, max_length=64, description="The session.")
    sampling_session_seq_id: int = Field(..., ge=0, le=2**31 - 1, description="The client's sampler counter.")
    base_model: str | None = Field(None, max_length=1024, description="Sample a served base model …")
    model_path: str | None = Field(None, max_length=512, description="… or saved weights (tinker:// path).")


class ChunkIn(_In):
    type: Literal["encoded_text"] = Field("encoded_text", description="Only token chunks are served.")
    tokens: list[int] = Field(..., max_length=MAX_PROMPT, description="Token ids.")


class ModelInputIn(_In):
    chunks: list[ChunkIn] = Field(..., min_length=1, max_length=1024, description="The prompt's chunks.")


class SamplingParamsIn(_In):
    max_tokens: int | None = Field(None, ge=1, le=65_536, description="Tokens to generate at most (default 256, "
                                   "or what the model's context leaves after the prompt); prompt + max_tokens must "
                                   "fit in the context.")
    seed: int | None = Field(None, ge=0, le=2**63 - 1, description="Seeds the draws.")
    stop: str | list[str] | list[int] | None = Field(None, description="Stop tokens (ids) or stop strings (any "
                                                     "length; the completion keeps the token that completes one); "
                                                     "None: the model's end-of-sequence tokens.")
    temperature: float = Field(1.0, ge=0, le=100, allow_inf_nan=False, description="0 = greedy.")
    top_k: int = Field(-1, description="Only -1 (no top-k cut) is served.")
    top_p: float = Field(1.0, gt=0, le=1, allow_inf_nan=False, description="Nucleus sampling.")


class SampleIn(_In):
    sampling_session_id: str | None = Field(None, max_length=200, description="The sampler (required here).")
    seq_id: int = Field(..., ge=0, le=2**31 - 1, description="The client's request counter for this sampler.")
    num_samples: int = Field(1, ge=1, le=256, description="Completions of the prompt.")
    prompt: ModelInputIn = Field(..., description="The prompt's tokens.")
    sampling_params: SamplingParamsIn = Field(..., description="How to sample.")
    prompt_logprobs: bool | None = Field(None, description="Also return the prompt tokens' log-probs.")
    topk_prompt_logprobs: int = Field(0, ge=0, le=0, description="Not served (0 only).")
    topk_sample_logprobs: int = Field(0, ge=0, le=0, description="Not served (0 only).")
    target_prompt_logprobs: Any = Field(None, description="Not served (must be absent).")
    prompt_alt_tokens_k: int = Field(0, ge=0, le=0, description="Not served (0 only).")
    prompt_logprobs_last_n: int | None = Field(None, description="Not served (must be absent).")
    base_model: str | None = Field(None, max_length=1024, description="Ignored: the sampler says which model.")
    model_path: str | None = Field(None, max_length=512, description="Ignored: the sampler says which weights.")


class RetrieveIn(_In):
    request_id: str = Field(..., min_length=1, max_length=64, description="The future's id.")
    allow_metadata_only: bool = Field(False, description="Ignored: results are always sent whole.")
