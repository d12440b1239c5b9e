"""The chunked log-prob/entropy (trainer.logprobs) against the autograd expressions it replaces.

Forward: the same bits as ``gather - logsumexp`` and ``-sum(p log p)`` over ``log_softmax``, whatever the
chunking (each row is reduced by the same kernels). Backward of log p: the same bits too (the same two
terms, summed in the same order). Backward of the entropy: a different, equally short, formula
(-p (log p + H)): checked against the float64 autograd gradient, no further from it than float32 autograd
itself is (so the tolerance is the dtype's own error on these inputs, measured, not picked).
"""
from __future__ import annotations

import math

import pytest
import torch

from trainer import algos
from trainer.logprobs import logp_and_entropy

pytestmark = pytest.mark.numerics  # float comparisons: CI runs them under a second CPU kernel path too


def _reference(logits, targets, temperature, entropy_grad):
    z = algos.upcast(logits) / temperature
    return algos.token_logprobs(z, targets), algos.entropy_from_logits(z if entropy_grad else z.detach())


def _case(dtype, seed=0, B=3, T=7, V=61):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(B, T, V, generator=g, dtype=torch.float64) * 4).to(dtype).requires_grad_()
    targets = torch.randint(0, V, (B, T), generator=g)
    # per-token weights of the two outputs in a loss (distinct, so a swapped row would show)
    w = torch.randn(2, B, T, generator=g, dtype=torch.float64).to(dtype)
    return logits, targets, w


def _loss(lp, ent, w, entropy_grad):
    return (lp * w[0]).sum() + ((ent * w[1]).sum() if entropy_grad else 0.0)


def test_hand_computed_values():
    """Uniform over 4 tokens: log p = -log 4, H = log 4; at temperature 0.5, logits (2, 0) -> (4, 0)."""
    lp, ent = logp_and_entropy(torch.zeros(1, 1, 4), torch.tensor([[2]]))
    assert lp.item() == pytest.approx(-math.log(4)) and ent.item() == pytest.approx(math.log(4))
    lp, ent = logp_and_entropy(torch.tensor([[[2.0, 0.0]]], dtype=torch.float64), torch.tensor([[1]]), 0.5)
    p1 = 1 / (1 + math.exp(4))
    assert lp.item() == pytest.approx(math.log(p1), rel=1e-12)
    assert ent.item() == pytest.approx(-(p1 * math.log(p1) + (1 - p1) * math.log(1 - p1)), rel=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("chunk_rows", [None, 1, 4, 21])
def test_forward_and_logp_gradient_bitwise_equal(dtype, temperature, chunk_rows):
    logits, targets, w = _case(dtype)
    ref_lp, ref_ent = _reference(logits, targets, temperature, False)
    (ref_g,) = torch.autograd.grad(_loss(ref_lp, ref_ent, w, False), logits)
    lp, ent = logp_and_entropy(logits, targets, temperature, False, chunk_rows)
    (g,) = torch.autograd.grad(_loss(lp, ent, w, False), logits)
    assert torch.equal(lp, ref_lp) and torch.equal(ent, ref_ent) and torch.equal(g, ref_g)
    assert not ent.requires_grad  # no entropy gradient unless asked


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("chunk_rows", [None, 1, 5])
def test_entropy_gradient_within_float32_rounding(temperature, chunk_rows):
    logits, targets, w = _case(torch.float32, seed=1)
    exact = logits.detach().double().requires_grad_()
    (truth,) = torch.autograd.grad(_loss(*_reference(exact, targets, temperature, True), w.double(), True), exact)
    (ref_g,) = torch.autograd.grad(_loss(*_reference(logits, targets, temperature, True), w, True), logits)
    lp, ent = logp_and_entropy(logits, targets, temperature, True, chunk_rows)
    (g,) = torch.autograd.grad(_loss(lp, ent, w, True), logits)
    ref_err = (ref_g.double() - truth).abs().max().item()
    err = (g.double() - truth).abs().max().item()
    eps = torch.finfo(torch.float32).eps
    assert err <= 2 * ref_err + eps * truth.abs().max().item(), (err, ref_err)


def test_float64_entropy_gradient_matches_autograd():
    logits, targets, w = _case(torch.float64, seed=2)
    (ref_g,) = torch.autograd.grad(_loss(*_reference(logits, targets, 0.9, True), w, True), logits)
    (g,) = torch.autograd.grad(_loss(*logp_and_entropy(logits, targets, 0.9, True, 2), w, True), logits)
    assert torch.allclose(g, ref_g, rtol=0, atol=64 * torch.finfo(torch.float64).eps * ref_g.abs().max().item())


def test_bfloat16_logits_are_upcast_and_get_a_bfloat16_gradient():
    logits, targets, w = _case(torch.bfloat16, seed=3)
    lp, ent = logp_and_entropy(logits, targets, 1.0, True)
    assert lp.dtype == ent.dtype == torch.float32
    ref_lp, ref_ent = _reference(logits, targets, 1.0, True)
    assert torch.equal(lp, ref_lp) and torch.equal(ent, ref_ent)
    (g,) = torch.autograd.grad(_loss(lp, ent, w.float(), True), logits)
    assert g.dtype == torch.bfloat16 and g.shape == logits.shape


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("chunk_rows", [None, 1, 4, 21])
def test_log_p_alone_is_the_same_bits_without_the_entropy(dtype, temperature, chunk_rows):
    """A reference's or teacher's forward (no graph) asks for log p alone: the same values, no entropy."""
    logits, targets, _ = _case(dtype, seed=4)
    ref_lp, _ = _reference(logits, targets, temperature, False)
    with torch.no_grad():
        lp, ent = logp_and_entropy(logits, targets, temperature, chunk_rows=chunk_rows, entropy=False)
    assert ent is None and lp.shape == targets.shape and not lp.requires_grad
    assert torch.equal(lp, ref_lp.detach())


def test_log_p_alone_with_a_gradient_wanted_still_gives_both():
    """Where autograd needs the logits' gradient the chunked function runs as before (its entropy is cheap
    beside the backward it feeds)."""
    logits, targets, w = _case(torch.float32, seed=5)
    lp, ent = logp_and_entropy(logits, targets, 1.0, entropy=False)
    assert ent is not None and lp.requires_grad
    ref_lp, _ = _reference(logits, targets, 1.0, False)
    assert torch.equal(lp, ref_lp)
