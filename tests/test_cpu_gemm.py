"""trainer/models/gemm.py: which library multiplies the training layers' float32 products, decided by a rule of the
CPU (and ``RLVR_CPU_GEMM``), and oneDNN's products agreeing with torch's to float32 rounding: each product within
the float32 error bound of its float64 sum, and a model's gradients through linear.py as close to float64's as
torch's own float32 ones are. Every oneDNN test forces oneDNN, so it runs on any x86 host, Intel's too."""
from __future__ import annotations

import copy

import pytest
import torch

from tests.conftest import shared_prompt_rollout
from trainer.batch import forward
from trainer.models import embedding, gemm, grads, linear

pytestmark = pytest.mark.numerics  # float comparisons: CI runs them under a second CPU kernel path too

EPS32 = torch.finfo(torch.float32).eps


@pytest.fixture
def decide(monkeypatch):
    """Decide again under a given CPU and environment (the choice is cached per process)."""
    def run(vendor: str, flags: set[str], env: str | None = None, family: int = 25) -> bool:
        monkeypatch.setattr(gemm, "cpu", lambda: (vendor, flags))
        monkeypatch.setattr(gemm, "family", lambda: family)
        if env is None:
            monkeypatch.delenv("RLVR_CPU_GEMM", raising=False)
        else:
            monkeypatch.setenv("RLVR_CPU_GEMM", env)
        gemm.min_entries.cache_clear()
        return gemm.onednn()

    yield run
    gemm.min_entries.cache_clear()


@pytest.fixture
def onednn(monkeypatch):
    assert gemm._has_onednn()  # every x86 torch wheel carries it
    monkeypatch.setattr(gemm, "min_entries", lambda: 0)  # every float32 product, as RLVR_CPU_GEMM=onednn


def test_onednn_where_mkl_would_not_run_the_cpus_avx512(decide):
    assert decide("AuthenticAMD", {"avx2", "avx512f"}) is True
    assert decide("GenuineIntel", {"avx2", "avx512f"}) is False  # MKL's own vendor: its AVX-512 kernels
    assert decide("AuthenticAMD", {"avx2"}) is False  # both libraries' AVX2 kernels: torch's stays
    assert decide("", set()) is False  # unknown (no /proc/cpuinfo)
    assert decide("GenuineIntel", {"avx2", "avx512f"}, "onednn") is True
    assert decide("AuthenticAMD", {"avx2", "avx512f"}, "MKL") is False
    assert decide("AuthenticAMD", {"avx2", "avx512f"}, "") is True  # empty: auto
    with pytest.raises(ValueError, match="RLVR_CPU_GEMM='blas'"):
        decide("AuthenticAMD", {"avx512f"}, "blas")


def test_small_weights_stay_in_mkl_unless_onednn_is_forced(decide):
    """oneDNN builds a kernel per new shape, and an update's row count is new at each step: a weight under
    MIN_ENTRIES (the tiny model's) stays in MKL under ``auto``; ``RLVR_CPU_GEMM=onednn`` takes every size."""
    x, small, big = torch.randn(3, 256), torch.randn(255, 256), torch.randn(256, 256)
    assert small.numel() < gemm.MIN_ENTRIES <= big.numel()

    def run(w):
        with torch.profiler.profile() as prof:
            y = gemm.linear(x, w)
        assert torch.allclose(y, x @ w.t(), rtol=0, atol=(256 * EPS32 * (x.abs() @ w.abs().t())).max().item())
        return any(e.name == "mkldnn::_linear_pointwise" for e in prof.events())

    assert decide("AuthenticAMD", {"avx2", "avx512f"}) is True
    assert gemm.min_entries() == gemm.MIN_ENTRIES
    assert not gemm.takes(x, small, entries=small.numel()) and gemm.takes(x, big, entries=big.numel())
    assert run(big) and not run(small)
    assert decide("AuthenticAMD", {"avx2", "avx512f"}, "onednn") is True and gemm.min_entries() == 0
    assert run(small) and run(big)
    assert decide("GenuineIntel", {"avx2", "avx512f"}) is False and gemm.min_entries() is None
    assert not run(big)


def test_every_size_in_onednn_where_avx512_runs_full_width(decide):
    """AMD's family 26 (Zen 5) and later: oneDNN's kernels pay for their per-shape build at every size there; an
    Intel CPU of any family keeps MKL, and an earlier AMD family the size bound."""
    assert decide("AuthenticAMD", {"avx2", "avx512f"}, family=26) is True and gemm.min_entries() == 0
    assert decide("AuthenticAMD", {"avx2", "avx512f"}, family=27) is True and gemm.min_entries() == 0
    assert decide("AuthenticAMD", {"avx2", "avx512f"}, family=25) is True
    assert gemm.min_entries() == gemm.MIN_ENTRIES
    assert decide("AuthenticAMD", {"avx2"}, family=26) is False  # no AVX-512: torch's stays
    assert decide("GenuineIntel", {"avx2", "avx512f"}, family=26) is False
    assert decide("AuthenticAMD", {"avx2", "avx512f"}, "mkl", family=26) is False


def test_the_cpus_family_is_read():
    assert gemm.family() > 0  # x86 Linux hosts: /proc/cpuinfo's "cpu family"


def test_this_machines_cpu_is_read():
    vendor, flags = gemm.cpu()
    assert vendor in ("GenuineIntel", "AuthenticAMD") and "sse2" in flags  # x86 Linux hosts: dev VM and CI


def _bound(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """float32's error bound of each entry of ``a @ b`` summed in any order: k * eps * (|a| @ |b|) (gamma_k)."""
    return a.shape[-1] * EPS32 * (a.double().abs() @ b.double().abs())


@pytest.mark.parametrize("rows", [0, 1, 7, 300])
def test_each_product_within_float32s_bound_of_its_exact_sum(onednn, rows):
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 96, generator=g)
    w, b = torch.randn(40, 96, generator=g), torch.randn(40, generator=g)
    dy, acc = torch.randn(rows, 40, generator=g), torch.randn(40, 96, generator=g)
    y = gemm.linear(x, w, b)
    exact = x.double() @ w.double().t() + b.double()
    assert ((y.double() - exact).abs() <= _bound(x, w.t()) + EPS32 * b.double().abs()).all()
    gx = gemm.input_grad(dy, w)
    assert gx.shape == (rows, 96) and ((gx.double() - dy.double() @ w.double()).abs() <= _bound(dy, w)).all()
    if rows == 0:  # a sum over no rows, which oneDNN refuses: the caller's addmm_ writes the zeros
        assert not gemm.takes(dy, x, entries=w.numel())
        return
    assert gemm.takes(dy, x, acc, entries=w.numel())
    gw = gemm.weight_grad(dy, x, None)
    assert ((gw.double() - dy.double().t() @ x.double()).abs() <= _bound(dy.t(), x)).all()
    summed = gemm.weight_grad(dy, x, acc)  # the sum so far added inside the product: one more rounding
    exact = acc.double() + dy.double().t() @ x.double()
    assert ((summed.double() - exact).abs() <= _bound(dy.t(), x) + EPS32 * exact.abs()).all()
    assert summed.data_ptr() != acc.data_ptr() and torch.equal(acc, acc.clone())  # acc is read, not written


def test_three_dimensional_and_strided_inputs(onednn):
    g = torch.Generator().manual_seed(1)
    w = torch.randn(24, 32, generator=g)
    x = torch.randn(5, 3, 32, generator=g).transpose(0, 1)  # (3, 5, 32), not contiguous
    y = gemm.linear(x, w)
    assert y.shape == (3, 5, 24)
    assert torch.allclose(y, x @ w.t(), rtol=0, atol=(32 * EPS32 * (x.abs() @ w.abs().t())).max().item())
    dy = torch.randn(1, 24, generator=g).expand(6, 24)  # stride 0: as autograd hands a sum's gradient back
    assert torch.allclose(gemm.input_grad(dy, w), dy @ w, rtol=0, atol=(24 * EPS32 * (dy.abs() @ w.abs())).max().item())


def test_other_dtypes_and_mkl_take_torchs_ops(onednn, monkeypatch):
    x, w = torch.randn(4, 8, dtype=torch.float64), torch.randn(3, 8, dtype=torch.float64)
    assert torch.equal(gemm.linear(x, w), torch.nn.functional.linear(x, w))
    assert not gemm.takes(torch.randn(4, 3, dtype=torch.float64), x, entries=24)  # the caller's addmm_
    x32, w32 = x.float(), w.float()
    assert gemm.takes(torch.randn(4, 3), x32, entries=24)
    monkeypatch.setattr(gemm, "min_entries", lambda: None)
    assert torch.equal(gemm.linear(x32, w32), torch.nn.functional.linear(x32, w32))
    assert not gemm.takes(torch.randn(4, 3), x32, entries=24)


def _model_grads(model, rollouts, stale: bool):
    if stale:  # a step after the first: buffers kept, marked stale, overwritten by the first product (grads.py)
        grads.zero(model.parameters())
    else:
        model.zero_grad(set_to_none=True)
    for ro in rollouts:  # micro-batches: the second and third add into the first's sum
        f = forward(model, ro, 0.9, entropy_grad=True)
        m = ro.completion_mask.to(f.logp.dtype)
        ((f.logp * m).sum() + 0.1 * (f.entropy * m).sum()).backward()
    grads.finish(model.parameters())
    return {n: p.grad.double().clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("stale", [False, True])
def test_a_models_gradients_as_close_to_float64s_as_torchs_float32_ones(tiny_model, onednn, stale):
    """The shared-prompt forward (each weight used twice), three micro-batches, the tied output layer: oneDNN's
    float32 gradients through linear.py against torch's own float32 ones, both against float64's, over 4 draws of
    batches. The tolerance is torch's float32 spread, measured: its worst over every tensor and draw, relative to each
    tensor's largest entry. The attention's query and key projections are ill-conditioned on the tiny model: one
    draw's worst tensor reads 5-85 eps for either library, as the rounding falls (Zen 4 host, session 70, both kernel
    paths, flash or math attention); per draw ours read up to 5.1x torch's worst of that path, so the bound is 8x it
    plus 8 eps. A wrong product (a transposed operand, a stale sum, a bf16 accumulation) is off by far more."""
    from transformers import AutoModelForCausalLM

    truth_model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float64)
    stock = copy.deepcopy(truth_model).float()
    ours = copy.deepcopy(stock)
    linear.grad_in_place(ours)
    embedding.grad_in_place(ours)
    errors, spread = [], 0.0
    for draw in range(4):
        rollouts = [shared_prompt_rollout(3 * draw + s, truth_model.config.vocab_size) for s in range(3)]
        if stale:  # buffers left by an earlier step, holding values the first product must not read
            for m in (ours, stock, truth_model):
                _model_grads(m, rollouts[:1], stale=False)
        truth = _model_grads(truth_model, rollouts, stale)
        want, got = _model_grads(stock, rollouts, stale), _model_grads(ours, rollouts, stale)
        assert truth.keys() == want.keys() == got.keys()
        assert all(g.abs().sum() > 0 for g in got.values())
        scale = {n: truth[n].abs().max().item() for n in truth}
        spread = max(spread, *((want[n] - truth[n]).abs().max().item() / scale[n] for n in truth))
        errors += [(draw, n, (got[n] - truth[n]).abs().max().item() / scale[n]) for n in truth]
    for draw, name, err in errors:
        assert err <= 8 * spread + 8 * EPS32, (draw, name, err / EPS32, spread / EPS32)


def test_a_forward_without_a_graph_and_a_frozen_weights_input_gradient_take_it(onednn, monkeypatch):
    layer = torch.nn.Linear(16, 8)
    linear.grad_in_place(layer)
    x = torch.randn(4, 16)
    calls, real_linear, real_input_grad = [], gemm.linear, gemm.input_grad
    monkeypatch.setattr(gemm, "linear", lambda *a: calls.append("linear") or real_linear(*a))
    monkeypatch.setattr(gemm, "input_grad", lambda *a: calls.append("input_grad") or real_input_grad(*a))
    with torch.no_grad():
        want = torch.nn.functional.linear(x, layer.weight, layer.bias)
        got = layer(x)
    assert calls == ["linear"] and torch.allclose(got, want, rtol=0, atol=1e-5)
    layer.weight.requires_grad_(False)  # a LoRA base: the graph carries the input's (and the bias's) gradient
    xi = x.clone().requires_grad_(True)
    layer(xi).pow(2).sum().backward()
    assert calls == ["linear", "linear", "input_grad"] and layer.weight.grad is None
    xt, bt = x.clone().requires_grad_(True), layer.bias.detach().clone().requires_grad_(True)
    torch.nn.functional.linear(xt, layer.weight, bt).pow(2).sum().backward()  # torch's, for the values
    assert torch.allclose(xi.grad, xt.grad, rtol=1e-5, atol=1e-5)
    assert torch.allclose(layer.bias.grad, bt.grad, rtol=1e-5, atol=1e-5)


def test_a_stale_buffer_is_replaced_and_a_strided_sum_added_into_by_torch(onednn):
    layer = torch.nn.Linear(16, 8, bias=False)
    linear.grad_in_place(layer)
    x = torch.randn(5, 16)
    want = torch.ones(5, 8).t().mm(x)  # the weight's gradient of the sum: torch's, to compare
    layer.weight.grad = torch.full((16, 8), float("nan")).t()  # strided, and stale: never read
    grads.zero([layer.weight])
    layer(x).sum().backward()
    assert layer.weight.grad.is_contiguous() and torch.allclose(layer.weight.grad, want, rtol=1e-6, atol=1e-5)
    strided = torch.ones(16, 8).t()  # live, strided: oneDNN cannot add into it, torch's addmm_ does, in place
    layer.weight.grad = strided
    layer(x).sum().backward()
    assert layer.weight.grad is strided and torch.allclose(strided, want + 1, rtol=1e-6, atol=1e-5)
