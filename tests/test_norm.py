"""trainer/models/norm.py: RMSNorm as one autograd node with its closed-form backward. The forward is bitwise the
stock module's; the gradients are the formula's (float64, to rounding) and, in float32, as close to a float64
reference as torch's own backward is; the trainer's forward gives a whole model's gradients; and it is applied only
to Llama's formula, float32, with a gradient wanted and no autocast."""
from __future__ import annotations

import copy

import pytest
import torch
from transformers.models.gemma2.modeling_gemma2 import Gemma2RMSNorm
from transformers.models.llama.modeling_llama import LlamaRMSNorm
from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm

from tests.conftest import shared_prompt_rollout
from trainer.batch import forward
from trainer.models import norm

pytestmark = pytest.mark.numerics  # float comparisons: CI runs them under a second CPU kernel path too

EPS32, EPS64 = torch.finfo(torch.float32).eps, torch.finfo(torch.float64).eps


def _formula(x, w, eps):  # the stock module's math, in the input's own dtype (the stock upcasts to float32 only)
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _grads(fn, x, w, g):
    x, w = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    y = fn(x, w)
    y.backward(g)
    return y.detach(), x.grad, w.grad


def _case(seed: int, shape, dtype):
    gen = torch.Generator().manual_seed(seed)
    H = shape[-1]
    x = torch.randn(*shape, generator=gen, dtype=torch.float64) * 3
    w = torch.randn(H, generator=gen, dtype=torch.float64)
    g = torch.randn(*shape, generator=gen, dtype=torch.float64)
    return x.to(dtype), w.to(dtype), g.to(dtype)


@pytest.mark.parametrize("shape", [(3, 5, 16), (7, 64), (2, 4, 3, 128)])
def test_the_closed_form_is_the_formulas_gradient_in_float64(shape):
    x, w, g = _case(0, shape, torch.float64)
    want = _grads(lambda a, b: _formula(a, b, 1e-6), x, w, g)
    got = _grads(lambda a, b: norm._RMSNorm.apply(a, b, 1e-6), x, w, g)
    for a, b, name in zip(want, got, ("y", "x", "w")):
        scale = max(1.0, a.abs().max().item())
        assert (a - b).abs().max().item() <= 64 * EPS64 * scale * shape[-1] ** 0.5, name


@pytest.mark.parametrize("shape", [(16, 24, 576), (256, 16, 128)])  # SmolLM2's and the tiny model's widths
def test_float32_forward_bitwise_and_gradients_as_close_as_torchs(shape):
    x, w, g = _case(1, shape, torch.float32)
    stock = LlamaRMSNorm(shape[-1], eps=1e-5)
    with torch.no_grad():
        stock.weight.copy_(w)
    ours = copy.deepcopy(stock)
    assert norm.fused_rms_norm(ours) == 1
    ref = _grads(lambda a, b: _formula(a, b, 1e-5), x.double(), w.double(), g.double())
    outs = []
    for m in (stock, ours):
        xi = x.clone().requires_grad_(True)
        y = m(xi)
        outs.append((y.detach(), type(y.grad_fn).__name__))
        y.backward(g)
        outs[-1] = outs[-1][:1] + (xi.grad, m.weight.grad, outs[-1][1])
    (ys, gxs, gws, fs), (yo, gxo, gwo, fo) = outs
    assert fs != "_RMSNormBackward" and fo == "_RMSNormBackward"  # torch's graph, then our one node
    assert torch.equal(ys, yo)  # the same ops in the same order
    assert torch.equal(gws, gwo)  # the same products, summed over the same rows
    # the input gradient sums in another order: no further from float64 than torch's own, beyond fp32 rounding
    err_stock = (gxs.double() - ref[1]).abs().max().item()
    err_ours = (gxo.double() - ref[1]).abs().max().item()
    assert err_ours <= 2 * err_stock + 4 * EPS32 * ref[1].abs().max().item(), (err_ours, err_stock)


def test_a_models_gradients_through_the_trainers_forward(tiny_model):
    from transformers import AutoModelForCausalLM

    stock = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    ours = copy.deepcopy(stock)
    assert norm.fused_rms_norm(ours) == 2 * stock.config.num_hidden_layers + 1
    ref = copy.deepcopy(stock).double()  # float64 throughout: the stock norm would compute in float32
    for m in ref.modules():
        if isinstance(m, LlamaRMSNorm):
            m.forward = lambda h, m=m: _formula(h, m.weight, m.variance_epsilon)
    ro = shared_prompt_rollout(0, stock.config.vocab_size)
    c_mask = ro.completion_mask
    res = []
    for m in (stock, ours, ref):
        f = forward(m, ro, 0.9, entropy_grad=True)
        ((f.logp * c_mask).sum() + 0.1 * (f.entropy * c_mask).sum()).backward()
        res.append((f.logp.detach(), {n: p.grad.double() for n, p in m.named_parameters()}))
    (lp_s, gs), (lp_o, go), (_, g64) = res
    assert torch.equal(lp_s, lp_o)  # forwards bitwise
    for name, want in g64.items():  # the backward: as close to float64 as torch's own, beyond fp32 rounding
        assert want.abs().sum() > 0
        err_stock, err_ours = ((g[name] - want).abs().max().item() for g in (gs, go))
        assert err_ours <= 2 * err_stock + 4 * EPS32 * want.abs().max().item(), (name, err_ours, err_stock)


def test_stock_path_without_a_gradient_under_autocast_or_in_other_dtypes():
    m = LlamaRMSNorm(8)
    assert norm.fused_rms_norm(m) == 1
    x = torch.randn(2, 8, requires_grad=True)
    assert type(m(x).grad_fn).__name__ == "_RMSNormBackward"  # ours
    with torch.no_grad():
        assert m(x).grad_fn is None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert type(m(x).grad_fn).__name__ != "_RMSNormBackward"
    assert type(m(x.double()).grad_fn).__name__ != "_RMSNormBackward"  # the stock upcast-to-float32 behaviour kept


def test_applied_only_to_llamas_formula():
    assert norm.fused_rms_norm(Qwen2RMSNorm(8)) == 1  # a copy of Llama's code
    assert norm.fused_rms_norm(Gemma2RMSNorm(8)) == 0  # (1 + weight), computed in float32: its own

    class Mine(LlamaRMSNorm):
        def forward(self, hidden_states):
            return hidden_states

    assert norm.fused_rms_norm(Mine(8)) == 0
    m = LlamaRMSNorm(8)
    m.forward = lambda x: x  # someone else's instance forward is left alone
    assert norm.fused_rms_norm(m) == 0
