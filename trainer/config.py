"""The job spec: typed pydantic models that are also the HTTP schema (service/ imports them).

Each component owns a small config; :class:`JobSpec` only composes them. Bounds are validated here
so that a bad spec is a 422 naming the field, before anything is queued.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Iterator, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator, model_validator

from verifiers.spec import VerifierSpec  # one definition: jobs and `multi` sub-verifiers name verifiers alike

__all__ = ["JobSpec", "VerifierSpec", "Reference"]



INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class _Strict(BaseModel):
    # Every block: unknown keys, NaN/Infinity and integers beyond 64 bits are refused here, so a spec the
    # API accepts is one the worker can store and run (torch seeds, database columns, JSON round trips).
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @field_validator("*")
    @classmethod
    def _int64(cls, value: Any) -> Any:
        if type(value) is int and not INT64_MIN <= value <= INT64_MAX:
            raise ValueError("integers must fit in a signed 64-bit integer")
        return value


class LoraConfig(_Strict):
    r: int = Field(8, ge=1, le=1024, description="Adapter rank.")
    alpha: float = Field(16.0, gt=0.0, description="Scaling: the adapter's update is multiplied by alpha / r.")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="Dropout on the adapters' input.")
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"], min_length=1, max_length=64,
        description="Module names (as in the model) that get adapters.")


class ModelConfig(_Strict):
    path: str = Field(
        "builtin:tiny-arith",
        description="`builtin:tiny-arith` (bundled, no download), the name of a model in the model cache "
        "(`rlvr models pull`), a Hugging Face Hub id (`Qwen/Qwen2.5-0.5B-Instruct`: the HF cache, downloaded if "
        "allowed), a finished job's model id (`ft:…`, `GET /v1/models`) or, where server paths are allowed, an HF "
        "checkpoint directory.",
        min_length=1,
        max_length=1024,
    )
    dtype: Literal["float32", "bfloat16", "float16", "float64"] = Field(
        "float32", description="Weights' dtype. float64 is for exactness checks (invariance tests compare "
        "updates to within float64 round-off, whatever the CPU's kernels); it is slow.")
    lora: LoraConfig | None = Field(None, description="Train LoRA adapters (peft) instead of all weights.")
    disable_dropout: bool = Field(True, description="Set every dropout in the policy, the reference and a critic "
                                  "(LoRA's too) to 0, as TRL does: with dropout the recomputed log-probs are noise "
                                  "in the ratio, the KL and the importance weights. SmolLM2, Llama and Qwen have "
                                  "none; GPT-2-style models (0.1) and LoRA dropout do.")


class FieldMap(_Strict):
    """Which columns of a dataset file hold the prompt, the reference and the id."""

    prompt: str = Field("prompt", min_length=1, max_length=256, description="Column with the question (a string "
                        "or chat messages).")
    reference: str | list[str] = Field(
        "reference", description="Column passed to the verifiers as the reference; a list of columns passes "
        "a dict of them (e.g. tests and entry point for the code verifier).")
    id: str | None = Field(None, max_length=256, description="Column with a stable row id (default: a hash of "
                           "the prompt).")


class DataConfig(_Strict):
    dataset: str = Field(
        "builtin:arithmetic",
        description="A built-in task (`builtin:arithmetic`, `builtin:gsm_symbolic`, `builtin:code_functions`, "
        "… — GET /v1/datasets lists them), an uploaded file id (`file-…`), or a dataset file: JSONL, "
        "parquet, arrow or CSV, read with Hugging Face `datasets` (`data.fields` maps its columns).",
        min_length=1,
        max_length=1024,
    )
    eval_dataset: str | None = Field(None, max_length=1024, description="Held-out set: a built-in task (its "
                                     "held-out split, e.g. `builtin:humaneval`) or a file; default: a disjoint "
                                     "split of `dataset`.")
    eval_size: int = Field(200, ge=1, le=100_000, description="Held-out problems scored at every eval.")
    train_size: int | None = Field(None, ge=1, le=1_000_000, description="At most this many training problems "
                                   "(procedural tasks generate this many; large files stop reading there).")
    seed: int = Field(0, ge=0, le=2**31 - 1, description="Seeds procedural generation and the train/held-out "
                      "split (the training order follows train.seed).")
    params: dict[str, Any] = Field(default_factory=dict, description="A built-in task's own knobs, e.g. "
                                   "difficulty (`{min_terms: 2, max_terms: 3}` for basic_arithmetic).")
    fields: FieldMap = Field(default_factory=FieldMap, description="Column mapping for dataset files.")
    system_prompt: str | None = Field(None, max_length=8192, description="A system turn before every question.")
    few_shot: int = Field(0, ge=0, le=16, description="Worked examples (from the TRAIN split, the same for "
                          "every prompt) shown as chat turns before each question.")
    instruction: str | None = Field(None, max_length=2048, description="Answer-format instruction appended to "
                                    "each question; default: the task's own (e.g. `Put your final answer in "
                                    "\\boxed{}.`), none for files.")

# stop strings, at every front door (jobs, Tinker sample): each live row checks each string at every step
MAX_STOP_STRINGS, MAX_STOP_CHARS = 8, 64
# completions one step, or one evaluation, may sample (each up to rollout.max_new_tokens): an evaluation
# costs like a step, so both have the same bound
MAX_COMPLETIONS = 65_536


class RolloutConfig(_Strict):
    engine: Literal["hf", "hf-generate", "vllm", "auto"] = Field(
        "hf", description="hf: batched KV-cache sampler; vllm: offline vLLM in the worker (rlvr[vllm]); "
        "auto: vLLM when the job runs on a GPU, vLLM is installed and the job is one vLLM can sample for (not "
        "float64, FSDP or world_size > 1 yet), else hf; hf-generate: transformers generate (reference).")
    group_size: int = Field(8, ge=2, le=256, description="Completions sampled per prompt (G).")
    max_new_tokens: int = Field(16, ge=1, le=32_768, description="Completion length cap (a completion without "
                                "an end-of-turn token by then is truncated: completion/truncated_frac).")
    temperature: float = Field(1.0, gt=0.0, le=10.0, description="Sampling temperature (log-probs are trained "
                                "under the same temperature).")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling (1 = off). Below 1 the samples come "
                         "from the nucleus renormalised while the loss treats them as the policy's own, uncorrected: "
                         "0.044 nats per token off-policy at 0.95 on SmolLM2-135M (bench/mismatch.py).")
    stop: list[Annotated[str, StringConstraints(min_length=1, max_length=MAX_STOP_CHARS)]] = Field(
        default_factory=list, max_length=MAX_STOP_STRINGS,
        description="Strings that end a completion (vLLM's `stop`), in "
        "training and evaluation: a completion ends at the token that completes one and keeps it (the "
        "verifier reads, and the trainer scores, the same text). E.g. [\"\\n```\\n\"] ends a code answer "
        "at its closing fence instead of sampling an explanation nobody scores.")
    gpu_memory_utilization: float = Field(0.3, gt=0.0, le=0.95, description="vLLM: the share of the GPU its "
                                          "engine may take (the trainer's model lives beside it).")
    max_model_len: int | None = Field(None, ge=16, le=1_048_576, description="vLLM: longest prompt + completion "
                                      "(default: the model's).")
    max_staleness: int = Field(0, ge=0, le=8, description="Asynchronous rollouts: a producer process samples "
                               "and scores the next groups while the trainer updates, with policies at most this "
                               "many versions old (older batches are dropped, counted); the loss corrects the "
                               "lag with capped importance weights. 0 = synchronous (exact resume).")
    producer_threads: int = Field(1, ge=1, le=512, description="torch threads of the rollout producer process "
                                  "(max_staleness > 0); the trainer keeps train.threads.")
    producer_batches: int | None = Field(None, ge=1, le=8, description="Asynchronous rollouts: training batches "
                                         "the producer samples in ONE engine call (a bigger decode batch costs less "
                                         "per row). At most max_staleness; default (max_staleness + 1) // 2, the most "
                                         "that keeps the producer busy while every batch stays within max_staleness. "
                                         "1 with zero_variance: resample (refills draw from the same prompt stream).")
    vllm_sleep: bool = Field(True, description="vLLM: release its GPU memory (sleep) during the update, wake it "
                             "for the next rollout, where vLLM offers it — one GPU holds both.")

    def batches_per_call(self, resample: bool) -> int:
        """Batches the async producer samples per engine call (``producer_batches``, or its default)."""
        if self.producer_batches is not None:
            return self.producer_batches
        return 1 if resample else max(1, (self.max_staleness + 1) // 2)


SEQUENCE_LOSSES = ("gspo", "gmpo")  # policy losses with one value per sequence (trainer/algos.py)


class AlgoConfig(_Strict):
    """Policy-gradient knobs (GRPO and PPO): each name picks a pure function from trainer.algos."""

    advantage: Literal["grpo", "grpo_batch_std", "grpo_no_std", "rloo"] = Field(
        "grpo", description="Group baseline scaled by the group std (grpo), the batch std (grpo_batch_std), "
        "nothing (grpo_no_std, Dr. GRPO), or leave-one-out baseline (rloo). Ignored by PPO (GAE).",
    )
    policy_loss: Literal["clipped", "cispo", "gspo", "gspo_token", "gmpo"] = Field(
        "clipped", description="clipped: PPO's clipped surrogate per token (DAPO's clip-higher with clip_eps_high > "
        "low); cispo: the clipped ratio as a detached weight on log pi, no token's gradient dropped (MiniMax-M1); "
        "gspo: one length-normalised ratio per sequence, clipped as a whole (Qwen; clip ranges ~3e-4/4e-4); "
        "gspo_token: GSPO's ratio value with each token's own gradient (per-token advantages work); gmpo: the "
        "geometric mean of token ratios clipped in log space (clip_eps 0.33/0.49 = the paper's e^±0.4). gspo and "
        "gmpo are per sequence: they need loss_agg seq-mean-token-mean. With one pass per batch (ppo_epochs 1, no "
        "minibatch_size, no engine mismatch) the ratio is 1 and every one of them is REINFORCE with the "
        "estimator's baseline (trainer/algos.py).")
    loss_agg: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"] = Field(
        "token-mean", description="How per-token losses become one number: mean over all tokens of the batch "
        "(DAPO), mean over sequences of each one's token mean (GRPO paper), or token sums over a constant "
        "(Dr. GRPO). Normalised by the whole minibatch, so micro-batching never changes it.")
    clip_eps_low: float = Field(0.2, ge=0.0, le=10.0, description="The ratio is clipped below at 1 - this. Acts "
                                "only in multi-pass updates (ppo_epochs > 1 or minibatch_size below the batch): "
                                "in one pass the ratio is 1, and clip_frac is reported as null.")
    clip_eps_high: float = Field(0.2, ge=0.0, le=10.0, description="The ratio is clipped above at 1 + this "
                                 "(> clip_eps_low: DAPO's clip-higher, which also needs a multi-pass update to act "
                                 "— examples/jobs/demo-math-multipass.yaml).")
    kl_coef: float = Field(0.0, ge=0.0, le=100.0, description="Weight of a KL penalty against the frozen "
                           "starting model (loaded only when > 0); where it acts: `kl_in`.")
    kl_in: Literal["loss", "reward"] = Field(
        "loss", description="loss: kl_coef × the `kl_estimator` per token is added to the loss (GRPO paper, "
        "TRL); reward: kl_coef × the sequence's summed log-ratio log(pi/ref) (k1, at the sampling policy) is "
        "subtracted from its reward before the group baseline, so the policy gradient itself carries the "
        "reverse KL's gradient. GRPO family only (PPO: ppo.kl_reward_coef, per token).")
    kl_estimator: Literal["k1", "k2", "k3"] = Field(
        "k3", description="Per-token estimator of KL(pi || ref) in the loss (kl_in: loss), and the gradient each "
        "gives there: k1 log(pi/ref) — zero in expectation, refused in the loss (use kl_in: reward); k2 "
        "0.5 log(pi/ref)^2 — the reverse KL's gradient, grad KL(pi || ref); k3 ref/pi - 1 - log(ref/pi) — an "
        "unbiased, non-negative VALUE of KL(pi || ref), but its gradient is the forward KL's, grad KL(ref || pi) "
        "(the GRPO paper's and TRL's default).")
    entropy_coef: float = Field(0.0, ge=0.0, le=10.0, description="Entropy bonus weight (0 = none).")
    overlong_mask: bool = Field(False, description="Truncated completions contribute no loss (DAPO).")
    zero_variance: Literal["keep", "drop", "resample"] = Field(
        "keep", description="Groups whose rewards are all equal: keep, drop from the update, or resample "
        "fresh prompts for them (at most `resample_rounds` extra rollouts per step).",
    )
    resample_rounds: int = Field(1, ge=0, le=16, description="Extra rollouts a step may spend refilling "
                                 "zero-variance groups (zero_variance: resample).")
    tis_cap: float | None = Field(
        None, gt=0.0, le=100.0, description="Truncated importance sampling: weight each token's policy loss "
        "by min(p_trainer / p_engine, tis_cap), correcting for an engine that samples from a slightly "
        "different distribution (vLLM: other kernels, bf16). Needs engine log-probs. None = the sampler's default: 2 "
        "for vLLM and for the async producer (an older policy), off for the hf engine (the trainer's own kernels).")
    tis_mode: Literal["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"] = Field(
        "token_truncate", description="How tis_cap corrects for sampling elsewhere: token_truncate min(r_t, cap) "
        "(TIS); token_mask r_t inside [tis_low, cap], 0 outside (MIS, icepop); sequence_truncate / sequence_mask "
        "the same with the whole completion's ratio prod_t r_t (r = p_trainer / p_engine).")
    tis_low: float | None = Field(None, gt=0.0, le=1.0, description="The mask modes' lower bound on the ratio "
                                  "(default 1 / tis_cap).")
    overlong_buffer: int | None = Field(
        None, ge=1, le=1_000_000, description="DAPO's soft overlong punishment: within this many tokens of "
        "rollout.max_new_tokens the reward falls linearly by up to overlong_penalty (all of it for a truncated "
        "completion); None = off (overlong_mask drops truncated ones instead). Start the ramp past a good "
        "answer's length (DAPO: 16k of 20k tokens): inside it right answers are punished too, and a policy can "
        "learn that short wrong answers pay best (docs/algorithms.md).")
    overlong_penalty: float = Field(1.0, ge=0.0, le=100.0, description="The soft punishment's size at the limit.")
    ppo_epochs: int = Field(1, ge=1, le=64, description="Passes over each step's batch (more than one: the "
                            "ratio moves away from 1 and clipping matters; update/approx_kl_epoch_<e> reports "
                            "each pass's drift).")
    minibatch_size: int | None = Field(None, ge=1, description="Sequences per optimiser step (global, over every "
                                       "rank); below the batch, one step's batch makes several optimiser steps.")
    micro_batch_size: int | None = Field(
        None, ge=1, description="Sequences per forward/backward (gradient accumulation); default: the minibatch."
    )
    micro_batch_tokens: int | None = Field(
        None, ge=1, description="At most this many padded tokens (rows x (prompt + completion width)) per "
        "forward/backward, forward passes without a graph included: long episodes (code repair, tools) keep "
        "their activation memory bounded (32 three-turn repair episodes of SmolLM2-135M at once held ~15 GB). "
        "Combined with micro_batch_size, the smaller wins; at least one row. Same gradient: the micro-batches "
        "are accumulated, normalised by the whole minibatch's counts. Default: no token bound.")

    def micro_rows(self, width: int) -> int | None:
        """Rows per forward/backward for sequences ``width`` tokens wide (padded prompt + completion): the
        smaller of micro_batch_size and what micro_batch_tokens allows; None = no bound."""
        by_tokens = max(1, self.micro_batch_tokens // max(1, width)) if self.micro_batch_tokens else None
        bounds = [b for b in (self.micro_batch_size, by_tokens) if b is not None]
        return min(bounds) if bounds else None

    @model_validator(mode="after")
    def _sequence_losses(self) -> "AlgoConfig":
        if self.policy_loss in SEQUENCE_LOSSES and self.loss_agg != "seq-mean-token-mean":
            raise ValueError(f"policy_loss {self.policy_loss} is one value per sequence: it needs loss_agg "
                             "seq-mean-token-mean (the paper's mean over sequences)")
        return self

    @model_validator(mode="after")
    def _kl_gradient(self) -> "AlgoConfig":
        if self.kl_coef > 0 and self.kl_in == "loss" and self.kl_estimator == "k1":
            raise ValueError("kl_estimator k1 in the loss has zero gradient in expectation (it only adds noise): "
                             "use kl_in: reward (k1 in the reward is the standard penalty), or k2 / k3 in the loss")
        return self


class PPOConfig(_Strict):
    """PPO: a value head on the policy backbone (or a separate critic model), GAE over completion tokens,
    reward at the final token."""

    gamma: float = Field(1.0, ge=0.0, le=1.0, description="Discount per token (1: the final reward counts fully "
                         "at every token).")
    lam: float = Field(1.0, ge=0.0, le=1.0, description="GAE lambda (1 = Monte-Carlo returns minus V).")
    vf_coef: float = Field(0.5, ge=0.0, le=100.0, description="Weight of the value loss.")
    value_clip: float | None = Field(0.2, gt=0.0, description="Clip value updates around the old values.")
    kl_reward_coef: float = Field(0.0, ge=0.0, le=100.0, description="Per-token KL subtracted from the reward.")
    whiten_advantages: bool = Field(True, description="Normalise GAE advantages to mean 0, std 1 over the batch.")
    value_lr: float | None = Field(None, gt=0.0, le=1.0, description="Value head lr; default: optim.lr × 10.")
    critic: str | None = Field(
        None, min_length=1, max_length=1024,
        description="A separate critic network: a model (`builtin:tiny-arith`, a pulled name, an HF "
        "directory) sharing the policy's vocabulary; its backbone plus a value head predict values, at "
        "value_lr. Default: a value head on the policy's own backbone.")


class DPOConfig(_Strict):
    """DPO against the frozen starting model. `pairs: online` samples a group per prompt, scores it with
    the verifiers and trains on (best, worst); a JSONL path trains on fixed (chosen, rejected) pairs."""

    beta: float = Field(0.1, gt=0.0, le=100.0, description="Strength of the pull toward the reference (DPO's β).")
    loss: Literal["sigmoid", "ipo"] = Field("sigmoid", description="sigmoid: DPO's logistic loss; ipo: IPO's "
                                            "squared loss (does not push margins without bound).")
    pairs: str = Field("online", min_length=1, max_length=1024,
                       description="`online`, or a JSONL of {prompt, chosen, rejected}.")


class DistillConfig(_Strict):
    """On-policy distillation (Agarwal 2024; Thinking Machines 2025): the student samples, a teacher scores
    the student's own tokens, and each token's advantage is the negative reverse KL sample
    log pi_teacher(y_t) - log pi_student(y_t) — dense, per-token credit — alone or added to the verifiers'."""

    teacher: str = Field(..., min_length=1, max_length=1024, description="The teacher: any model a job can name "
                         "(`builtin:…`, a pulled name, a Hub id, `ft:…` from an earlier job), sharing the student's "
                         "vocabulary (a 422 otherwise).")
    coef: float = Field(1.0, gt=0.0, le=100.0, description="Weight of the per-token teacher advantage.")
    verifier_weight: float = Field(0.0, ge=0.0, le=100.0, description="Weight of the verifiers' group advantage "
                                   "beside it: 0 = distillation alone, 1 = both.")


class ToolLimits(_Strict):
    """What one tool call may use (each call is one jail run: sandbox.Limits)."""

    cpu_s: float = Field(2.0, gt=0.0, le=60.0, description="CPU seconds per call (a session's replayed cells count).")
    wall_s: float = Field(4.0, gt=0.0, le=120.0, description="Wall-clock seconds per call; past it the call is a "
                          "`timeout` the model is told about.")
    memory_mb: int = Field(256, ge=16, le=4096, description="Resident memory per call.")
    output_bytes: int = Field(2048, ge=64, le=1 << 20, description="stdout + stderr per call; more is a "
                              "`tool_error` (the model sees what came before the cut).")


class ToolConfig(_Strict):
    """A tool the model may call between turns. Only `python` exists: code run in our sandbox."""

    name: Literal["python"] = Field("python", description="The tool: `python` runs the call's code in a jail.")
    session: Literal["per_episode", "per_call"] = Field(
        "per_episode", description="per_episode: variables, functions and imports of earlier calls exist in later "
        "ones (sandbox/session.py); per_call: every call starts from a fresh interpreter.")
    limits: ToolLimits = Field(default_factory=ToolLimits, description="Per-call limits.")


class OutcomePolicy(_Strict):
    """What a turn's typed outcome does to training."""

    parse_error: Literal["mask_turn", "keep"] = Field(
        "mask_turn", description="A tool call the parser cannot read: mask_turn = that turn carries no loss (the "
        "model is still told); keep = trained like any turn (its reward decides).")
    void_turn: Literal["drop", "keep"] = Field(
        "drop", description="An episode that ended with neither a tool call nor a final answer (SimpleTIR's void "
        "turn): drop = left out of its group's statistics and the loss; keep = scored as it stands.")
    infra_error: Literal["exclude_and_retry"] = Field(
        "exclude_and_retry", description="The sandbox itself failed: the call is retried once, then the episode is "
        "left out of its group's statistics and the loss (never scored 0).")


class PythonEnv(_Strict):
    """The model calls the `python` tool (episodes.tools) between turns; its answer ends the episode."""

    type: Literal["python"] = Field("python", description="The python tool.")


class CodeRepairEnv(_Strict):
    """Code repair from test feedback (trainer/envs/repair.py): each answer is run against the problem's
    public tests in the jail; a failing one's output is shown and the model revises, up to max_turns. The
    reward is the job's verifiers on the final answer alone (the hidden tests of builtin:code_repair)."""

    type: Literal["code_repair"] = Field("code_repair", description="Code repair from test feedback.")
    timeout_s: float = Field(4.0, gt=0.0, le=60.0, description="Wall clock of one public-test run in the jail.")
    memory_mb: int = Field(256, ge=16, le=4096, description="Memory of one public-test run.")


class HttpEnv(_Strict):
    """An environment server over HTTP with OpenEnv's protocol (trainer/envs/http.py): a session per episode
    (reset, step, state, close), the model's tool calls become its actions, its observations come back as
    tokens with loss 0. The model never reaches it: we sample, parse, call."""

    type: Literal["http"] = Field("http", description="An environment server over HTTP (OpenEnv's protocol).")
    url: str = Field(min_length=8, max_length=2048, pattern=r"^https?://[^\s]+$", description="The server's base "
                     "URL (http or https; the operator's allow-list decides where it may point: RLVR_ENV_ALLOW).")
    action_field: str = Field("message", pattern=r"^[A-Za-z_]\w{0,63}$", description="tags format: the call's text "
                              "is sent as {action_field: text}; chat format: the call's arguments are the action.")
    observation_field: str | None = Field(None, pattern=r"^[A-Za-z_]\w{0,63}$", description="The observation "
                                          "field shown to the model (default: every field but done/reward/metadata, "
                                          "as JSON).")
    timeout_s: float = Field(10.0, gt=0.0, le=120.0, description="Every call (connect, reset, step, state, close, "
                             "verify) has this long; past it the episode is an infra_error.")
    max_body_bytes: int = Field(1 << 20, ge=1024, le=16 << 20, description="Largest reply accepted; a larger one "
                                "is an infra_error.")
    max_concurrency: int = Field(8, ge=1, le=256, description="Calls in flight at once for this job (the "
                                 "operator's per-tenant cap RLVR_ENV_MAX_SESSIONS bounds it too). The server must "
                                 "accept a session per episode of a step (prompts_per_step × group_size).")
    reward: Literal["env", "verifiers"] = Field(
        "env", description="env: the episode's reward is the sum of the rewards step returned, or verify's when "
        "verify is on; verifiers: the job's verifiers judge what the model wrote.")
    verify: bool = Field(False, description="After the episode, the control plane POSTs the transcript to "
                         "{url}/verify and takes its reward (never a tool the model can call).")
    show_reset: bool = Field(True, description="The reset's observation (an environment's task, board or "
                             "greeting) is added to the prompt's last user message, cut to max_observation_tokens, "
                             "before the model's first turn; false: the prompt alone. An empty observation adds "
                             "nothing.")


EnvConfig = Annotated[PythonEnv | CodeRepairEnv | HttpEnv, Field(discriminator="type")]


class EpisodesConfig(_Strict):
    """Multi-turn episodes: the model calls Python between turns (trainer/episodes.py). A group is G episodes of
    one prompt; the model's tokens carry the loss, tool output never does; the verifiers judge what the model
    wrote (observations left out)."""

    tools: list[ToolConfig] = Field(default_factory=lambda: [ToolConfig()], min_length=1, max_length=1,
                                    description="The tools (one: python).")
    format: Literal["tags", "chat"] = Field(
        "tags", description="tags: the model writes `<code>…</code>` in its reply and `<output>…</output>` is "
        "appended (small models, no tool template); chat: the chat template's own tool calls (Qwen/Hermes "
        "`<tool_call>` JSON) and tool messages.")
    call_open: str = Field("<code>", min_length=1, max_length=32, description="tags: what opens a call.")
    call_close: str = Field("</code>", min_length=1, max_length=32, description="tags: what closes a call "
                            "(generation stops there and the code runs).")
    observation: str = Field("<output>\n{output}</output>\n", min_length=8, max_length=256,
                             description="tags: how the tool's output is shown ({output} is replaced).")
    answer_marker: str = Field("\\boxed{", min_length=1, max_length=32, description="What a final answer "
                               "contains: a last turn without it and without a call is a void turn.")
    max_turns: int = Field(4, ge=1, le=32, description="Model turns per episode.")
    max_tool_calls: int = Field(4, ge=0, le=32, description="Tool calls per episode (a call past it ends the episode).")
    max_observation_tokens: int = Field(96, ge=8, le=4096, description="Tokens of one observation (longer output "
                                        "is cut, with a marker).")
    max_episode_tokens: int = Field(768, ge=16, le=32_768, description="Tokens after the prompt, model and "
                                    "observations together.")
    env: EnvConfig = Field(default_factory=PythonEnv, description="What answers the model between turns: the "
                           "python tool (default), code_repair (public tests of the answer), or http (an OpenEnv "
                           "server).")
    on_outcome: OutcomePolicy = Field(default_factory=OutcomePolicy, description="What each outcome does to training.")
    max_logprob_diff: float | None = Field(
        None, gt=0.0, le=10.0, description="Fail the job when the trainer's log-probs of the sampled tokens differ "
        "from the sampler's by more than this on average (nats per token): trained tokens that drifted from the "
        "sampled ones. Default: derived from the sampling dtype (8·sqrt(eps): 2.8e-3 for fp32, 0.71 for bf16).")
    eval_tools_off: bool = Field(True, description="Also evaluate held-out problems with the tool unavailable "
                                 "(single turn): did it learn to use the tool, or to do without?")
    keep_tokens: bool = Field(False, description="The stored rollouts (the few groups a step keeps for the "
                              "rollout browser) keep each episode's whole token ledger — prompt and sampled ids, "
                              "loss mask, the sampler's log-probs, each engine call's place and policy version — "
                              "so GET /v1/jobs/{id}/rollouts/export gives them as per-call records and Tinker "
                              "datums. Off by default: it costs ~10 bytes a token of the stored groups, each step.")

    @model_validator(mode="after")
    def _fits(self) -> "EpisodesConfig":
        if self.format == "tags" and "{output}" not in self.observation:
            raise ValueError("episodes.observation must contain {output}")
        if self.format == "tags" and self.call_open == self.call_close:
            raise ValueError("episodes.call_open and call_close must differ")
        if self.max_observation_tokens >= self.max_episode_tokens:
            raise ValueError("episodes.max_observation_tokens must be below max_episode_tokens")
        return self


class OptimConfig(_Strict):
    lr: float = Field(5e-4, gt=0.0, le=1.0, description="AdamW learning rate of the policy.")
    weight_decay: float = Field(0.0, ge=0.0, le=1.0, description="AdamW's decoupled weight decay.")
    max_grad_norm: float = Field(1.0, gt=0.0, description="Gradients are clipped to this global norm.")
    warmup_steps: int = Field(0, ge=0, le=1_000_000, description="Linear learning-rate warm-up over this many steps.")


class TrainConfig(_Strict):
    steps: int = Field(100, ge=1, le=1_000_000, description="Training steps (one batch of prompts each).")
    prompts_per_step: int = Field(8, ge=1, le=4096, description="Prompts per step; each gets group_size completions.")
    eval_every: int = Field(20, ge=0, description="0 = only at start and end.")
    eval_samples: int = Field(0, ge=0, le=256, description="Also sample this many completions per held-out "
                              "problem (at rollout.temperature) to report pass@1 and pass@k for k = 2, 4, … up "
                              "to it; 0 = greedy pass@1 only.")
    checkpoint_every: int = Field(0, ge=0, description="0 = only at the end.")
    seed: int = Field(0, ge=0, le=2**31 - 1, description="Seeds sampling and the training order (resumes exactly).")
    threads: int | None = Field(None, ge=1, le=512, description="torch CPU threads; default: torch's.")
    world_size: int = Field(
        1, ge=1, le=1024, description="Data-parallel processes for this job (torch.distributed): the worker "
        "starts the extra ranks itself, at most one per device it has (GPUs, else CPU cores), and the server "
        "accepts at most RLVR_MAX_WORLD_SIZE; under torchrun the launcher's WORLD_SIZE wins.",
    )
    placement: Literal["auto", "pack", "spread", "strict_pack", "strict_spread"] = Field(
        "auto", description="Where the ranks run (docs/cluster.md). auto: subprocesses of the worker when they fit "
        "on it (one device each), else — on a server with RLVR_RAY_ADDRESS — a Ray placement group, one bundle "
        "per rank, packed onto as few nodes as hold them; pack, spread, strict_pack, strict_spread: always a Ray "
        "placement group with that strategy (spread: each rank on another node where the cluster has room).")
    producer: Literal["local", "ray"] = Field(
        "local", description="rollout.max_staleness > 0: the rollout producer is a process beside the trainer "
        "(local), or a Ray actor in the job's placement group with a GPU or producer_threads CPUs of its own, on "
        "another node when the placement spreads (ray); its weights arrive through Ray's object store.")
    precision: Literal["fp32", "bf16"] = Field("fp32", description="bf16 = autocast forwards, fp32 weights.")
    deterministic: bool = Field(True, description="torch's deterministic algorithms (and cuBLAS's fixed "
                                "workspace on a GPU): the same seed, machine and thread count give the same "
                                "metrics bit for bit (without it a 135M model's runs part at the third step, in "
                                "the 7th digit). Off: a little faster where an op has a faster non-deterministic "
                                "kernel (bench/RESULTS.md).")
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="auto: this rank's GPU (cuda:LOCAL_RANK among CUDA_VISIBLE_DEVICES) when CUDA is "
        "present, else the CPU; cuda: fail if there is none.")
    fsdp: bool = Field(False, description="With world_size > 1: shard parameters, gradients and optimiser state "
                       "across the ranks (PyTorch FSDP2), for models past one device's memory. Same parameters "
                       "as one process on the same global batch.")
    gradient_checkpointing: bool = Field(False, description="Recompute activations in the backward pass: less "
                                         "memory, about a third more compute.")
    keep_last: int | None = Field(None, ge=1, le=1_000_000, description="Keep only the newest N checkpoints "
                                  "(plus the final one and the one with the best held-out accuracy); default: all.")
    report_to: list[Literal["tensorboard", "wandb", "mlflow"]] = Field(
        default_factory=list, max_length=3, description="Experiment trackers that also get every step's metrics "
        "and evals, written into the job's run dir (trainer.trackers): `tensorboard` (event files in tb/), "
        "`wandb` (an offline run in wandb/: `wandb sync` uploads it later), `mlflow` (a file store in "
        "mlruns/). Optional packages: `pip install 'rlvr[trackers]'`; a tracker whose package is missing is "
        "a 422 at submission.")

    @field_validator("report_to")
    @classmethod
    def _once_each(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError("each tracker at most once")
        return v


class JobSpec(_Strict):
    """A training job. POST it to /v1/jobs, or run it locally with `rlvr train job.yaml`."""

    name: str = Field("job", min_length=1, max_length=200, description="A label for people (not unique).")
    algorithm: Literal["grpo", "ppo", "dpo"] = Field("grpo", description="grpo: group baselines (the `algo` "
                                                     "advantage); ppo: a value head or critic with GAE; dpo: "
                                                     "preference pairs (online from scored groups, or a file).")
    model: ModelConfig = Field(default_factory=ModelConfig, description="The policy to train (and LoRA).")
    data: DataConfig = Field(default_factory=DataConfig, description="Training and held-out problems.")
    verifiers: list[VerifierSpec] = Field(
        default_factory=lambda: [VerifierSpec(name="math", config={"allow_unevaluated": False})], min_length=1,
        max_length=32, description="What scores completions: the reward is their weighted sum; the first one's "
        "`correct` verdict is the accuracy reported. Default: math, strict (an answer that restates the question, "
        "e.g. `\\boxed{3+4}` for 3+4, earns nothing).")
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="How completions are sampled.")
    algo: AlgoConfig = Field(default_factory=AlgoConfig, description="Advantages, losses, KL, clipping.")
    ppo: PPOConfig | None = Field(None, description="Only with algorithm: ppo (defaults filled in).")
    dpo: DPOConfig | None = Field(None, description="Only with algorithm: dpo (defaults filled in).")
    distill: DistillConfig | None = Field(None, description="On-policy distillation from a teacher (grpo).")
    episodes: EpisodesConfig | None = Field(None, description="Multi-turn episodes with a Python tool (grpo); "
                                            "absent: single-turn completions.")
    optim: OptimConfig = Field(default_factory=OptimConfig, description="The optimiser.")
    train: TrainConfig = Field(default_factory=TrainConfig, description="Steps, batch, evals, checkpoints, ranks.")
    metadata: dict[str, str] = Field(default_factory=dict, max_length=64, description="Your key/value labels "
                                     "(GET /v1/jobs?metadata=key=value filters on them).")

    @field_validator("name")
    @classmethod
    def _printable_name(cls, v: str) -> str:
        if not v.isprintable():
            raise ValueError("name must not contain control characters")
        return v

    @model_validator(mode="after")
    def _bounds(self) -> "JobSpec":
        per_step = self.train.prompts_per_step * self.rollout.group_size
        if per_step > MAX_COMPLETIONS:
            raise ValueError(f"prompts_per_step × group_size = {per_step} exceeds {MAX_COMPLETIONS} "
                             f"completions per step")
        samples = self.train.eval_samples if self.train.eval_samples >= 2 else 0  # 1 samples nothing extra
        per_eval = self.data.eval_size * (1 + samples)
        if per_eval > MAX_COMPLETIONS:
            raise ValueError(f"data.eval_size × (1 greedy + train.eval_samples) = {per_eval} completions per "
                             f"evaluation exceeds {MAX_COMPLETIONS}, the bound of a step "
                             "(an evaluation costs like one)")
        # each algorithm owns one optional block: fill its defaults, refuse the others' blocks
        for name, cls in (("ppo", PPOConfig), ("dpo", DPOConfig)):
            if self.algorithm == name and getattr(self, name) is None:
                setattr(self, name, cls())
            elif self.algorithm != name and getattr(self, name) is not None:
                raise ValueError(f"`{name}` settings given but algorithm is {self.algorithm!r}")
        if self.rollout.max_staleness and (self.algorithm == "dpo" or self.train.world_size > 1 or self.train.fsdp
                                           or self.rollout.engine == "hf-generate"):
            raise ValueError("rollout.max_staleness > 0 runs one producer beside one trainer: it needs grpo or ppo, "
                             "world_size 1, no fsdp, and an engine that returns log-probs (hf, vllm)")
        if self.train.producer == "ray" and not self.rollout.max_staleness:
            raise ValueError("train.producer: ray places the asynchronous rollout producer: it needs "
                             "rollout.max_staleness > 0")
        m = self.rollout.producer_batches
        if m is not None and m > 1 and (m > self.rollout.max_staleness or self.algo.zero_variance == "resample"):
            raise ValueError(f"rollout.producer_batches = {m} needs max_staleness >= {m} (a batch sampled with the "
                             "others of its call is consumed up to that many versions later) and zero_variance "
                             "keep or drop (resampled refills would interleave the batches' prompts)")
        if self.distill is not None and self.algorithm != "grpo":
            raise ValueError("distill adds per-token teacher advantages to the group estimators: algorithm grpo")
        if self.algorithm == "ppo" and self.algo.kl_coef > 0 and self.algo.kl_in == "reward":
            raise ValueError("algo.kl_in: reward is for the group baselines; PPO puts a per-token KL in its reward "
                             "with ppo.kl_reward_coef (algo.kl_coef with kl_in: loss adds one to the loss)")
        if self.train.fsdp and (self.algorithm == "ppo" or self.model.lora is not None):
            raise ValueError("train.fsdp shards the policy alone: it is for grpo and dpo without LoRA (a value head, "
                             "a critic or adapters beside a sharded model are not supported yet)")
        repair = self.data.dataset in ("builtin:code_repair", "builtin:code_repair_tiny")
        if repair and (self.episodes is None or self.episodes.env.type != "code_repair"):
            raise ValueError(f"data.dataset {self.data.dataset} is played as code-repair episodes: set "
                             "episodes.env.type: code_repair")
        if self.episodes is not None:
            why = self.episode_blockers()
            if why:
                raise ValueError("episodes: " + "; ".join(why))
        if self.rollout.engine == "vllm" and self.vllm_blockers():
            raise ValueError("rollout.engine vllm: " + "; ".join(self.vllm_blockers()))
        if self.train.prompts_per_step % self.train.world_size:
            raise ValueError(f"train.prompts_per_step ({self.train.prompts_per_step}) must be a multiple of "
                             f"train.world_size ({self.train.world_size})")
        return self

    def episode_blockers(self) -> list[str]:
        """Why this spec cannot run as episodes (empty: it can)."""
        out = []
        if self.algorithm != "grpo":
            out.append(f"algorithm {self.algorithm!r}: episodes are trained with the group estimators (grpo)")
        if self.distill is not None:
            out.append("distill: a teacher scoring tool observations is not defined")
        if self.rollout.engine == "hf-generate":
            out.append("rollout.engine hf-generate returns no log-probs and samples text, not token ids")
        if self.algo.kl_coef > 0 and self.algo.kl_in == "reward":
            out.append("algo.kl_in reward: use kl_in loss (a per-token KL on the model's tokens)")
        if self.algo.overlong_buffer:
            out.append("algo.overlong_buffer counts one completion's tokens; an episode's budget is "
                       "episodes.max_episode_tokens")
        return out

    def vllm_blockers(self, world: int | None = None) -> list[str]:
        """Why vLLM cannot sample for this job yet (empty: it can): what `engine: vllm` is refused for
        and `engine: auto` falls back to hf for. ``world``: the job's ranks (default train.world_size;
        under torchrun the launcher's)."""
        world = self.train.world_size if world is None else world
        out = []
        if self.model.dtype == "float64":
            out.append("model.dtype float64 is not a dtype vLLM runs (float32, bfloat16, float16)")
        if self.train.fsdp:  # full weights are gathered for the push (trainer.checkpoint.merged_weights),
            out.append("train.fsdp with vLLM has not run on GPUs yet")  # but no GPU run has shown it works
        if world > 1:  # each rank's vLLM is placed on its own GPU (device_ids), never yet run on GPUs
            out.append(f"world_size {world}: one vLLM per rank has not run on GPUs yet "
                       "(use world_size 1, or engine hf)")
        return out

    def references(self) -> Iterator[Reference]:
        """Every model, dataset and file this spec names, with where it sits in the spec: what a front
        door checks at submission (service/jobs/specs.py) and what a worker resolves before training."""
        yield Reference("model", ("model", "path"), self.model.path)
        if self.ppo is not None and self.ppo.critic:
            yield Reference("model", ("ppo", "critic"), self.ppo.critic)
        if self.distill is not None:
            yield Reference("model", ("distill", "teacher"), self.distill.teacher)
        yield Reference("dataset", ("data", "dataset"), self.data.dataset)
        if self.data.eval_dataset is not None:
            yield Reference("dataset", ("data", "eval_dataset"), self.data.eval_dataset)
        if self.dpo is not None and self.dpo.pairs != "online":
            yield Reference("pairs", ("dpo", "pairs"), self.dpo.pairs)


@dataclass(frozen=True)
class Reference:
    kind: Literal["model", "dataset", "pairs"]
    loc: tuple[str, ...]   # field location in the spec, e.g. ("data", "eval_dataset")
    value: str
