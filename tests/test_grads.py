"""trainer/models/grads.py: a step that marks the in-place writers' gradient buffers stale instead of zeroing them
gives the gradients a step from no buffers gives, bit for bit, whatever the stale buffers held (NaN included);
autograd's own accumulator reaching a stale buffer, and a buffer no write reaches, read as a zeroed one would."""
from __future__ import annotations

import pytest
import torch

from tests.conftest import shared_prompt_rollout
from trainer.batch import forward
from trainer.models import grads
from trainer.models.load import grads_in_place

pytestmark = pytest.mark.numerics  # CI runs them under a second CPU kernel path too


@pytest.fixture
def tiny(tiny_model):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float64)
    grads_in_place(model)  # as the trainer loads a policy
    return model


def _step(model, rollouts) -> dict[str, torch.Tensor]:
    for ro in rollouts:  # micro-batches: the first writes a buffer whole, the next add into it
        f = forward(model, ro, 0.9, entropy_grad=True)
        m = ro.completion_mask.double()
        ((f.logp * m).sum() + 0.1 * (f.entropy * m).sum()).backward()
    grads.finish(model.parameters())
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_stale_buffers_give_the_fresh_gradients_bit_for_bit(tiny):
    model = tiny  # loaded per test: a gradient left by another test would be read as this one's
    rollouts = [shared_prompt_rollout(s, model.config.vocab_size) for s in range(2)]
    model.zero_grad(set_to_none=True)
    want = _step(model, rollouts)
    assert want and all(g.abs().sum() > 0 for g in want.values())
    adopted = [n for n, p in model.named_parameters() if getattr(p, grads._OURS, False)]
    assert "model.embed_tokens.weight" in adopted and "model.layers.0.mlp.up_proj.weight" in adopted
    assert "model.norm.weight" not in adopted  # autograd's accumulator fills the norms': zeroed as before
    for p in model.parameters():
        p.grad.fill_(float("nan"))  # an earlier step's values, at their worst
    grads.zero(model.parameters())
    assert not model.model.norm.weight.grad.isnan().any()  # zeroed now
    assert model.model.layers[0].mlp.up_proj.weight.grad.isnan().all()  # left to its first write
    got = _step(model, rollouts)
    assert want.keys() == got.keys()
    for name in want:
        assert torch.equal(want[name], got[name]), name


def test_autograds_accumulator_on_a_stale_buffer_and_a_buffer_no_write_reaches():
    layer, skipped = torch.nn.Linear(4, 3).double(), torch.nn.Linear(4, 3).double()
    grads_in_place(torch.nn.ModuleList([layer, skipped]))
    params = [layer.weight, skipped.weight]
    for p in params:
        p.grad = torch.full_like(p, 7.0)
    grads.zero(params)
    x = torch.randn(2, 4, dtype=torch.float64)
    # the weight used outside its module: autograd's accumulator, not our writer, adds its gradient
    (x @ layer.weight.t()).pow(2).sum().backward()
    want = 2 * (x @ layer.weight.t()).t() @ x
    assert torch.allclose(layer.weight.grad, want.detach(), rtol=0, atol=1e-12)
    grads.finish(params)
    assert torch.equal(skipped.weight.grad, torch.zeros_like(skipped.weight))  # no write: zero, as zero_grad
    # the next step's first write to ``layer`` overwrites; a second adds
    grads.zero(params)
    layer(x).sum().backward()
    layer(x).sum().backward()
    assert torch.allclose(layer.weight.grad, 2 * x.sum(0).expand(3, 4), rtol=0, atol=1e-12)
