"""Advantage estimators of the online regime: group baselines (GRPO family) and GAE with a value head (PPO).

Both expose the same three calls, so the update loop never asks which algorithm it runs:
``prepare`` turns rewards into per-token advantages once per step, ``loss`` adds the estimator's own
loss term to each micro-batch (zero for group baselines), ``parameters``/``state_dict`` let the
optimiser and checkpoints carry whatever the estimator learns.
"""
from __future__ import annotations

import torch

from . import algos
from .batch import Forward
from .config import JobSpec, PPOConfig
from .distributed import Dist


class GroupBaseline:
    """GRPO / Dr. GRPO / RLOO: the group's other samples are the baseline; no learned parameters."""

    needs_hidden = False
    needs_old = False

    def __init__(self, spec: JobSpec, hidden_size: int):
        self.fn = algos.ADVANTAGES[spec.algo.advantage]
        self.G = spec.rollout.group_size

    def parameters(self) -> list[torch.nn.Parameter]:
        return []

    def prepare(self, rewards_global: torch.Tensor, rows: slice, mask: torch.Tensor, old: Forward | None,
                kl_tok: torch.Tensor | None, dist: Dist) -> torch.Tensor:
        return self.fn(rewards_global, self.G)[rows]  # (N,) per sequence

    def loss(self, fwd: Forward, idx: torch.Tensor, mask, counts) -> tuple[torch.Tensor, dict[str, float]]:
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
        return self.proj(h.float()).squeeze(-1)  # (B, T)


class GAECritic:
    """PPO: a linear value head on the policy's last hidden state (shared backbone), GAE(γ, λ) on
    per-token rewards (verifier reward on the final token minus kl_reward_coef × per-token KL)."""

    needs_hidden = True
    needs_old = True

    def __init__(self, spec: JobSpec, hidden_size: int):
        self.cfg: PPOConfig = spec.ppo  # type: ignore[assignment]  (filled in for algorithm: ppo)
        self.head = ValueHead(hidden_size)
        self.agg = algos.LOSS_AGG[spec.algo.loss_agg]
        self.old_values = self.returns = None

    def parameters(self) -> list[torch.nn.Parameter]:
        return list(self.head.parameters())

    @torch.no_grad()
    def prepare(self, rewards_global: torch.Tensor, rows: slice, mask: torch.Tensor, old: Forward | None,
                kl_tok: torch.Tensor | None, dist: Dist) -> torch.Tensor:
        assert old is not None and old.hidden is not None
        self.head.to(old.hidden.device)
        values = self.head(old.hidden) * mask
        tok_r = algos.final_token_rewards(rewards_global[rows].to(mask.device), mask)
        if kl_tok is not None:
            tok_r = tok_r - self.cfg.kl_reward_coef * kl_tok * mask
        adv, self.returns = algos.gae(tok_r, values, mask, self.cfg.gamma, self.cfg.lam)
        self.old_values = values
        if self.cfg.whiten_advantages:
            sums = dist.all_sum(torch.stack([(adv * mask).sum(), (adv**2 * mask).sum(), mask.sum()]))
            adv = algos.masked_whiten(adv, mask, sums[0], sums[1], sums[2])
        return adv  # (N, T)

    def loss(self, fwd: Forward, idx: torch.Tensor, mask, counts) -> tuple[torch.Tensor, dict[str, float]]:
        v = self.head(fwd.hidden)
        vl = algos.value_loss_clipped(v, self.old_values[idx], self.returns[idx], self.cfg.value_clip)
        loss = self.agg(vl, mask, *counts)
        n = mask.sum().clamp(min=1)
        return self.cfg.vf_coef * loss, {
            "value/loss": float((vl.detach() * mask).sum() / n),
            "value/mean": float((v.detach() * mask).sum() / n),
            "value/return_mean": float((self.returns[idx] * mask).sum() / n),
        }

    def state_dict(self) -> dict:
        return {"value_head": self.head.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.head.load_state_dict(state["value_head"])


ESTIMATORS = {"grpo": GroupBaseline, "ppo": GAECritic}
