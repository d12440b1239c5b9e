"""trainer.context.clip_grads: torch's global-norm clip, its norm from ``grad_norm``, and no pass over every
gradient when the factor is 1.

torch multiplies every gradient by min(1, max_norm / (norm + 1e-6)) whatever the norm (on a GPU the test would
wait for the device). On the CPU that multiply by 1 changes no bit, so clip_grads skips it: below the limit the
gradients are not written at all. The norm on the CPU is the square root of the gradients' dot products with
themselves (BLAS, on every thread; torch's float 2-norm runs on one): it agrees with torch's to float32 rounding and
is no further from the float64 value than torch's own; inf and NaN come out as torch's.
"""
from __future__ import annotations

import copy
import math

import pytest
import torch

from trainer.context import clip_grads, clipped_step, grad_norm

U32 = torch.finfo(torch.float32).eps / 2  # float32's unit roundoff


def _params(scale: float, nan: bool = False, sizes=(7, 300, 33)) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(n, generator=g)) for n in sizes]
    for p in params:
        p.grad = torch.randn(p.shape, generator=g) * scale
    if nan:
        params[1].grad[5] = float("nan")
    return params


def _exact(grads) -> float:
    return math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads))


@pytest.mark.parametrize("scale, max_norm, clipped", [(1e-3, 1.0, False), (10.0, 1.0, True), (10.0, math.inf, False),
                                                       (1.0, 1e-7, True)])
def test_torchs_clip_scaling_and_untouched_below_the_limit(scale, max_norm, clipped):
    ours, theirs = _params(scale), _params(scale)
    before = [(p.grad.clone(), p.grad._version) for p in ours]
    n_ours = clip_grads(ours, max_norm, sharded=False)
    n_torch = torch.nn.utils.get_total_norm([p.grad for p in theirs], 2.0)
    # two float32 sums of 340 squares: each within n·u of the exact sum (recursive summation's bound), so the
    # roots within n·u / 2 + u of each other's exact value
    n = sum(p.numel() for p in ours)
    assert abs(float(n_ours) - float(n_torch)) <= (n * U32 + 2 * U32) * float(n_torch)
    torch.nn.utils.clip_grads_with_norm_(theirs, max_norm, n_ours)  # torch's scaling by our norm: bitwise ours
    if clipped:
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


def test_an_overflowing_norm_is_torchs():
    """Squares past float32's range: torch's norm reads inf and its clip scales every gradient by 0; ours too."""
    ours, theirs = _params(1e20), _params(1e20)
    n_ours, n_theirs = clip_grads(ours, 1.0, sharded=False), torch.nn.utils.clip_grad_norm_(theirs, 1.0)
    assert torch.equal(n_ours, n_theirs) and n_ours.isinf()
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(ours, theirs))


@pytest.mark.parametrize("threads", [1, 2])
def test_no_further_from_the_exact_norm_than_torchs(threads):
    """An embedding-sized gradient beside small ones (torch's serial float norm drifts over millions of terms)."""
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        grads = [p.grad for p in _params(1.0, sizes=(4_000_000, 576, 1536 * 576, 7))]
        exact = _exact(grads)
        ours, theirs = float(grad_norm(grads)), float(torch.nn.utils.get_total_norm(grads, 2.0))
    finally:
        torch.set_num_threads(old)
    assert abs(ours - exact) <= abs(theirs - exact) + 2 * U32 * exact


def test_strided_or_mixed_gradients_take_torchs_norm():
    a = torch.randn(64, 32)
    strided = [a.t(), torch.randn(5)]
    mixed = [torch.randn(5), torch.randn(5, dtype=torch.float64)]
    for grads in (strided, mixed):
        assert torch.equal(grad_norm(grads), torch.nn.utils.get_total_norm(grads, 2.0))


def test_a_model_update_matches_torchs_clip():
    """An AdamW step after our clip and after torch's: the same weights to float32 rounding, clipped or not."""
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
        for a, b in zip(*states):
            torch.testing.assert_close(a, b)  # float32's default tolerances


def _model_and_grads(scale: float, dtype: torch.dtype = torch.float32):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)).to(dtype)
    (model(torch.randn(32, 8, dtype=dtype)).pow(2).mean() * scale).backward()
    return model


@pytest.mark.parametrize("scale, max_norm", [(1e3, 1e-2), (1.0, 1e3), (float("nan"), 1.0), (1e3, math.inf)])
def test_the_fused_step_takes_the_clip_as_its_grad_scale(scale, max_norm):
    """torch's fused CPU AdamW divides by the factor's inverse as it reads each gradient: the same step as the
    multiply first to float32 rounding, the clipped gradients left in .grad, nothing left on the optimiser."""
    out = []
    for fused in (True, False):  # the unfused step takes the multiply pass
        m = _model_and_grads(scale)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2, fused=fused)
        params = list(m.parameters())
        total = clipped_step(opt, params, max_norm, sharded=False)
        assert "grad_scale" not in opt.__dict__
        out.append((total, [p.detach().clone() for p in params], [p.grad.clone() for p in params]))
    (n_fused, w_fused, g_fused), (n_mul, w_mul, g_mul) = out
    torch.testing.assert_close(n_fused, n_mul, equal_nan=True, rtol=0, atol=0)
    for a, b in zip(w_fused + g_fused, w_mul + g_mul):
        torch.testing.assert_close(a, b, equal_nan=True)  # float32's default tolerances
    if not math.isnan(scale) and max_norm / (float(n_mul) + 1e-6) >= 1.0:  # below the limit: untouched, both
        assert all(torch.equal(a, b) for a, b in zip(g_fused, g_mul))


def test_the_grad_scale_only_for_a_fused_adam_over_exactly_the_clipped_parameters():
    """An unfused AdamW, a fused one over other parameters or over float64 ones (the kernel's scale is a float32)
    gets the multiply pass and no grad_scale."""
    f32, f64, every = torch.float32, torch.float64, slice(None)
    for fused, of, dtype, scaled in ((False, every, f32, False), (True, slice(0, 2), f32, False),
                                     (True, every, f64, False), (True, every, f32, True)):
        m = _model_and_grads(1e3, dtype)
        params = list(m.parameters())
        opt = torch.optim.AdamW(params[of], lr=1e-2, fused=fused)
        seen, step = {}, opt.step

        def spy(closure=None, step=step, seen=seen):
            seen["scale"] = getattr(opt, "grad_scale", None)
            seen["grads"] = [p.grad.clone() for p in params]
            return step(closure)

        opt.step = spy
        before = [p.grad.clone() for p in params]
        clipped_step(opt, params, 1e-2, sharded=False)
        assert "grad_scale" not in opt.__dict__
        # scaled: the gradients reach the step unclipped, with the factor; else clipped before it, without one
        assert (seen["scale"] is not None) == scaled
        assert all(torch.equal(a, b) == scaled for a, b in zip(before, seen["grads"]))
        if scaled:
            assert seen["scale"].dtype == torch.float32 and float(seen["scale"]) > 1
        assert all(not torch.equal(a, p.grad) for a, p in zip(before, params))  # clipped in .grad after, either way
