"""trainer.context.clip_grads: torch's global-norm clip, without its pass over every gradient when the factor is 1.

torch multiplies every gradient by min(1, max_norm / (norm + 1e-6)) whatever the norm (on a GPU the test would
wait for the device). On the CPU that multiply by 1 changes no bit, so clip_grads skips it: the gradients and the
returned norm are bitwise torch's in every case, and below the limit the gradients are not written at all.
"""
from __future__ import annotations

import copy
import math

import pytest
import torch

from trainer.context import clip_grads


def _params(scale: float, nan: bool = False) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(n, generator=g)) for n in (7, 300, 33)]
    for p in params:
        p.grad = torch.randn(p.shape, generator=g) * scale
    if nan:
        params[1].grad[5] = float("nan")
    return params


@pytest.mark.parametrize("scale, max_norm, clipped", [(1e-3, 1.0, False), (10.0, 1.0, True), (10.0, math.inf, False),
                                                       (1.0, 1e-7, True)])
def test_bitwise_torchs_clip_and_untouched_below_the_limit(scale, max_norm, clipped):
    ours, theirs = _params(scale), _params(scale)
    before = [(p.grad.clone(), p.grad._version) for p in ours]
    n_ours = clip_grads(ours, max_norm, sharded=False)
    n_theirs = torch.nn.utils.clip_grad_norm_(theirs, max_norm)
    assert torch.equal(n_ours, n_theirs)
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(ours, theirs))
    changed = [not torch.equal(p.grad, g) for p, (g, _) in zip(ours, before)]
    written = [p.grad._version != v for p, (_, v) in zip(ours, before)]
    assert all(changed) == clipped and all(written) == clipped and any(written) == clipped


def test_a_nan_norm_still_multiplies_as_torch_does():
    ours, theirs = _params(1.0, nan=True), _params(1.0, nan=True)
    n_ours, n_theirs = clip_grads(ours, 1.0, sharded=False), torch.nn.utils.clip_grad_norm_(theirs, 1.0)
    assert n_ours.isnan() and n_theirs.isnan()
    for a, b in zip(ours, theirs):
        assert a.grad.isnan().all() and b.grad.isnan().all()


def test_a_model_update_is_bitwise_the_same():
    """An AdamW step after our clip and after torch's: the same weights, clipped or not."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    x = torch.randn(32, 8)
    for max_norm in (1e-3, 1e3):
        states = []
        ours = lambda ps: clip_grads(ps, max_norm, False)  # noqa: E731
        for clip in (ours, lambda ps: torch.nn.utils.clip_grad_norm_(ps, max_norm)):
            m = copy.deepcopy(model)
            opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
            for _ in range(3):
                opt.zero_grad()
                m(x).pow(2).mean().backward()
                clip(list(m.parameters()))
                opt.step()
            states.append([p.detach().clone() for p in m.parameters()])
        assert all(torch.equal(a, b) for a, b in zip(*states))
