"""Loading a job's models: the policy (full, or LoRA adapters on its base), the frozen reference (a
second copy, or for LoRA the policy's own base under ``disable_adapter()``), placed on the run's device.
Shared by the trainer (trainer.loop) and the rollout producer (trainer.producer)."""
from __future__ import annotations

from pathlib import Path

import torch

from ..config import JobSpec
from ..distributed import Dist
from .attention import gqa_in_kernel
from .embedding import grad_in_place
from .linear import grad_in_place as linear_grad_in_place
from .mlp import fused_swiglu
from .norm import fused_rms_norm
from .rope import fused_rope


def load_models(spec: JobSpec, model_dir: Path, resume_from: Path | None, dist: Dist,
                 reference: bool = True):
    """(policy, frozen reference or None, tokenizer). The reference is the job's starting model, never
    a later checkpoint; with LoRA, checkpoints hold the adapter only."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = getattr(torch, spec.model.dtype)
    tok = AutoTokenizer.from_pretrained(resume_from or model_dir)
    lora = spec.model.lora
    if lora is None:
        policy = gqa_in_kernel(AutoModelForCausalLM.from_pretrained(resume_from or model_dir, dtype=dtype))
    else:
        import peft  # optional dependency: only LoRA jobs need it

        base = gqa_in_kernel(AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype))
        if resume_from is not None:
            policy = peft.PeftModel.from_pretrained(base, resume_from, is_trainable=True)
        else:
            policy = peft.get_peft_model(base, peft.LoraConfig(
                r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=lora.target_modules,
                task_type="CAUSAL_LM"))
    policy = policy.to(dist.device)
    if not (spec.train.fsdp and dist.world > 1):
        grads_in_place(policy)
    if spec.model.disable_dropout:
        disable_dropout(policy)
    if spec.train.gradient_checkpointing:
        policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ac, ref = spec.algo, None
    if reference and (ac.kl_coef > 0 or spec.dpo is not None or (spec.ppo is not None and spec.ppo.kl_reward_coef > 0)):
        if lora is not None:  # the starting model is the base under the adapters: no second copy
            ref = AdapterOff(policy)
        else:
            ref = gqa_in_kernel(AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)).to(dist.device).eval()
            ref.requires_grad_(False)
    return policy, ref, tok


def grads_in_place(model: torch.nn.Module) -> None:
    """CPU training: the input embedding's and the linear layers' gradients added into ``.grad``, no weight-sized
    temporaries (trainer/models/embedding.py, linear.py); RMSNorm and the rotary embedding with their backward
    written out (norm.py, rope.py), the MLP's activation in one pass each way (mlp.py). Not for sharded (FSDP)
    models."""
    grad_in_place(model)  # module globals, looked up per call: bench/update.py's peers replace them
    linear_grad_in_place(model)
    fused_rms_norm(model)
    fused_rope(model)
    fused_swiglu(model)


def disable_dropout(model: torch.nn.Module) -> torch.nn.Module:
    """Every dropout of ``model`` off, in train mode too: ``nn.Dropout`` modules (LoRA's included) get p = 0,
    and so do the float ``*dropout`` rates attention layers read at call time (e.g. ``attention_dropout``)."""
    for mod in model.modules():
        if isinstance(mod, torch.nn.Dropout):
            mod.p = 0.0
        for name, value in vars(mod).items():
            if name.endswith("dropout") and isinstance(value, float) and value > 0:
                setattr(mod, name, 0.0)
    return model


class AdapterOff:
    """A LoRA policy seen with its adapters disabled: the frozen starting model, sharing the policy's
    base weights instead of holding a second full copy. Calls run under ``disable_adapter()`` and
    without gradients; everything else reads through to the policy."""

    def __init__(self, policy):
        self.policy = policy

    def __call__(self, *args, **kwargs):
        with self.policy.disable_adapter(), torch.no_grad():
            return self.policy(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.policy, name)
