"""trainer/models/rope.py: the rotary embedding with its backward written out gives bitwise torch's outputs and
gradients — alone (grouped heads, per-row positions) and through the trainer's forward of a whole model — and is
taken only for float32 CPU tensors with a gradient wanted; it is installed once, only where the code is Llama's."""
from __future__ import annotations

import copy
import types

import pytest
import torch
from transformers.models.llama import modeling_llama as llama

from tests.conftest import shared_prompt_rollout
from trainer.batch import forward
from trainer.models import rope

pytestmark = pytest.mark.numerics  # float comparisons: CI runs them under a second CPU kernel path too


@pytest.fixture
def stock_module(monkeypatch):
    """modeling_llama as transformers ships it, whatever an earlier test (or trainer load) installed; put back."""
    fn = llama.apply_rotary_pos_emb
    monkeypatch.setattr(llama, "apply_rotary_pos_emb", getattr(fn, "rlvr_stock", fn))
    return llama


def _cos_sin(B: int, T: int, D: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    pos = torch.randint(0, 64, (B, T), generator=g)  # per-row positions, as left padding gives
    inv = 1.0 / (10000 ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
    emb = torch.cat([pos[..., None] * inv] * 2, -1)
    return emb.cos(), emb.sin()


@pytest.fixture(params=["kernel", "torch_ops"])
def path(request, monkeypatch):
    """csrc/rope.cpp (its calls counted), or torch's ops (rope.ENABLED off): both give torch's bits."""
    from trainer.engines import native

    calls = []
    if request.param == "kernel":
        kernel = native.rope()
        assert kernel is not None, "the kernel must build here (make setup builds it)"
        counted = types.SimpleNamespace(forward=lambda *a: calls.append(1) or kernel.forward(*a))
        monkeypatch.setattr(native, "rope", lambda: counted)
    else:
        monkeypatch.setattr(rope, "ENABLED", False)
    return request.param, calls


def _run(fn, q0, k0, cos, sin, gq, gk):
    q, k = q0.clone().requires_grad_(True), k0.clone().requires_grad_(True)
    a, b = fn(q, k, cos, sin)
    torch.autograd.backward((a, b), (gq, gk))
    return a.detach(), b.detach(), q.grad, k.grad


# the first two below rope.IN_PLACE_FROM elements (the stock expression), the others above it (_rotate in place)
@pytest.mark.parametrize("B,H,Hk,T,D", [(3, 4, 4, 5, 32), (2, 9, 3, 7, 64), (16, 9, 3, 24, 64), (1, 9, 3, 420, 64)])
def test_bitwise_torchs_outputs_and_gradients(stock_module, path, B, H, Hk, T, D):
    g = torch.Generator().manual_seed(B * T)
    q, k = torch.randn(B, H, T, D, generator=g), torch.randn(B, Hk, T, D, generator=g)
    gq, gk = torch.randn(B, H, T, D, generator=g), torch.randn(B, Hk, T, D, generator=g)
    cos, sin = _cos_sin(B, T, D, 0)
    stock = stock_module.apply_rotary_pos_emb
    ours = rope._wrap(stock)
    want, got = _run(stock, q, k, cos, sin, gq, gk), _run(ours, q, k, cos, sin, gq, gk)
    for a, b in zip(want, got):
        assert torch.equal(a, b)
    assert got[2].abs().sum() > 0 and got[3].abs().sum() > 0
    assert len(path[1]) == (path[0] == "kernel")


@pytest.mark.parametrize("shape,in_place", [((1, 9, 836, 64), True), ((256, 9, 1, 64), True), ((32, 9, 1, 64), False),
                                            ((2, 4, 3, 8), False), ((1, 9, 64, 64), False)])
def test_without_a_graph_bitwise_the_stock_rotation(stock_module, path, shape, in_place):
    """A reference's, a teacher's or a sampler's forward (no graph) takes the kernel, or the in-place rotation above
    its size and the stock expression below it: either way torch's bits, for queries laid out as a layer's
    projection gives them (positions before heads in memory) and one cos/sin for the whole batch too."""
    B, H, T, D = shape
    g = torch.Generator().manual_seed(T)
    q, k = torch.randn(B, T, H, D, generator=g).transpose(1, 2), torch.randn(B, 3, T, D, generator=g)
    cos, sin = _cos_sin(B, T, D, 2)
    assert (q.numel() >= rope.IN_PLACE_FROM and D % 2 == 0) == in_place
    stock = stock_module.apply_rotary_pos_emb
    with torch.no_grad():
        want, got = stock(q, k, cos, sin), rope._wrap(stock)(q, k, cos, sin)
    for a, b in zip(want, got):
        assert a.shape == b.shape and torch.equal(a, b)
    assert not torch.equal(got[0], q)  # it rotated
    cos1, sin1 = cos[:1], sin[:1]  # one row's positions for every row
    with torch.no_grad():
        for a, b in zip(stock(q, k, cos1, sin1), rope._wrap(stock)(q, k, cos1, sin1)):
            assert torch.equal(a, b)
    assert len(path[1]) == (2 if path[0] == "kernel" else 0)


def test_a_models_gradients_through_the_trainers_forward(stock_module, tiny_model, monkeypatch):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    ro = shared_prompt_rollout(0, model.config.vocab_size)
    c_mask = ro.completion_mask
    calls = []

    class Counted(rope._Rope):
        @classmethod
        def apply(cls, *args):
            calls.append(1)
            return super().apply(*args)

    monkeypatch.setattr(rope, "_Rope", Counted)
    res = []
    for install in (False, True):
        m = copy.deepcopy(model)
        if install:
            assert rope.fused_rope(m) == 1 and hasattr(stock_module.apply_rotary_pos_emb, "rlvr_stock")
        f = forward(m, ro, 0.9, entropy_grad=True)
        ((f.logp * c_mask).sum() + 0.1 * (f.entropy * c_mask).sum()).backward()
        res.append((f.logp.detach(), {n: p.grad for n, p in m.named_parameters()}))
        # one packed row of prompts and completions (trainer/models/segments.py): one call a layer
        assert len(calls) == (m.config.num_hidden_layers if install else 0)
    (lp_s, gs), (lp_o, go) = res
    assert torch.equal(lp_s, lp_o)
    for name, a in gs.items():
        assert torch.equal(a, go[name]), name


def test_stock_path_without_a_gradient_under_autocast_or_in_other_dtypes(stock_module):
    ours = rope._wrap(stock_module.apply_rotary_pos_emb)
    q, k = torch.randn(2, 4, 3, 8, requires_grad=True), torch.randn(2, 4, 3, 8, requires_grad=True)
    cos, sin = _cos_sin(2, 3, 8, 1)
    assert type(ours(q, k, cos, sin)[0].grad_fn).__name__ == "_RopeBackward"
    with torch.no_grad():
        assert ours(q, k, cos, sin)[0].grad_fn is None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert type(ours(q, k, cos, sin)[0].grad_fn).__name__ != "_RopeBackward"
    qd, kd = q.detach().double().requires_grad_(), k.detach().double().requires_grad_()
    assert type(ours(qd, kd, cos.double(), sin.double())[0].grad_fn).__name__ != "_RopeBackward"
    learned = cos.clone().requires_grad_(True)  # a cos that wants a gradient: torch's graph gives it one
    out = ours(q, k, learned, sin)
    assert type(out[0].grad_fn).__name__ != "_RopeBackward"
    out[0].sum().backward()
    assert learned.grad is not None


def test_installed_once_and_only_where_the_code_is_llamas(stock_module, monkeypatch):
    model = torch.nn.Module()
    model.attn = llama.LlamaAttention(llama.LlamaConfig(hidden_size=32, num_attention_heads=4), 0)
    assert rope.fused_rope(model) == 1
    first = stock_module.apply_rotary_pos_emb
    assert rope.fused_rope(model) == 1 and stock_module.apply_rotary_pos_emb is first  # not wrapped twice
    assert first.rlvr_stock is not first and not hasattr(first.rlvr_stock, "rlvr_stock")

    other = types.ModuleType("rlvr_test_interleaved_rope")  # Llama's apply, an interleaved rotate_half (GLM-like)
    other.apply_rotary_pos_emb = lambda q, k, cos, sin, unsqueeze_dim=1: (q, k)
    other.rotate_half = lambda x: torch.stack((-x[..., 1::2], x[..., ::2]), -1).flatten(-2)
    monkeypatch.setitem(__import__("sys").modules, other.__name__, other)

    class Layer(torch.nn.Module):
        pass

    Layer.__module__ = other.__name__
    assert rope.fused_rope(Layer()) == 0 and not hasattr(other.apply_rotary_pos_emb, "rlvr_stock")
    other.apply_rotary_pos_emb = first.rlvr_stock  # Llama's very apply, still an interleaved rotate_half
    other.rotate_half = lambda x: torch.stack((-x[..., 1::2], x[..., ::2]), -1).flatten(-2)
    assert rope.fused_rope(Layer()) == 0
