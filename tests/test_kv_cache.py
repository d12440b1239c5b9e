"""trainer/engines/kv.py: the sampler's KV cache written in place decodes bitwise what the concatenating cache
decodes — tokens and log-probs — through a shared few-shot prefix, finished rows dropped, a buffer that has to
grow, and stop strings; and a decode step copies no cache. With each prompt's keys and values held once for its
group (``SharedPromptLayer``), attention and decoding are as close to a float64 reference as the stock ones, the
same tokens come out, and a decode step reads a prompt once per group; a float32 step's whole attention goes through
our kernel (trainer/engines/csrc/decode_attend.cpp), a float64 one's own keys and merge through the other
(decode_merge.cpp); both build here."""
from __future__ import annotations

from types import SimpleNamespace

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
        out.append(HFEngine(model, tok, inplace_kv=inplace, shared_prompts=False, **kw).generate(prompts, n, params))
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

    def small(model, capacity, *a):  # room for half the call: the layers must grow mid-decode
        cache = real(model, capacity // 2, *a)
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
    # a shared-prompt cache's per-row buffers grow the same way, and decode what a roomy one decodes
    grown.clear()
    torch.manual_seed(7)
    small_shared = HFEngine(model, tok).generate(prompts, 2, SamplingParams(12, temperature=1.0))
    shared = [layer for layer in caches[-1].layers if isinstance(layer, kvmod.SharedPromptLayer)]
    assert shared and all(layer.shared for layer in shared) and len(grown) >= 2 * len(shared)
    monkeypatch.setattr("trainer.engines.hf.decode_cache", real)
    torch.manual_seed(7)
    _same(small_shared, HFEngine(model, tok).generate(prompts, 2, SamplingParams(12, temperature=1.0)))


# ------------------------------------------------------------------ a prompt's keys and values once per group
def _shared_layer(G, n, Hkv, P, D, pad, dtype, steps, drop):
    """A SharedPromptLayer after a prefill of G prompts (left padding ``pad[g]``), ``steps`` decode positions and
    rows ``drop`` dropped; with the plain layout it stands for (each row: its prompt's copy, then its own keys)."""
    g = torch.Generator().manual_seed(0)
    layer = kvmod.SharedPromptLayer(P + steps)
    mask = torch.ones(G, P, dtype=torch.bool)
    for i, k in enumerate(pad):
        mask[i, :k] = False
    layer.update(*(torch.randn(G, Hkv, P, D, generator=g, dtype=dtype) for _ in "kv"))
    assert kvmod.share_prompts(SimpleNamespace(layers=[layer]), n, mask)
    for _ in range(steps):
        layer.update(*(torch.randn(G * n, Hkv, 1, D, generator=g, dtype=dtype) for _ in "kv"))
    keep = torch.tensor([r for r in range(G * n) if r not in drop])
    layer.batch_select_indices(keep)
    plain_k = torch.cat([layer.prompt_k.repeat_interleave(n, 0)[keep], layer.keys], 2)
    plain_v = torch.cat([layer.prompt_v.repeat_interleave(n, 0)[keep], layer.values], 2)
    plain_mask = torch.cat([mask.repeat_interleave(n, 0)[keep], torch.ones(len(keep), steps, dtype=torch.bool)], 1)
    return layer, plain_k, plain_v, plain_mask[:, None, None, :]


@pytest.fixture
def kernel_calls(monkeypatch):
    """Calls of our decode kernels (trainer/engines/csrc/decode_attend.cpp, decode_merge.cpp) as (which, dtype); both
    must build on this machine."""
    calls = []
    for name in ("decode_attend", "own_keys_merge"):
        real = getattr(kvmod.kernels, name)()
        assert real is not None  # g++ and ninja come with the machine and the venv: a fallback would prove nothing
        monkeypatch.setattr(kvmod.kernels, name,
                            lambda real=real, name=name: lambda *a: calls.append((name, a[0].dtype)) or real(*a))
    return calls


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("drop", [(), (1, 2, 9, 14)])
def test_shared_prompt_attention_is_as_close_to_float64_as_the_stock_attention(drop, native, kernel_calls):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    G, n, Hkv, grp, P, D = 3, 5, 3, 3, 37, 64
    layer, k, v, mask = _shared_layer(G, n, Hkv, P, D, pad=(0, 6, 11), dtype=torch.float32, steps=9, drop=drop)
    layer.native = native  # our kernel for the whole step, or torch's flash kernel twice and ~10 ops
    rows = G * n - len(drop)
    scale = D ** -0.5
    module = SimpleNamespace(num_key_value_groups=grp, is_causal=True)
    kd, vd = k.double().repeat_interleave(grp, 1), v.double().repeat_interleave(grp, 1)
    # Both are held to one bound: 16 float32 roundings of the output's scale, a few for each stage (the 64-term
    # scores, the exponentials, the 46-key sums, the normalisation). Over 4 draws of queries and both kernel paths
    # (AMD Zen 3, session 69), the stock kernel read 2.1-4.3 of them and the two-part softmax 3.6-7.9 (1.0-2.9x the
    # stock's on the same draw, with the kernel or flash x 2 + merge alike): a bound relative to one draw's stock
    # error failed on a draw where the stock kernel was luckily close. A wrong merge is off by the values' scale.
    for seed in range(1, 5):
        q = torch.randn(rows, Hkv * grp, 1, D, generator=torch.Generator().manual_seed(seed)) * 3  # peaked too
        ours = layer.attend(q, layer.keys, layer.values, scale)
        stock = sdpa_attention_forward(module, q, k, v, mask, scaling=scale)[0]
        w = (q.double() @ kd.transpose(-1, -2) * scale).masked_fill(~mask, float("-inf")).softmax(-1)
        ref = (w @ vd).transpose(1, 2)  # (rows, 1, Hq, D)
        assert ours.shape == stock.shape == ref.shape and ours.dtype == torch.float32
        err_ours, err_stock = (ours.double() - ref).abs().max().item(), (stock.double() - ref).abs().max().item()
        eps = torch.finfo(torch.float32).eps * ref.abs().max().item()
        assert 0 < err_stock < 16 * eps, seed  # the stock kernel itself is a few roundings off float64
        assert 0 < err_ours < 16 * eps, (seed, err_ours / eps, err_stock / eps)  # and the two-part softmax
    # in float64 the merge is exact up to float64 rounding: the same keys, masks and rows, nothing else
    layer64, *_ = _shared_layer(G, n, Hkv, P, D, pad=(0, 6, 11), dtype=torch.float64, steps=9, drop=drop)
    k64, v64 = layer64.prompt_k.repeat_interleave(n, 0), layer64.prompt_v.repeat_interleave(n, 0)
    keep = torch.tensor([r for r in range(G * n) if r not in drop])
    k64 = torch.cat([k64[keep], layer64.keys], 2).repeat_interleave(grp, 1)
    v64 = torch.cat([v64[keep], layer64.values], 2).repeat_interleave(grp, 1)
    w64 = (q.double() @ k64.transpose(-1, -2) * scale).masked_fill(~mask, float("-inf")).softmax(-1)
    layer64.native = native
    ours64 = layer64.attend(q.double(), layer64.keys, layer64.values, scale)
    assert torch.allclose(ours64, (w64 @ v64).transpose(1, 2), rtol=0, atol=1e-12)
    # float32: the whole step in decode_attend.cpp; float64: the prompt part in flash, the rest in decode_merge.cpp
    assert kernel_calls == ([("decode_attend", torch.float32)] * 4 + [("own_keys_merge", torch.float64)] if native
                            else [])
    # a call our path does not take (here: attention weights asked for) gets the per-row layout, not the
    # completion's keys alone
    from trainer.models.attention import SHARED_KV, _attention

    module.layer_idx = 0
    kw = {SHARED_KV: SimpleNamespace(layers=[layer]), "output_attentions": True}
    plain = _attention(module, q, layer.keys, layer.values, mask, scaling=scale, **kw)[0]
    assert plain.shape == ref.shape and (plain.double() - ref).abs().max().item() < 16 * eps
    # the sampler passes no mask to a shared-prompt decode step (engines/hf.py): that path builds the layer's own
    unmasked = _attention(module, q, layer.keys, layer.values, None, scaling=scale, **kw)[0]
    assert torch.equal(unmasked, plain)


def test_the_kernel_merges_any_prompt_part_with_strided_own_keys_as_one_softmax():
    """The kernel alone, against one float64 softmax over both parts' keys: key/value views of a longer buffer (the
    cache's), groups of query heads, one own key (a first decode step) and many, float32 and float64."""
    merge = kvmod.kernels.own_keys_merge()
    assert merge is not None
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    g = torch.Generator().manual_seed(3)
    rows, H, grp, D, P, cap = 7, 2, 3, 32, 6, 40
    for dtype in (torch.float32, torch.float64):
        for t in (1, 5, 33):
            q = torch.randn(rows, H, grp, D, generator=g, dtype=dtype) * 2
            kb, vb = (torch.randn(rows, H, cap, D, generator=g, dtype=dtype) for _ in "kv")
            k, v = kb[:, :, :t], vb[:, :, :t]
            pk, pv = (torch.randn(rows, H, P, D, generator=g, dtype=dtype) for _ in "kv")
            scale = D ** -0.5
            o1, l1 = flash(q, pk, pv, scale=scale)  # the prompt part, as attend gets it: output and log-sum-exp
            out = merge(q, k, v, o1, l1, scale)
            kk, vv = torch.cat([pk, k], 2).double(), torch.cat([pv, v], 2).double()
            ref = (q.double() @ kk.transpose(-1, -2) * scale).softmax(-1) @ vv
            stock = flash(q, torch.cat([pk, k], 2), torch.cat([pv, v], 2), scale=scale)[0]  # one kernel call, all keys
            assert out.shape == q.shape and out.dtype == dtype and out.is_contiguous()
            err, err_stock = (out.double() - ref).abs().max().item(), (stock.double() - ref).abs().max().item()
            eps = torch.finfo(dtype).eps * ref.abs().max().item()
            assert err <= 2 * err_stock + eps, (dtype, t, err, err_stock)  # measured 0.4-1x the stock error
    with pytest.raises(RuntimeError, match="one dtype"):
        merge(q, k.float(), v, o1, l1, scale)


@pytest.mark.parametrize("D", [32, 64, 128, 24])  # the tiny model's, SmolLM2's, larger models' head sizes; any other
def test_the_whole_step_kernel_is_one_softmax_over_both_parts(D):
    """decode_attend alone, against one float64 softmax over a row's prompt keys (its group's, padding masked by the
    bias) and its own: key/value views of longer buffers (the caches'), groups of query heads, rows of several
    groups in any order, one own key (a first decode step), many, and none."""
    attend = kvmod.kernels.decode_attend()
    assert attend is not None
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    g = torch.Generator().manual_seed(5)
    G, H, grp, P, cap = 3, 2, 3, 11, 40
    group = torch.tensor([2, 0, 0, 1, 2, 1, 0])
    rows = len(group)
    bias = torch.zeros(G, P)
    bias[0, :4] = bias[2, :1] = float("-inf")  # left padding of two of the prompts
    keep = torch.isfinite(bias)
    scale = D ** -0.5
    for t in (0, 1, 5, 33):
        q = torch.randn(rows, H, grp, D, generator=g) * 2
        pkb, pvb = (torch.randn(G, H, P + 3, D, generator=g) for _ in "kv")
        kb, vb = (torch.randn(rows, H, cap, D, generator=g) for _ in "kv")
        pk, pv, k, v = pkb[:, :, :P], pvb[:, :, :P], kb[:, :, :t], vb[:, :, :t]
        out = attend(q, pk, pv, bias, group, k, v, scale)
        assert out.shape == q.shape and out.dtype == torch.float32 and out.is_contiguous()
        for r in range(rows):
            gi = int(group[r])
            kk = torch.cat([pk[gi][:, keep[gi]], k[r]], 1).double()  # (H, keys, D)
            vv = torch.cat([pv[gi][:, keep[gi]], v[r]], 1).double()
            ref = (q[r].double() @ kk.transpose(-1, -2) * scale).softmax(-1) @ vv
            stock = flash(q[r:r + 1], kk[None].float(), vv[None].float(), scale=scale)[0][0]  # one call, all keys
            err, err_stock = (out[r].double() - ref).abs().max().item(), (stock.double() - ref).abs().max().item()
            eps = torch.finfo(torch.float32).eps * ref.abs().max().item()
            assert err <= 2 * err_stock + 4 * eps, (D, t, r, err / eps, err_stock / eps)
        # each (row, head) is one thread's, its sums in one order: the same bits at any thread count, in any batch
        many = [x.repeat(10, *([1] * (x.dim() - 1))) for x in (q, group, k, v)]  # 140 (row, head) pairs to split
        before = torch.get_num_threads()
        try:
            for threads in (1, 2):
                torch.set_num_threads(threads)
                got = attend(many[0], pk, pv, bias, many[1], many[2], many[3], scale)
                assert torch.equal(got, out.repeat(10, 1, 1, 1)), threads
        finally:
            torch.set_num_threads(before)
    with pytest.raises(RuntimeError, match="float32"):
        attend(q.double(), pk, pv, bias, group, k, v, scale)
    with pytest.raises(RuntimeError, match="group out of range"):
        attend(q, pk, pv, bias, group + 1, k, v, scale)
    with pytest.raises(RuntimeError, match="bias"):
        attend(q, pk, pv, bias[:, :-1], group, k, v, scale)


def test_where_the_kernel_cannot_build_decoding_takes_the_flash_path_and_says_why(monkeypatch):
    import torch.utils.cpp_extension as cpp

    def no_compiler(*a, **kw):
        raise OSError("no g++ here")

    native = kvmod.kernels
    loaders = (native.own_keys_merge, native.decode_attend)
    for f in loaders:
        f.cache_clear()
    try:
        monkeypatch.setattr(cpp, "load", no_compiler)
        for f in loaders:
            with pytest.warns(RuntimeWarning, match="no g\\+\\+ here"):
                assert f() is None
            f.cache_clear()
        monkeypatch.undo()
        monkeypatch.setenv("RLVR_NATIVE_KERNELS", "0")  # switched off: no build tried, no warning
        assert native.own_keys_merge() is None and native.decode_attend() is None
    finally:
        for f in loaders:
            f.cache_clear()
    G, n, Hkv, P, D = 2, 3, 2, 5, 16
    layer, k, v, mask = _shared_layer(G, n, Hkv, P, D, pad=(0, 2), dtype=torch.float32, steps=3, drop=())
    q = torch.randn(G * n, Hkv, 1, D)
    assert layer.attend(q, layer.keys, layer.values, None).shape == (G * n, 1, Hkv, D)  # flash for both parts
    monkeypatch.delenv("RLVR_NATIVE_KERNELS")
    for f in loaders:
        f.cache_clear()


def _logp64(model64, ro):
    """Each sampled token's log-prob under a float64 copy of the model, one forward over prompt + completion."""
    ids = torch.cat([ro.prompt_ids, ro.completion_ids], 1)
    attn = torch.cat([ro.prompt_mask, ro.completion_mask], 1)
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    P = ro.prompt_ids.shape[1]
    with torch.no_grad():
        logits = model64(input_ids=ids, attention_mask=attn, position_ids=pos).logits[:, P - 1 : -1]
    return logits.log_softmax(-1).gather(-1, ro.completion_ids[..., None])[..., 0] * ro.completion_mask


@pytest.mark.parametrize("drop_finished", [0.25, 2.0])
def test_shared_prompt_decoding_samples_the_same_tokens_as_close_to_float64(model_tok, drop_finished, monkeypatch,
                                                                           kernel_calls):
    import copy

    model, tok = model_tok
    _, held = arithmetic_split(400)
    shots = [{"role": "user", "content": "What is 2 + 3?"}, {"role": "assistant", "content": "\\boxed{5}"}]
    prompts = [shots + [{"role": "user", "content": s["prompt"]}] for s in held[:6]]  # shared prefix, padding
    caches, attends = [], []
    real, attend = kvmod.decode_cache, kvmod.SharedPromptLayer.attend
    monkeypatch.setattr("trainer.engines.hf.decode_cache", lambda *a: caches.append(real(*a)) or caches[-1])
    monkeypatch.setattr(kvmod.SharedPromptLayer, "attend", lambda self, *a: attends.append(self) or attend(self, *a))
    out = {}
    for shared in (False, True):
        torch.manual_seed(7)
        out[shared] = HFEngine(model, tok, shared_prompts=shared, drop_finished=drop_finished).generate(
            prompts, 8, SamplingParams(14, temperature=1.0))
    stock, ours = out[False], out[True]
    assert torch.equal(ours.completion_ids, stock.completion_ids) and ours.texts == stock.texts
    assert torch.equal(ours.completion_mask, stock.completion_mask)
    assert len(set(ours.texts)) > 6 and not ours.completion_mask.all()  # real samples; rows ended early
    model64 = copy.deepcopy(model).double()
    errs = [((ro.logprobs.double() - _logp64(model64, ro)).abs() * ro.completion_mask).max().item()
            for ro in (stock, ours)]
    assert 0 < errs[0] < 1e-4 and errs[1] <= 2 * errs[0]  # measured 7.0e-6 vs 3.4e-6 (avx2: 3.7e-6 vs 4.0e-6)
    # the stock call repeated each prompt 8 times; ours kept one copy and read it once per step and layer
    layers = [layer for layer in caches[1].layers]
    assert all(isinstance(layer, kvmod.SharedPromptLayer) and layer.shared for layer in layers)
    assert all(layer.prompt_k.shape[0] == len(prompts) for layer in layers)
    assert not any(getattr(layer, "shared", False) for layer in caches[0].layers)
    assert len(attends) == len(layers) * (ours.completion_ids.shape[1] - 1)  # every decode step, every layer
    assert len(kernel_calls) == len(attends)  # each of them through our kernel
    assert model.config._attn_implementation == "sdpa"  # ours only for the call


def test_shared_prompts_only_where_they_apply(model_tok, monkeypatch):
    import copy

    model, tok = model_tok
    _, held = arithmetic_split(400)
    prompts = [s["prompt"] for s in held[:4]]
    attends = []
    attend = kvmod.SharedPromptLayer.attend
    monkeypatch.setattr(kvmod.SharedPromptLayer, "attend", lambda self, *a: attends.append(self) or attend(self, *a))
    params = SamplingParams(10, temperature=1.0)

    def run(m, n, **kw):
        torch.manual_seed(3)
        return HFEngine(m, tok, **kw).generate(prompts, n, params)

    run(model, 1)  # a group of one: nothing to share
    eager = copy.deepcopy(model)
    eager.set_attn_implementation("eager")  # another attention: left as it is
    _same(run(eager, 4), run(eager, 4, shared_prompts=False))
    assert eager.config._attn_implementation == "eager"
    run(model, 4, inplace_kv=False)  # the concatenating cache has no shared layers
    assert attends == []
    run(model, 4)
    assert attends
    # a cache with any other kind of layer (a sliding window's) keeps the per-row copies
    mixed = SimpleNamespace(layers=[kvmod.SharedPromptLayer(8), object()])
    assert not kvmod.share_prompts(mixed, 2, torch.ones(1, 4, dtype=torch.bool))
