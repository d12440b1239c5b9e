"""The gated MLP's activation in one pass each way (trainer/models/mlp.py, csrc/swiglu.cpp) against torch's
silu(g) * u: values and both gradients checked against float64 autograd, no further from it than torch's float32
ops are (twice their error plus one rounding of the scale, measured per draw, not picked)."""
from __future__ import annotations

import pytest
import torch

from trainer.engines import native
from trainer.models import mlp

pytestmark = pytest.mark.numerics


def _tiny_llama(seed=0, layers=2):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=88, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return LlamaForCausalLM(cfg).float()


def _errors(g, u, w):
    """max |x - float64| of (h, dL/dg, dL/du) for L = sum(h * w): the kernel's, then torch's float32 ops'."""
    out = []
    for fn, dt in ((None, torch.float64), ("ours", torch.float32), ("torch", torch.float32)):
        a, b = g.detach().to(dt).requires_grad_(), u.detach().to(dt).requires_grad_()
        if fn == "ours":
            h = mlp._SwiGLU.apply(a, b, native.swiglu())
        else:
            h = torch.nn.functional.silu(a) * b
        ga, gb = torch.autograd.grad((h * w.to(dt)).sum(), (a, b))
        out.append((h.detach(), ga, gb))
    truth, ours, stock = out
    err = lambda xs: [(x.double() - t).abs().max().item() for x, t in zip(xs, truth)]  # noqa: E731
    return err(ours), err(stock), [t.abs().max().item() for t in truth]


@pytest.mark.parametrize("n", [1, 7, 8, 1000, 3 * (1 << 14) + 5])
def test_kernel_within_float32_rounding_of_float64(n):
    """Lengths under, at and past the 8 lanes and the threads' 16k-element grain; gates from -100 to 100 (both
    saturations) and around 0."""
    assert native.swiglu() is not None, "the kernel must build here (make setup builds it)"
    eps = torch.finfo(torch.float32).eps
    for seed in range(4):
        gen = torch.Generator().manual_seed(seed)
        g = torch.randn(n, generator=gen) * (4 if seed < 2 else 30)
        edges = torch.tensor([-100.0, 100.0, 0.0, -88.5, 88.5])
        k = min(n, 5)
        g[:k] = edges[:k]
        u, w = torch.randn(n, generator=gen), torch.randn(n, generator=gen)
        ours, stock, scale = _errors(g, u, w)
        for name, e, r, sc in zip(("h", "dL/dg", "dL/du"), ours, stock, scale):
            assert e <= 2 * r + eps * sc, (name, seed, e, r, sc)


def test_a_llama_mlp_gives_the_stock_outputs_and_gradients():
    """A Llama model's MLPs patched: its loss and every weight's gradient within float32 rounding of the stock
    model's, both against float64; the no-graph forward the same bits as the graph's."""
    stock = _tiny_llama()
    ours = _tiny_llama()
    assert mlp.fused_swiglu(ours) == 2 and mlp.fused_swiglu(ours) == 0  # once per module
    exact = _tiny_llama().double()
    ids = torch.randint(0, 97, (3, 11), generator=torch.Generator().manual_seed(1))
    grads = []
    for m in (exact, stock, ours):
        m.zero_grad()
        out = m(input_ids=ids, labels=ids)
        out.loss.backward()
        grads.append((out.logits.detach(), {n: p.grad.clone() for n, p in m.named_parameters()}))
    (t_logits, t_g), (s_logits, s_g), (o_logits, o_g) = grads
    eps = torch.finfo(torch.float32).eps
    err = lambda a, t: (a.double() - t).abs().max().item()  # noqa: E731
    assert err(o_logits, t_logits) <= 2 * err(s_logits, t_logits) + eps * t_logits.abs().max().item()
    for n in t_g:
        sc = t_g[n].abs().max().item()
        assert err(o_g[n], t_g[n]) <= 2 * err(s_g[n], t_g[n]) + 4 * eps * sc, n
    with torch.no_grad():
        assert torch.equal(ours(input_ids=ids).logits, o_logits)
    assert any("SwiGLU" in type(f).__name__ for f in _graph_nodes(ours, ids))


def _graph_nodes(model, ids):
    out = model(input_ids=ids).logits.sum()
    seen, stack = [], [out.grad_fn]
    while stack:
        f = stack.pop()
        if f is None or f in seen:
            continue
        seen.append(f)
        stack += [n for n, _ in f.next_functions]
    return seen


def _cfg(**kw):
    from transformers import LlamaConfig

    return LlamaConfig(hidden_size=8, intermediate_size=16, num_attention_heads=2, num_key_value_heads=2, **kw)


def test_what_it_leaves_stock():
    """Another activation, an MLP of other code, float64 activations, and a host without the kernel run the
    stock forward."""
    from transformers.models.llama.modeling_llama import LlamaMLP

    gelu = LlamaMLP(_cfg(hidden_act="gelu"))
    assert mlp.fused_swiglu(gelu) == 0

    class Mine(LlamaMLP):
        def forward(self, x):
            return self.down_proj(self.up_proj(x))

    assert mlp.fused_swiglu(Mine(_cfg())) == 0
    m = LlamaMLP(_cfg())
    stock = LlamaMLP.forward
    x = torch.randn(2, 3, 8, dtype=torch.float64)
    m64 = m.double()
    assert mlp.fused_swiglu(m64) == 1
    assert torch.equal(m64(x), stock(m64, x))  # float64: the stock ops


def test_without_the_kernel_the_stock_forward(monkeypatch):
    from transformers.models.llama.modeling_llama import LlamaMLP

    m = LlamaMLP(_cfg())
    mlp.fused_swiglu(m)
    x = torch.randn(2, 3, 8)
    monkeypatch.setattr(native, "swiglu", lambda: None)
    assert torch.equal(m(x), LlamaMLP.forward(m, x))
