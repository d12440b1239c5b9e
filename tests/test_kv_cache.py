"""trainer/engines/kv.py: the sampler's KV cache written in place decodes bitwise what the concatenating cache
decodes — tokens and log-probs — through a shared few-shot prefix, finished rows dropped, a buffer that has to
grow, and stop strings; and a decode step copies no cache."""
from __future__ import annotations

import pytest
import torch

from trainer.data import arithmetic_split
from trainer.engines import HFEngine, kv as kvmod
from trainer.rollout import SamplingParams

pytestmark = pytest.mark.numerics  # float comparisons: CI runs them under a second CPU kernel path too


@pytest.fixture(scope="module")
def model_tok(tiny_model):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(tiny_model), AutoTokenizer.from_pretrained(tiny_model)


def _both(model, tok, prompts, n, params, **kw):
    out = []
    for inplace in (False, True):
        torch.manual_seed(7)
        out.append(HFEngine(model, tok, inplace_kv=inplace, **kw).generate(prompts, n, params))
    return out


def _same(a, b):
    assert torch.equal(a.completion_ids, b.completion_ids) and torch.equal(a.completion_mask, b.completion_mask)
    assert torch.equal(a.logprobs, b.logprobs) and a.texts == b.texts


@pytest.mark.parametrize("drop_finished", [0.25, 2.0])
def test_decodes_bitwise_what_the_concatenating_cache_decodes(model_tok, drop_finished):
    model, tok = model_tok
    _, held = arithmetic_split(400)
    prompts = [s["prompt"] for s in held[:6]]
    _same(*_both(model, tok, prompts, 4, SamplingParams(14, temperature=1.0), drop_finished=drop_finished))
    shots = [{"role": "user", "content": "What is 2 + 3?"}, {"role": "assistant", "content": "\\boxed{5}"}]
    fewshot = [shots + [{"role": "user", "content": p}] for p in prompts]  # the shared prefix, prefilled once
    _same(*_both(model, tok, fewshot, 3, SamplingParams(10, temperature=1.0, stop=("}",))))


def test_a_buffer_too_small_grows_and_a_step_copies_no_cache(model_tok, monkeypatch):
    model, tok = model_tok
    _, held = arithmetic_split(400)
    prompts = [s["prompt"] for s in held[:3]]
    real = kvmod.decode_cache
    grown, caches = [], []

    def small(model, capacity):  # room for half the call: the layers must grow mid-decode
        cache = real(model, capacity // 2)
        caches.append(cache)
        return cache

    monkeypatch.setattr("trainer.engines.hf.decode_cache", small)
    grow = kvmod.InPlaceLayer._grow
    monkeypatch.setattr(kvmod.InPlaceLayer, "_grow", lambda self, *a: grown.append(a[-1]) or grow(self, *a))
    a, b = _both(model, tok, prompts, 2, SamplingParams(12, temperature=1.0))
    _same(a, b)
    layers = [layer for layer in caches[0].layers if isinstance(layer, kvmod.InPlaceLayer)]
    assert layers and len(grown) >= 2 * len(layers)  # allocated once, grown at least once, per layer
    buf = layers[0]._k
    assert layers[0].keys.data_ptr() == buf.data_ptr()  # what attention read was a view of the buffer
