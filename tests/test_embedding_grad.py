"""trainer/models/embedding.py: the input embedding's gradient added into ``.grad`` in place gives the gradient
torch's own embedding backward gives — every parameter, tied output layer included, padding rows untouched, over
several calls and micro-batches — in float64 to rounding; and it is applied only where it may be."""
from __future__ import annotations

import copy

import pytest
import torch

from trainer.models.embedding import grad_in_place


@pytest.fixture(scope="module")
def tiny(tiny_model):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float64)


def _grads(model, batches):
    model.zero_grad(set_to_none=False)
    for ids in batches:  # several calls: the shared-prompt forward embeds prompts and completions apart
        (model(input_ids=ids).logits.pow(2).mean()).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def test_the_same_gradient_as_torchs_embedding_backward(tiny):
    assert tiny.config.tie_word_embeddings  # the table is also the output layer: two paths into one .grad
    ours = copy.deepcopy(tiny)
    assert grad_in_place(ours)
    pad = tiny.get_input_embeddings().padding_idx
    g = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, tiny.config.vocab_size, (3, 7), generator=g) for _ in range(3)]
    batches[0][:, :2] = pad  # left padding
    want, got = _grads(tiny, batches), _grads(ours, batches)
    for name in want:
        scale = max(1.0, want[name].abs().max().item())
        assert (want[name] - got[name]).abs().max().item() <= 64 * torch.finfo(torch.float64).eps * scale, name
    emb = "model.embed_tokens.weight"
    assert got[emb].abs().sum() > 0
    # the padding row carries only the output layer's gradient (torch's embedding backward skips it): were the
    # embedding's rows added there too, it would differ by their sum
    assert torch.equal(want[emb][pad], got[emb][pad])


def test_set_to_none_grads_and_no_grad_forwards(tiny):
    ours = copy.deepcopy(tiny)
    grad_in_place(ours)
    ours.zero_grad(set_to_none=True)  # no .grad yet: the backward makes one, the tied layer adds to it
    ids = torch.tensor([[1, 2, 3, 4]])
    ours(input_ids=ids).logits.sum().backward()
    ref = copy.deepcopy(tiny)
    ref.zero_grad(set_to_none=True)
    ref(input_ids=ids).logits.sum().backward()
    w, r = ours.get_input_embeddings().weight.grad, ref.get_input_embeddings().weight.grad
    assert (w - r).abs().max() <= 64 * torch.finfo(torch.float64).eps * r.abs().max()
    with torch.no_grad():  # an old-policy / reference forward: plain embedding, no graph
        assert not ours(input_ids=ids).logits.requires_grad


def test_applied_only_where_it_may_be(tiny):
    m = copy.deepcopy(tiny)
    m.get_input_embeddings().scale_grad_by_freq = True
    assert not grad_in_place(m)
    m = copy.deepcopy(tiny)
    m.get_input_embeddings().max_norm = 1.0
    assert not grad_in_place(m)
    assert not grad_in_place(torch.nn.Linear(2, 2))  # no input embedding at all


def test_the_trainer_loads_the_policy_with_it(tmp_path, models_dir):
    from trainer.config import JobSpec
    from trainer.distributed import Dist
    from trainer.models.load import load_models

    spec = JobSpec.model_validate({"model": {"path": "builtin:tiny-arith"}})
    policy, _, _ = load_models(spec, models_dir / "tiny-arith", None, Dist(0, 1, torch.device("cpu")))
    assert policy.get_input_embeddings().forward.__func__.__name__ == "_forward"
