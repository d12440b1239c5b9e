"""trainer/models/linear.py: linear weight gradients multiplied into ``.grad`` in place give the gradients torch's own
linear backward gives — every parameter, through the shared-prompt forward that uses each weight twice, over
micro-batches, from no ``.grad`` or an existing one, biases and frozen weights included — in float64 to rounding;
and it is applied only where it may be, and survives the sampler's packed layers."""
from __future__ import annotations

import copy

import pytest
import torch

from tests.conftest import shared_prompt_rollout
from trainer.batch import forward
from trainer.engines import packed
from trainer.models import embedding, linear

pytestmark = pytest.mark.numerics  # float comparisons: CI runs them under a second CPU kernel path too

EPS = torch.finfo(torch.float64).eps


@pytest.fixture(scope="module")
def tiny(tiny_model):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float64)


def _grads(model, rollouts, set_to_none: bool):
    model.zero_grad(set_to_none=set_to_none)
    for ro in rollouts:  # micro-batches: each backward adds into the last one's .grad
        f = forward(model, ro, 0.9, entropy_grad=True)
        m = ro.completion_mask.double()
        ((f.logp * m).sum() + 0.1 * (f.entropy * m).sum()).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _close(want: dict, got: dict) -> None:
    assert want.keys() == got.keys()
    for name in want:
        scale = max(1.0, want[name].abs().max().item())
        assert (want[name] - got[name]).abs().max().item() <= 64 * EPS * scale, name


@pytest.mark.parametrize("set_to_none", [True, False])
def test_the_same_gradients_as_torchs_linear_backward(tiny, set_to_none):
    ours = copy.deepcopy(tiny)
    n = linear.grad_in_place(ours)
    assert n == sum(type(m) is torch.nn.Linear for m in tiny.modules()) > 0  # the output layer included
    embedding.grad_in_place(ours)  # as the trainer loads a policy: both, on a tied table
    assert tiny.config.tie_word_embeddings
    rollouts = [shared_prompt_rollout(s, tiny.config.vocab_size) for s in range(3)]
    want, got = _grads(tiny, rollouts, set_to_none), _grads(ours, rollouts, set_to_none)
    _close(want, got)
    assert all(g.abs().sum() > 0 for g in got.values())


def test_bias_input_gradient_and_frozen_weights():
    g = torch.Generator().manual_seed(0)
    torch_side = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3)).double()
    torch_side[2].weight.requires_grad_(False)  # frozen (a LoRA base): its input gradient still flows
    ours = copy.deepcopy(torch_side)
    assert linear.grad_in_place(ours) == 2
    x = torch.randn(2, 4, 5, generator=g, dtype=torch.float64)
    grads = []
    for model in (torch_side, ours):
        xi = x.clone().requires_grad_(True)
        for _ in range(2):  # the same weights used twice in one graph, as the shared-prompt forward does
            y = model(xi) + model(xi.flip(1))
            y.pow(2).sum().backward()
        grads.append({"x": xi.grad, **{n: p.grad for n, p in model.named_parameters() if p.grad is not None}})
    want, got = grads
    assert set(want) == {"x", "0.weight", "0.bias", "2.bias"}
    _close(want, got)
    assert ours[2].weight.grad is None


def test_no_grad_forwards_and_weights_changed_before_the_backward(tiny):
    ours = copy.deepcopy(tiny)
    linear.grad_in_place(ours)
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():  # a reference / old-policy forward: F.linear, no graph
        assert not ours(input_ids=ids).logits.requires_grad
    out = ours(input_ids=ids).logits.sum()
    with torch.no_grad():
        ours.model.layers[0].mlp.up_proj.weight.add_(1.0)  # an optimiser step between forward and backward
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.backward()


def test_autocast_takes_torchs_backward():
    layer = torch.nn.Linear(8, 8)
    linear.grad_in_place(layer)
    x = torch.randn(4, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x)
    assert y.dtype == torch.bfloat16 and type(y.grad_fn).__name__ != "BackwardCFunction"
    y.float().sum().backward()
    assert layer.weight.grad is not None and layer.weight.grad.dtype == torch.float32


def test_applied_only_where_it_may_be():
    assert linear.grad_in_place(torch.nn.Linear(4, 4).bfloat16()) == 0  # float32 / float64 only

    class Mine(torch.nn.Linear):
        pass

    assert linear.grad_in_place(Mine(4, 4)) == 0  # a subclass may have its own forward
    m = torch.nn.Linear(4, 4)
    m.forward = lambda x: x  # someone else's instance forward is left alone
    assert linear.grad_in_place(m) == 0


def test_the_samplers_packed_layers_put_it_back():
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.Linear(512, 256))  # >= MIN_ENTRIES each
    assert linear.grad_in_place(model) == 2
    x = torch.randn(16, 256)
    assert packed.available()  # x86 wheels have MKL's packed GEMM
    with torch.no_grad():
        want = model(x)
        with packed.packed_linears(model, rows=16, always=True) as n:
            assert n == 2  # our training forward does not keep a layer from being packed
            assert all(not getattr(m.forward, "rlvr_grad_in_place", False) for m in model)
            got = model(x)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5)
    assert all(m.forward.__func__ is linear._forward for m in model)  # ours again after the call
