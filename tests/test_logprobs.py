"""The log-prob/entropy (trainer.logprobs) against the autograd expressions it replaces.

Float32 CPU logits take the C++ kernel (trainer/engines/csrc/vocab_softmax.cpp): its values and gradients are
checked against float64 autograd, no further from it than float32 autograd itself is (twice torch's own error plus
one rounding of the scale: the dtype's error on these inputs, measured, not picked). The torch chunks (float64,
bfloat16, and float32 where the kernel is off: the ``torch_ops`` fixture) keep the contract below.

Chunks' forward: the same bits as ``gather - logsumexp`` and ``-sum(p log p)`` over ``log_softmax``, whatever the
chunking (each row is reduced by the same kernels). Backward of log p: the same bits too (the same two
terms, summed in the same order). Backward of the entropy: a different, equally short, formula
(-p (log p + H)): checked against the float64 autograd gradient, no further from it than float32 autograd
itself is (so the tolerance is the dtype's own error on these inputs, measured, not picked).
"""
from __future__ import annotations

import math

import pytest
import torch

from trainer import algos, logprobs
from trainer.engines import native
from trainer.logprobs import logp_and_entropy

pytestmark = pytest.mark.numerics  # float comparisons: CI runs them under a second CPU kernel path too


@pytest.fixture
def torch_ops(monkeypatch):
    """The torch chunks for every dtype, as on a host where the kernel cannot build."""
    monkeypatch.setattr(logprobs, "_kernel", lambda logits: None)


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
def test_forward_and_logp_gradient_bitwise_equal(dtype, temperature, chunk_rows, torch_ops):
    logits, targets, w = _case(dtype)
    ref_lp, ref_ent = _reference(logits, targets, temperature, False)
    (ref_g,) = torch.autograd.grad(_loss(ref_lp, ref_ent, w, False), logits)
    lp, ent = logp_and_entropy(logits, targets, temperature, False, chunk_rows)
    (g,) = torch.autograd.grad(_loss(lp, ent, w, False), logits)
    assert torch.equal(lp, ref_lp) and torch.equal(ent, ref_ent) and torch.equal(g, ref_g)
    assert not ent.requires_grad  # no entropy gradient unless asked


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("chunk_rows", [None, 1, 5])
def test_entropy_gradient_within_float32_rounding(temperature, chunk_rows, torch_ops):
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
def test_log_p_alone_is_the_same_bits_without_the_entropy(dtype, temperature, chunk_rows, torch_ops):
    """A reference's or teacher's forward (no graph) asks for log p alone: the same values, no entropy."""
    logits, targets, _ = _case(dtype, seed=4)
    ref_lp, _ = _reference(logits, targets, temperature, False)
    with torch.no_grad():
        lp, ent = logp_and_entropy(logits, targets, temperature, chunk_rows=chunk_rows, entropy=False)
    assert ent is None and lp.shape == targets.shape and not lp.requires_grad
    assert torch.equal(lp, ref_lp.detach())


def test_log_p_alone_with_a_gradient_wanted_still_gives_both(torch_ops):
    """Where autograd needs the logits' gradient the chunked function runs as before (its entropy is cheap
    beside the backward it feeds)."""
    logits, targets, w = _case(torch.float32, seed=5)
    lp, ent = logp_and_entropy(logits, targets, 1.0, entropy=False)
    assert ent is not None and lp.requires_grad
    ref_lp, _ = _reference(logits, targets, 1.0, False)
    assert torch.equal(lp, ref_lp)


def _errors(logits, targets, temperature, entropy_grad, w):
    """max |x - float64 autograd| of (log p, entropy, the logits' gradient): ours, then torch's float32 autograd."""
    exact = logits.detach().double().requires_grad_()
    t_lp, t_ent = _reference(exact, targets, temperature, entropy_grad)
    (t_g,) = torch.autograd.grad(_loss(t_lp, t_ent, w.double(), entropy_grad), exact)
    r_lp, r_ent = _reference(logits, targets, temperature, entropy_grad)
    (r_g,) = torch.autograd.grad(_loss(r_lp, r_ent, w, entropy_grad), logits)
    lp, ent = logp_and_entropy(logits, targets, temperature, entropy_grad)
    assert lp.grad_fn is not None and type(lp.grad_fn).__name__ == "_FusedBackward"  # the kernel's path
    (g,) = torch.autograd.grad(_loss(lp, ent, w, entropy_grad), logits)
    truth = (t_lp, t_ent, t_g)
    ours = [(a.double() - t).abs().max().item() for a, t in zip((lp, ent, g), truth)]
    torch_err = [(a.double() - t).abs().max().item() for a, t in zip((r_lp, r_ent, r_g), truth)]
    scale = [t.abs().max().item() for t in truth]
    return ours, torch_err, scale


@pytest.mark.parametrize("V", [1, 7, 8, 61, 1024 + 13, 49152])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("entropy_grad", [False, True])
def test_kernel_within_float32_rounding_of_float64(V, temperature, entropy_grad):
    """The C++ kernel (float32 CPU logits) no further from float64 than torch's float32 ops, over 3 draws: row
    lengths under, at and past its 8 lanes and its 1,024-logit blocks, and SmolLM2's vocabulary."""
    assert native.vocab_softmax() is not None, "the kernel must build here (make setup builds it)"
    eps = torch.finfo(torch.float32).eps
    for seed in range(3):
        B, T = (2, 3) if V > 2000 else (3, 7)
        logits, targets, w = _case(torch.float32, seed=10 + seed, B=B, T=T, V=V)
        targets[0, 0] = V - 1  # the last lane of a partial vector
        ours, ref, scale = _errors(logits, targets, temperature, entropy_grad, w)
        for name, e, r, sc in zip(("log p", "entropy", "gradient"), ours, ref, scale):
            assert e <= 2 * r + eps * sc, (name, seed, e, r, sc)


def test_kernel_log_p_alone_is_the_graph_forward_bits():
    """A no-graph forward (the old policy's, the reference's) and the update's forward give the same log p bits,
    so the first step's ratio is exactly 1 where the model's logits are the same."""
    logits, targets, _ = _case(torch.float32, seed=20, V=300)
    with torch.no_grad():
        alone, none = logp_and_entropy(logits, targets, 0.8, entropy=False)
    lp, ent = logp_and_entropy(logits, targets, 0.8)
    assert none is None and ent is not None and torch.equal(alone, lp.detach())


def test_kernel_rows_do_not_depend_on_the_thread_count():
    logits, targets, w = _case(torch.float32, seed=21, B=4, T=9, V=4099)
    before = torch.get_num_threads()
    out = []
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            lp, ent = logp_and_entropy(logits, targets, 1.0, True)
            out.append((lp, ent, *torch.autograd.grad(_loss(lp, ent, w, True), logits)))
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(a, b) for a, b in zip(*out))


def test_kernel_masked_tokens_get_no_probability_and_no_gradient():
    """-inf logits (a masked vocabulary entry) drop out: the values of the unmasked columns alone, finite, and a
    zero gradient where the logit is -inf (not 0 * -inf = NaN)."""
    logits, targets, w = _case(torch.float32, seed=22, V=37)
    masked = torch.zeros(37, dtype=torch.bool)
    masked[torch.tensor([0, 5, 17, 36])] = True
    targets[masked[targets]] = 3
    full = logits.detach().clone()
    full[..., masked] = float("-inf")
    full.requires_grad_()
    lp, ent = logp_and_entropy(full, targets, 1.0, True)
    (g,) = torch.autograd.grad(_loss(lp, ent, w, True), full)
    kept = logits.detach()[..., ~masked].double().requires_grad_()
    remap = torch.cumsum(~masked, 0) - 1
    t_lp, t_ent = _reference(kept, remap[targets], 1.0, True)
    (t_g,) = torch.autograd.grad(_loss(t_lp, t_ent, w.double(), True), kept)
    eps = torch.finfo(torch.float32).eps
    assert torch.isfinite(g).all() and (g[..., masked] == 0).all()
    for a, t in ((lp, t_lp), (ent, t_ent), (g[..., ~masked], t_g)):
        assert (a.double() - t).abs().max().item() <= 64 * eps * t.abs().max().item()


def test_without_the_kernel_float32_takes_the_chunks(monkeypatch):
    """A host where the kernel cannot build (native.vocab_softmax() None, with its warning) computes the same
    function by torch's ops."""
    logits, targets, w = _case(torch.float32, seed=23)
    lp, ent = logp_and_entropy(logits, targets, 1.0, True)
    monkeypatch.setattr(native, "vocab_softmax", lambda: None)
    lp2, ent2 = logp_and_entropy(logits, targets, 1.0, True)
    assert type(lp2.grad_fn).__name__ == "_LogpEntropyBackward"
    eps = torch.finfo(torch.float32).eps
    for a, b in ((lp, lp2), (ent, ent2)):
        assert (a - b).abs().max().item() <= 16 * eps * b.abs().max().item()


def test_kernel_rejects_a_target_outside_the_vocabulary():
    logits, targets, _ = _case(torch.float32, seed=24, V=11)
    targets[1, 2] = 11
    with pytest.raises(RuntimeError, match="target out of range"):
        logp_and_entropy(logits, targets, 1.0)
