"""Training primitives on one model: forward, forward_backward with a named per-datum loss, an Adam step,
save / load, and sampling with per-token log-probs — what a user's own training loop drives over HTTP
(service/tinker serves them in Tinker's protocol) or in-process (bench/primitives.py, the tests).

A *datum* is one sequence in Tinker's layout: input tokens (N,) and, per position, the target token it
predicts plus the loss inputs (weights, sampling log-probs, advantages), each (N,). Position i of the
input predicts ``target_tokens[i]``; targets need not be the next input token, so this forward scores
every input position against its target (``batch.forward`` scores a rollout's completion tokens, which
are always the next tokens). Gradients accumulate over forward_backward calls until ``optim_step``,
which applies AdamW with that step's hyper-parameters, then clears them.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch

from . import algos, checkpoint
from .context import clip_grads
from .datum_losses import datum_loss
from .rollout import SamplingParams

MAX_FORWARD_TOKENS = 4096  # padded tokens per forward: bounds the (B, L, V) logits of one micro-batch
LORA_ALPHA = 32            # adapter scale alpha / r; Tinker does not expose alpha
LORA_TARGETS = {"attn": ["q_proj", "k_proj", "v_proj", "o_proj"], "mlp": ["gate_proj", "up_proj", "down_proj"],
                "unembed": ["lm_head"]}


@dataclass
class Datum:
    tokens: torch.Tensor                                          # (N,) input token ids
    inputs: dict[str, torch.Tensor] = field(default_factory=dict)  # target_tokens (N,) long; the rest (N,) float


@dataclass
class LoraSpec:
    rank: int
    train_attn: bool = True
    train_mlp: bool = True
    train_unembed: bool = True
    seed: int | None = None


@dataclass
class AdamHyper:
    """One ``optim_step``'s hyper-parameters (Tinker's AdamParams; decoupled weight decay = AdamW)."""
    lr: float = 1e-4
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-12
    weight_decay: float = 0.0
    grad_clip_norm: float = 0.0  # 0 = no clipping


@dataclass
class Sampled:
    tokens: list[int]
    logprobs: list[float]
    stopped: bool  # ended on a stop token (else: hit max_tokens)


def load_model(model_dir: Path, dtype: torch.dtype, lora: LoraSpec | None, device: str = "cpu"):
    """(model, tokenizer) ready to train: full weights, or peft LoRA adapters on the chosen modules."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    from .models.attention import gqa_in_kernel

    model = gqa_in_kernel(AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype))
    if lora is not None:
        import peft  # optional dependency: only LoRA sessions need it

        present = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
        if model.config.get_text_config().tie_word_embeddings:  # an adapter on a tied head would move
            present.discard("lm_head")                            # the input embeddings too when merged
        targets = [m for part, on in (("attn", lora.train_attn), ("mlp", lora.train_mlp),
                                      ("unembed", lora.train_unembed)) if on for m in LORA_TARGETS[part]
                   if m in present]
        if lora.seed is not None:
            torch.manual_seed(lora.seed)  # the adapters' initial A matrices
        model = peft.get_peft_model(model, peft.LoraConfig(r=lora.rank, lora_alpha=LORA_ALPHA, lora_dropout=0.0,
                                                           target_modules=targets, task_type="CAUSAL_LM"))
    return model.to(device), tok


def datum_logprobs(model, datums: Sequence[Datum]) -> list[torch.Tensor]:
    """log p(target_tokens[i] | tokens[:i+1]) for every datum, (N_d,) each, in one right-padded forward
    (temperature 1). Differentiable."""
    dev = next(model.parameters()).device
    width = max(len(d.tokens) for d in datums)
    ids = torch.zeros((len(datums), width), dtype=torch.long)
    tgt = torch.zeros((len(datums), width), dtype=torch.long)
    attn = torch.zeros((len(datums), width), dtype=torch.long)
    for i, d in enumerate(datums):
        n = len(d.tokens)
        ids[i, :n], tgt[i, :n], attn[i, :n] = d.tokens, d.inputs["target_tokens"], 1
    logits = model(input_ids=ids.to(dev), attention_mask=attn.to(dev)).logits  # right padding: causal, no shift
    logp = algos.token_logprobs(logits, tgt.to(dev))
    return [logp[i, : len(d.tokens)] for i, d in enumerate(datums)]


def _micro_batches(datums: Sequence[Datum]) -> list[list[int]]:
    """Consecutive datum indices whose padded size stays under MAX_FORWARD_TOKENS (one datum at least)."""
    out, cur, width = [], [], 0
    for i, d in enumerate(datums):
        w = max(width, len(d.tokens))
        if cur and w * (len(cur) + 1) > MAX_FORWARD_TOKENS:
            out.append(cur)
            cur, w = [], len(d.tokens)
        cur.append(i)
        width = w
    return out + [cur] if cur else out


class TrainState:
    """One trainable model, its AdamW optimiser and the gradients accumulated since the last step."""

    def __init__(self, model, tokenizer):
        self.model, self.tok = model, tokenizer
        self.params = [p for p in model.parameters() if p.requires_grad]
        # lr and the rest are set from each optim_step's hyper-parameters
        self.opt = torch.optim.AdamW(self.params, lr=0.0, betas=(0.9, 0.95), eps=1e-12, weight_decay=0.0)
        self.steps = 0

    @property
    def is_lora(self) -> bool:
        return hasattr(self.model, "peft_config")

    def forward_backward(self, datums: Sequence[Datum], loss_fn: str, cfg: dict[str, float], backward: bool = True
                         ) -> tuple[list[torch.Tensor], dict[str, float]]:
        """Per-datum target log-probs (N_d,) and metrics (``loss:sum``); with ``backward`` the loss's
        gradient is added to what earlier calls accumulated."""
        loss_of, defaults = datum_loss(loss_fn)
        cfg = {**defaults, **cfg}
        out: list[torch.Tensor] = [torch.empty(0)] * len(datums)
        total = 0.0
        self.model.train(backward)
        for idx in _micro_batches(datums):
            part = [datums[i] for i in idx]
            with torch.set_grad_enabled(backward):
                lps = datum_logprobs(self.model, part)
                loss = sum(loss_of(lp, {k: v.to(lp) for k, v in d.inputs.items() if k != "target_tokens"}, cfg).sum()
                           for lp, d in zip(lps, part))
            if backward:
                loss.backward()
            total += float(loss.detach())
            for i, lp in zip(idx, lps):
                out[i] = lp.detach().float().cpu()
        return out, {"loss:sum": total}

    def optim_step(self, hp: AdamHyper) -> dict[str, float]:
        """AdamW with this step's hyper-parameters on the accumulated gradients, then clear them."""
        for p in self.params:  # a zero gradient, not a missing one: Adam's moments still decay
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        gn = clip_grads(self.params, hp.grad_clip_norm if hp.grad_clip_norm > 0 else math.inf, False)
        for g in self.opt.param_groups:
            g.update(lr=hp.lr, betas=(hp.beta1, hp.beta2), eps=hp.eps, weight_decay=hp.weight_decay)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.steps += 1
        return {"grad_norm:mean": float(gn), "learning_rate:mean": hp.lr, "step:max": float(self.steps)}

    # ------------------------------------------------------------------ save / load
    def save(self, path: Path, optimizer: bool, meta: dict[str, Any]) -> Path:
        """An ordinary rlvr checkpoint folder: HF weights (LoRA: the adapter) + tokenizer + trainer state."""
        state = {"steps": self.steps, "primitives": meta}
        if optimizer:
            state["optimizer"] = self.opt.state_dict()
        return checkpoint.save_to(path, self.model, self.tok, state)

    def load(self, path: Path, optimizer: bool) -> None:
        """Weights (and, if asked, the optimiser's moments and step count) from a folder ``save`` wrote."""
        from safetensors.torch import load_file

        name = "adapter_model.safetensors" if self.is_lora else "model.safetensors"
        weights = load_file(path / name, device=str(next(self.model.parameters()).device))
        if self.is_lora:
            import peft

            peft.set_peft_model_state_dict(self.model, weights)
        else:
            missing, unexpected = self.model.load_state_dict(weights, strict=False)
            if unexpected or [k for k in missing if k != "lm_head.weight"]:  # tied embeddings are saved once
                raise checkpoint.CheckpointError(f"checkpoint {path.name} does not match this model's weights")
        state = torch.load(path / checkpoint.STATE_FILE, weights_only=False)
        self.opt.zero_grad(set_to_none=True)
        if optimizer:
            if "optimizer" not in state:
                raise checkpoint.CheckpointError(f"checkpoint {path.name} was saved without optimizer state")
            self.opt.load_state_dict(state["optimizer"])
            self.steps = state.get("steps", 0)

    def sampler_model(self):
        """A frozen copy of the current weights for sampling (LoRA merged into the base weights)."""
        m = copy.deepcopy(self.model)
        if self.is_lora:
            m = m.merge_and_unload()
        m.requires_grad_(False)
        return m.eval()


# ---------------------------------------------------------------------- sampling and prompt log-probs
def sample(model, tok, prompts: list[list[int]], n: int, params: SamplingParams, stops: Sequence[int] | None,
           seed: int | None = None) -> list[list[Sampled]]:
    """``n`` completions of each token prompt, in one batch, with the log-prob of each sampled token under
    softmax(logits / temperature) (our KV-cache sampler, trainer.engines.hf)."""
    from .engines.hf import HFEngine

    if seed is not None:
        torch.manual_seed(seed)
    ro = HFEngine(model, tok).generate_ids(prompts, n, params, stops)
    out = []
    for i in range(len(prompts) * n):
        k = int(ro.completion_mask[i].sum())
        out.append(Sampled(ro.completion_ids[i, :k].tolist(), ro.logprobs[i, :k].tolist(), not bool(ro.truncated[i])))
    return [out[j * n:(j + 1) * n] for j in range(len(prompts))]


@torch.no_grad()
def prompt_logprobs(model, tokens: list[int]) -> list[float]:
    """log p(tokens[i] | tokens[:i]) for i >= 1 (temperature 1); NaN at position 0 (no context)."""
    dev = next(model.parameters()).device
    ids = torch.tensor([tokens], device=dev)
    logits = model(input_ids=ids).logits[:, :-1]
    lp = algos.token_logprobs(logits, ids[:, 1:])[0].cpu().tolist()
    return [math.nan] + lp
