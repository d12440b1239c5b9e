"""The job spec: typed pydantic models that are also the HTTP schema (service/ imports them).

Each component owns a small config; :class:`JobSpec` only composes them. Bounds are validated here
so that a bad spec is a 422 naming the field, before anything is queued.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

BUILTIN_MODEL_PREFIX = "builtin:"
BUILTIN_DATASET_PREFIX = "builtin:"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelConfig(_Strict):
    path: str = Field(
        "builtin:tiny-arith",
        description="An HF checkpoint directory, or `builtin:tiny-arith` (built locally, no download).",
        min_length=1,
        max_length=1024,
    )
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"


class DataConfig(_Strict):
    dataset: str = Field(
        "builtin:arithmetic",
        description="`builtin:arithmetic`, or a JSONL file whose lines hold `prompt` (string or chat "
        "messages) and `reference` (whatever the verifiers expect).",
        min_length=1,
        max_length=1024,
    )
    eval_dataset: str | None = Field(None, description="Held-out JSONL; default: a disjoint split.")
    eval_size: int = Field(200, ge=1, le=100_000)
    seed: int = 0


class VerifierSpec(_Strict):
    name: str = Field(..., min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:\-]+$")
    weight: float = Field(1.0, ge=-100, le=100)
    config: dict[str, Any] = Field(default_factory=dict)


class RolloutConfig(_Strict):
    engine: Literal["hf", "auto"] = "hf"
    group_size: int = Field(8, ge=2, le=256, description="Completions sampled per prompt (G).")
    max_new_tokens: int = Field(16, ge=1, le=32_768)
    temperature: float = Field(1.0, gt=0.0, le=10.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)


class AlgoConfig(_Strict):
    """GRPO knobs: each name picks a pure function from trainer.algos registries."""

    advantage: Literal["grpo", "grpo_no_std"] = "grpo"
    policy_loss: Literal["clipped"] = "clipped"
    loss_agg: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"] = "token-mean"
    clip_eps_low: float = Field(0.2, ge=0.0, le=10.0)
    clip_eps_high: float = Field(0.2, ge=0.0, le=10.0)
    kl_coef: float = Field(0.0, ge=0.0, le=100.0, description="0 = no reference model loaded.")
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    ppo_epochs: int = Field(1, ge=1, le=64)
    minibatch_size: int | None = Field(None, ge=1, description="Sequences per optimiser step.")


class OptimConfig(_Strict):
    lr: float = Field(5e-4, gt=0.0, le=1.0)
    weight_decay: float = Field(0.0, ge=0.0, le=1.0)
    max_grad_norm: float = Field(1.0, gt=0.0)
    warmup_steps: int = Field(0, ge=0)


class TrainConfig(_Strict):
    steps: int = Field(100, ge=1, le=1_000_000)
    prompts_per_step: int = Field(8, ge=1, le=4096)
    eval_every: int = Field(20, ge=0, description="0 = only at start and end.")
    checkpoint_every: int = Field(0, ge=0, description="0 = only at the end.")
    seed: int = 0
    threads: int | None = Field(None, ge=1, le=512, description="torch CPU threads; default: torch's.")


class JobSpec(_Strict):
    """A training job. POST it to /v1/jobs, or run it locally with `rlvr train job.yaml`."""

    name: str = Field("job", min_length=1, max_length=200)
    algorithm: Literal["grpo"] = "grpo"
    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    verifiers: list[VerifierSpec] = Field(
        default_factory=lambda: [VerifierSpec(name="math")], min_length=1, max_length=32
    )
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    algo: AlgoConfig = Field(default_factory=AlgoConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    metadata: dict[str, str] = Field(default_factory=dict, max_length=64)

    @field_validator("name")
    @classmethod
    def _printable_name(cls, v: str) -> str:
        if not v.isprintable():
            raise ValueError("name must not contain control characters")
        return v

    @model_validator(mode="after")
    def _bounds(self) -> "JobSpec":
        per_step = self.train.prompts_per_step * self.rollout.group_size
        if per_step > 65_536:
            raise ValueError(f"prompts_per_step × group_size = {per_step} exceeds 65536 completions per step")
        return self
