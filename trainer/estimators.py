"""Advantage estimators of the online regime: group baselines (GRPO family) and GAE with a value head (PPO).

Both expose the same three calls, so the update loop never asks which algorithm it runs:
``prepare`` turns rewards into per-token advantages once per step, ``loss`` adds the estimator's own
loss term to each micro-batch (zero for group baselines), ``parameters``/``state_dict`` let the
optimiser and checkpoints carry whatever the estimator learns.
"""
from __future__ import annotations

import torch

from . import algos
from .batch import Forward, chunks, last_hidden, select, width
from .config import JobSpec, PPOConfig
from .context import Counts
from .distributed import Dist
from .rollout import Rollout


class GroupBaseline:
    """GRPO / Dr. GRPO / RLOO: the group's other samples are the baseline; no learned parameters."""

    needs_hidden = False
    needs_old = False
    has_loss = False  # adds no loss term: rows of zero-variance groups can skip the update

    def __init__(self, spec: JobSpec, hidden_size: int):
        self.name = spec.algo.advantage
        self.G = spec.rollout.group_size
        # KL in the reward (algo.kl_in): the sampling policy's log-probs give each sequence's log(pi/ref)
        self.kl_reward = spec.algo.kl_coef if spec.algo.kl_in == "reward" else 0.0
        self.needs_old = self.kl_reward > 0

    def parameters(self) -> list[torch.nn.Parameter]:
        return []

    def to(self, device: torch.device, head_dtype: torch.dtype) -> None:
        pass

    def prepare(self, ro: Rollout, rewards_global: torch.Tensor, rows: slice, mask: torch.Tensor,
                old: Forward | None, kl_tok: torch.Tensor | None, dist: Dist,
                valid_global: torch.Tensor | None = None) -> torch.Tensor:
        # (N,) per sequence; rows whose reward is an infrastructure failure take no part in the baseline
        if self.kl_reward and kl_tok is not None:  # r - beta * sum_t log(pi/ref), every rank's rows
            seq_kl = (kl_tok * mask).sum(1).to(rewards_global.dtype).cpu()
            rewards_global = rewards_global - self.kl_reward * torch.cat([torch.as_tensor(x)
                                                                          for x in dist.gather(seq_kl)])
        return algos.ADVANTAGES[self.name](rewards_global, self.G, valid_global)[rows]

    def loss(self, fwd: Forward, part: Rollout, idx: torch.Tensor, mask, counts: Counts
             ) -> tuple[torch.Tensor, dict[str, float]]:
        return fwd.logp.new_zeros(()), {}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class ValueHead(torch.nn.Module):
    def __init__(self, hidden_size: int):
        super().__init__()
        self.proj = torch.nn.Linear(hidden_size, 1)
        torch.nn.init.zeros_(self.proj.weight)  # V = 0 at start: the first advantages are plain returns
        torch.nn.init.zeros_(self.proj.bias)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.proj(h.to(self.proj.weight.dtype)).squeeze(-1)  # (B, T), in the head's dtype (>= fp32)


class GAECritic:
    """PPO: a linear value head on the policy's last hidden state (shared backbone), GAE(γ, λ) on
    per-token rewards (verifier reward on the final token minus kl_reward_coef × per-token KL)."""

    needs_hidden = True
    needs_old = True
    has_loss = True

    def __init__(self, spec: JobSpec, hidden_size: int):
        self.cfg: PPOConfig = spec.ppo  # type: ignore[assignment]  (filled in for algorithm: ppo)
        self.head = ValueHead(hidden_size)
        self.agg = algos.LOSS_AGG[spec.algo.loss_agg]
        self.old_values = self.returns = None

    def parameters(self) -> list[torch.nn.Parameter]:
        return list(self.head.parameters())

    def to(self, device: torch.device, head_dtype: torch.dtype) -> None:
        """The value head lives in ``head_dtype`` (fp32, or fp64 for a float64 policy), never in bf16."""
        self.head.to(device, head_dtype)

    @torch.no_grad()
    def prepare(self, ro: Rollout, rewards_global: torch.Tensor, rows: slice, mask: torch.Tensor,
                old: Forward | None, kl_tok: torch.Tensor | None, dist: Dist,
                valid_global: torch.Tensor | None = None) -> torch.Tensor:
        # invalid rows (infrastructure failures) are masked out of the loss and of whitening by the caller
        assert old is not None and old.hidden is not None
        self.head.to(old.hidden.device)
        return self._advantages(self.head(old.hidden) * mask, rewards_global, rows, mask, kl_tok, dist)

    def loss(self, fwd: Forward, part: Rollout, idx: torch.Tensor, mask, counts
             ) -> tuple[torch.Tensor, dict[str, float]]:
        return self._value_loss(self.head(fwd.hidden), idx, mask, counts)

    def _advantages(self, values, rewards_global, rows, mask, kl_tok, dist) -> torch.Tensor:
        tok_r = algos.final_token_rewards(rewards_global[rows].to(mask.device), mask)
        if kl_tok is not None:
            tok_r = tok_r - self.cfg.kl_reward_coef * kl_tok * mask
        adv, self.returns = algos.gae(tok_r, values, mask, self.cfg.gamma, self.cfg.lam)
        self.old_values = values
        self.explained_var = _explained_variance(values, self.returns, mask, dist)
        if self.cfg.whiten_advantages:
            sums = dist.all_sum(torch.stack([(adv * mask).sum(), (adv**2 * mask).sum(), mask.sum()]))
            adv = algos.masked_whiten(adv, mask, sums[0], sums[1], sums[2])
        return adv  # (N, T)

    def _value_loss(self, v, idx, mask, counts) -> tuple[torch.Tensor, dict[str, float]]:
        old, ret = self.old_values[idx], self.returns[idx]
        vl = algos.value_loss_clipped(v, old, ret, self.cfg.value_clip)
        loss = self.agg(vl, mask, *counts)  # Counts: tokens, seqs, max_len
        n = float(mask.sum())
        st = {"value/loss": (float((vl.detach() * mask).sum()), n), "value/mean": (float((v.detach() * mask).sum()), n),
              "value/return_mean": (float((ret * mask).sum()), n), "value/explained_var": self.explained_var}
        if self.cfg.value_clip is not None:  # tokens where the clipped value's error is the larger: the clip binds
            v_clip = old + torch.clamp(v.detach() - old, -self.cfg.value_clip, self.cfg.value_clip)
            st["value/clip_frac"] = (float((((v_clip - ret) ** 2 > (v.detach() - ret) ** 2) * mask).sum()), n)
        return self.cfg.vf_coef * loss, st

    def state_dict(self) -> dict:
        return {"value_head": self.head.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.head.load_state_dict(state["value_head"])


class ModelCritic(GAECritic):
    """PPO with a separate critic network (``ppo.critic``): a small causal LM's backbone and a value
    head on its last hidden state. Only the value loss trains it and it never touches the policy's
    weights; the policy's own forward needs no hidden states. It reads the policy's token ids, so it
    must share the policy's vocabulary (checked when it is loaded). Its weights are checkpointed with
    the trainer state, so a resumed run continues with the same critic."""

    needs_hidden = False

    def __init__(self, spec: JobSpec, hidden_size: int, load_model=None):
        if load_model is None:
            raise ValueError("ppo.critic: no model loader was given")
        self.net = load_model(spec.ppo.critic)  # type: ignore[union-attr]
        super().__init__(spec, self.net.config.get_text_config().hidden_size)
        self.micro = spec.algo.micro_rows
        # the policy's old log-probs are needed only for the per-token KL reward (values come from the critic)
        self.needs_old = self.cfg.kl_reward_coef > 0

    def parameters(self) -> list[torch.nn.Parameter]:
        return list(self.net.parameters()) + list(self.head.parameters())

    def to(self, device: torch.device, head_dtype: torch.dtype) -> None:
        self.net.to(device)
        super().to(device, head_dtype)

    def _values(self, ro: Rollout) -> torch.Tensor:
        return self.head(last_hidden(self.net, ro))

    @torch.no_grad()
    def prepare(self, ro: Rollout, rewards_global: torch.Tensor, rows: slice, mask: torch.Tensor,
                old: Forward | None, kl_tok: torch.Tensor | None, dist: Dist,
                valid_global: torch.Tensor | None = None) -> torch.Tensor:
        self.head.to(mask.device)
        values = torch.cat([self._values(select(ro, i))
                            for i in chunks(torch.arange(len(ro.texts)), self.micro(width(ro)))])
        return self._advantages(values * mask, rewards_global, rows, mask, kl_tok, dist)

    def loss(self, fwd: Forward, part: Rollout, idx: torch.Tensor, mask, counts
             ) -> tuple[torch.Tensor, dict[str, float]]:
        return self._value_loss(self._values(part), idx, mask, counts)

    def state_dict(self) -> dict:
        return {"value_head": self.head.state_dict(), "critic": self.net.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.net.load_state_dict(state["critic"])


def _explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor, dist: Dist) -> float:
    """1 - Var[R - V] / Var[R] over masked tokens of every rank, with the values the advantages used: 1 for a
    critic that predicts returns exactly, 0 for one that predicts their mean, below 0 for a harmful one."""
    d = returns - values
    s = dist.all_sum(torch.stack([mask.sum(), (returns * mask).sum(), (returns**2 * mask).sum(), (d * mask).sum(),
                                  (d**2 * mask).sum()]).double())
    n = s[0].clamp(min=1)
    var_r, var_d = s[2] / n - (s[1] / n) ** 2, s[4] / n - (s[3] / n) ** 2
    return float(1 - var_d / var_r) if var_r > 1e-12 else 0.0


def make_estimator(spec: JobSpec, hidden_size: int, load_model=None):
    """The estimator a job's spec asks for; callers never branch on the algorithm."""
    if spec.algorithm == "ppo" and spec.ppo is not None and spec.ppo.critic:
        return ModelCritic(spec, hidden_size, load_model)
    return ESTIMATORS.get(spec.algorithm, GroupBaseline)(spec, hidden_size)


ESTIMATORS = {"grpo": GroupBaseline, "ppo": GAECritic}
