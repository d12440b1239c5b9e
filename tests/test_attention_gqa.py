"""trainer/models/attention.py: grouped-query attention through torch's kernel instead of copied key/value heads.

Through the trainer's own forward (shared prompts, left padding): the log-probs and entropies are bitwise the
stock ones, and every gradient is as close to a float64 reference as the stock one is (the key/value gradients
sum the same per-head terms in another order). It is applied only to an SDPA model with grouped heads, leaves
checkpoints loadable without it, and load_models uses it for the policy and the reference.
"""
from __future__ import annotations

import copy
import json
import shutil

import pytest
import torch

from trainer.models.attention import NAME, gqa_in_kernel

pytestmark = pytest.mark.numerics  # float comparisons: CI runs them under a second CPU kernel path too


def _gqa_llama(dtype=torch.float32, kv_heads=2):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=97, hidden_size=96, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=6, num_key_value_heads=kv_heads, max_position_embeddings=128,
                      attn_implementation="sdpa")
    return LlamaForCausalLM(cfg).to(dtype)


def _rollout():
    from trainer.rollout import Rollout

    g = torch.Generator().manual_seed(1)
    P, T, B = 11, 7, 6  # two prompts, three rows each: the shared-prompt forward gathers the cache
    prompts = torch.randint(1, 97, (2, P), generator=g)
    p_mask = torch.ones(2, P, dtype=torch.long)
    p_mask[1, :4] = 0  # left padding
    idx = torch.tensor([0, 0, 0, 1, 1, 1])
    comp = torch.randint(1, 97, (B, T), generator=g)
    c_mask = torch.ones(B, T, dtype=torch.long)
    c_mask[2, 5:] = c_mask[4, 3:] = 0
    return Rollout(prompts[idx], p_mask[idx], comp, c_mask, [""] * B, torch.zeros(B, dtype=torch.bool))


def _run(model, ro, segments: bool = False):
    """The trainer's forward and backward; by default its two-call shared-prompt forward, whose attention calls
    this module's function with a padding mask (``segments``: one packed row, trainer/models/segments.py)."""
    from trainer.batch import forward

    model.zero_grad(set_to_none=True)
    model.rlvr_segments = segments
    f = forward(model, ro, 1.0, entropy_grad=True)
    w = torch.linspace(-1, 1, f.logp.numel(), dtype=f.logp.dtype).view_as(f.logp)
    ((f.logp * w).sum() + 0.1 * f.entropy.sum()).backward()
    return f.logp.detach(), f.entropy.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def _key_heads_seen(monkeypatch) -> list[int]:
    """The key/value heads each multi-token SDPA call was given (6: copied per query head; 2: grouped)."""
    seen, sdpa = [], torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, *a, **kw):
        if q.shape[2] > 1:
            seen.append(k.shape[1])
        return sdpa(q, k, v, *a, **kw)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    return seen


def test_same_outputs_and_gradients_as_copied_heads(monkeypatch):
    seen = _key_heads_seen(monkeypatch)
    stock = _gqa_llama()
    ours = gqa_in_kernel(copy.deepcopy(stock))
    assert ours.config._attn_implementation == NAME and stock.config._attn_implementation == "sdpa"
    ro = _rollout()
    ref = _run(copy.deepcopy(stock).double(), ro)  # float64, stock attention: the reference both are held to
    seen.clear()
    lp_s, ent_s, g_s = _run(stock, ro)
    assert seen and set(seen) == {6}
    seen.clear()
    lp_o, ent_o, g_o = _run(ours, ro)
    assert seen and set(seen) == {2}  # the kernel read each key/value head once, for its group
    assert torch.equal(lp_s, lp_o) and torch.equal(ent_s, ent_o)  # the forward reads the same numbers
    eps = torch.finfo(torch.float32).eps
    for name, want in ref[2].items():
        err_s = (g_s[name].double() - want).abs().max().item()
        err_o = (g_o[name].double() - want).abs().max().item()
        scale = want.abs().max().item()
        # as accurate as the stock path: within twice its error, or a few float32 roundings of the gradient's size
        assert err_o <= 2 * err_s + 16 * eps * scale, (name, err_o, err_s, scale)


def test_the_packed_row_reads_each_key_value_head_once_too(monkeypatch):
    """The packed row's attention (trainer/models/segments.py, the CPU default for a shared-prompt forward) gives
    the kernel the grouped heads as well, and its log-probs, entropies and gradients are as close to the float64
    reference as the stock attention's."""
    seen = _key_heads_seen(monkeypatch)
    stock = _gqa_llama()
    ro = _rollout()
    ref = _run(copy.deepcopy(stock).double(), ro)
    seen.clear()
    stock_out = _run(stock, ro)
    assert seen and set(seen) == {6}
    seen.clear()
    packed = _run(gqa_in_kernel(copy.deepcopy(stock)), ro, segments=True)
    assert seen and set(seen) == {2}  # the prompts' call and the completions', each with the grouped heads
    assert len(seen) == 2 * 2
    eps = torch.finfo(torch.float32).eps
    pairs = [(ref[0], stock_out[0], packed[0]), (ref[1], stock_out[1], packed[1])]
    pairs += [(ref[2][n], stock_out[2][n], packed[2][n]) for n in ref[2]]
    for want, s_, p_ in pairs:
        err_s, err_p = ((x.double() - want).abs().max().item() for x in (s_, p_))
        assert err_p <= 2 * err_s + 16 * eps * want.abs().max().item(), (err_p, err_s)


def test_applied_only_where_it_is_the_same_computation(monkeypatch):
    mha = _gqa_llama(kv_heads=6)  # every query head has its own key/value head: nothing to save
    assert gqa_in_kernel(mha).config._attn_implementation == "sdpa"
    eager = _gqa_llama()
    eager.set_attn_implementation("eager")
    assert gqa_in_kernel(eager).config._attn_implementation == "eager"
    bf16 = gqa_in_kernel(_gqa_llama(torch.bfloat16))  # switched, but bfloat16 calls take the stock function
    stock = _gqa_llama(torch.bfloat16)
    ro = _rollout()
    seen = _key_heads_seen(monkeypatch)
    _run(bf16, ro)
    assert seen and set(seen) == {6}
    assert all(torch.equal(a, b) for a, b in zip(_run(stock, ro)[:2], _run(bf16, ro)[:2]))
    assert all(torch.equal(a, b) for a, b in zip(_run(stock, ro)[2].values(), _run(bf16, ro)[2].values()))


def test_checkpoints_do_not_name_it_and_load_models_uses_it(tmp_path, tiny_model):
    from trainer.config import JobSpec
    from trainer.distributed import Dist
    from trainer.models.load import load_models

    model = gqa_in_kernel(_gqa_llama())
    model.save_pretrained(tmp_path)
    assert NAME not in (tmp_path / "config.json").read_text()  # loads anywhere, as plain SDPA
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_model / f, tmp_path / f)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["num_key_value_heads"] == 2
    spec = JobSpec.model_validate({"model": {"path": str(tmp_path)}, "algo": {"kl_coef": 0.1}})
    policy, ref, _ = load_models(spec, tmp_path, None, Dist())
    assert policy.config._attn_implementation == NAME and ref.config._attn_implementation == NAME
