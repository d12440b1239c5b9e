"""trainer/engines/packed.py: the sampler's linear layers on weights packed once per call.

Inside the block every eligible layer gives F.linear's product to float32 rounding for any row count, in each
packed kind (MKL's, oneDNN's), a call that needs a gradient gets the stock op (and its gradient), hooked and
non-float32 layers are left alone, and leaving the block restores every layer. The kind that gains most over the
call is chosen from timings over a shape's layers in turn. The sampler with packing draws the tokens it draws
without.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from trainer.engines import packed as pk

pytestmark = [pytest.mark.numerics,  # float comparisons: CI runs them under a second CPU kernel path too
              pytest.mark.skipif(not pk.available(), reason="no MKL in this torch build: the sampler uses F.linear")]


def _net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(192, 384), torch.nn.SiLU(), torch.nn.Linear(384, 192, bias=False))


def _tol(x, w, b=None):
    """float32 rounding of a K-term dot product: K eps of the sum of |terms| (a bound, not a fit)."""
    bound = x.abs() @ w.abs().T + (b.abs() if b is not None else 0)
    return x.shape[-1] * torch.finfo(torch.float32).eps * bound


KINDS = pk.kinds()
PRODUCTS = {"mkl": "mkl::_mkl_linear", "onednn": "mkldnn::_linear_pointwise"}


def test_this_build_has_both_packed_kinds():
    assert KINDS == ["mkl", "onednn"]  # x86 wheels: where one is missing the other tests here cover less


@pytest.mark.parametrize("kind", KINDS)
def test_packed_products_match_f_linear_at_every_row_count(kind):
    net = _net()
    lin = net[0]
    for rows in (0, 1, 3, 8, 16, 24, 31, 32, 33, 257):  # MKL's 8-31: padded up to the 32 rows it is packed for
        x = torch.randn(rows, 192)
        want = F.linear(x, lin.weight, lin.bias)
        with torch.no_grad(), pk.packed_linears(net, rows=32, always=True, kind=kind) as n:
            assert n == 2 and "forward" in vars(lin)
            got = lin(x)
        assert ((got - want).abs() <= _tol(x, lin.weight, lin.bias)).all(), rows
        assert got.shape == want.shape
    x3 = torch.randn(4, 7, 192)  # (batch, positions, width) as a model calls it
    with torch.no_grad(), pk.packed_linears(net, rows=4, always=True, kind=kind):
        got = lin(x3)
    assert got.shape == (4, 7, 384) and ((got - lin(x3).detach()).abs() <= _tol(x3, lin.weight, lin.bias)).all()
    x3 = torch.randn(3, 7, 192)  # 21 rows, MKL's padded up to 32
    with torch.no_grad(), pk.packed_linears(net, rows=32, always=True, kind=kind):
        got = lin(x3)
    assert got.shape == (3, 7, 384) and ((got - lin(x3).detach()).abs() <= _tol(x3, lin.weight, lin.bias)).all()
    assert "forward" not in vars(lin) and "forward" not in vars(net[2])  # restored on leaving


def _products(f) -> list[tuple[str, list]]:
    """The matrix products ``f`` ran: (op, input shapes)."""
    with torch.profiler.profile(record_shapes=True) as prof:
        f()
    names = ("aten::mm", "aten::addmm", *PRODUCTS.values())
    return [(e.name, e.input_shapes) for e in prof.events() if e.name in names]


def test_fewer_rows_than_packed_for_take_the_packed_product_padded():
    """MKL's packed product serves the row count it was packed for; torch runs any other count on the stock
    sgemm (which packs the weight again inside the call). A decode whose rows dropped as completions ended
    pads them up to the packed count instead, down to a quarter of it."""
    net = _net()
    lin = net[0]
    with torch.no_grad(), pk.packed_linears(net, rows=32, always=True, kind="mkl"):
        padded = _products(lambda: lin(torch.randn(9, 192)))
        exact = _products(lambda: lin(torch.randn(32, 192)))
        few = _products(lambda: lin(torch.randn(7, 192)))
    assert padded[0] == ("mkl::_mkl_linear", [[32, 192], [padded[0][1][1][0], 1], [384, 192], [384], []])
    assert not [p for p in padded if p[0] != "mkl::_mkl_linear"]  # no stock sgemm under it
    assert exact[0][1][0] == [32, 192] and len(exact) == 1
    assert few[0][1][0] == [7, 192] and any(p[0] in ("aten::mm", "aten::addmm") for p in few)  # the fallback


def test_onednns_packed_product_serves_any_row_count_itself():
    net = _net()
    lin = net[0]
    with torch.no_grad(), pk.packed_linears(net, rows=32, always=True, kind="onednn"):
        for rows in (1, 7, 9, 32, 40):
            ran = _products(lambda: lin(torch.randn(rows, 192)))
            assert [(name, shapes[0]) for name, shapes in ran] == [(PRODUCTS["onednn"], [rows, 192])]


@pytest.mark.parametrize("kind", KINDS)
def test_a_call_that_needs_gradients_takes_the_stock_op(kind):
    net = _net()
    x = torch.randn(5, 192, requires_grad=True)
    with pk.packed_linears(net, rows=5, always=True, kind=kind):
        y = net(x)
    y.sum().backward()
    g = x.grad.clone()
    x.grad = None
    net(x).sum().backward()
    assert y.grad_fn is not None and torch.equal(g, x.grad)


def test_only_plain_large_float32_layers_without_hooks_are_switched_for_long_calls():
    net = _net()
    net[2].register_forward_hook(lambda m, i, o: o)
    half = torch.nn.Linear(256, 256).to(torch.bfloat16)
    small = torch.nn.Linear(8, 8)  # under MIN_ENTRIES: MKL's own packing inside the call is cheap

    class Sub(torch.nn.Linear):
        pass

    kw = {"rows": 8, "always": True}
    with torch.no_grad(), pk.packed_linears(net, **kw) as n, pk.packed_linears(half, **kw) as m, \
            pk.packed_linears(Sub(256, 256), **kw) as s, pk.packed_linears(_net(), **kw, enabled=False) as off, \
            pk.packed_linears(small, **kw) as tiny, pk.packed_linears(_net(), rows=8, steps=4) as short:
        assert (n, m, s, off, tiny, short) == (1, 0, 0, 0, 0, 0)  # a short call does not pay for the packing


def test_a_layer_is_packed_where_its_measured_saving_over_the_call_pays_for_packing(monkeypatch):
    net = _net()  # (384, 192) and (192, 384) weights
    threads = torch.get_num_threads()
    hint = 16  # rows=8 asks MKL for its 16-row blocking
    monkeypatch.setattr(pk, "_MEASURED", {
        (384, 192, hint.bit_length(), threads): {"mkl": (0.020, 0.001), "onednn": (0.040, 0.0015)},  # pays from 21
        (192, 384, hint.bit_length(), threads): {"mkl": (0.001, -0.001), "onednn": (0.001, -0.002)}})  # slower
    with torch.no_grad(), pk.packed_linears(net, rows=8, steps=16) as short, \
            pk.packed_linears(_net(), rows=8, steps=32) as long:
        assert (short, long) == (0, 1)
    with pk.packed_linears(net, rows=8, steps=32):
        assert "forward" in vars(net[0]) and "forward" not in vars(net[2])


def test_the_kind_that_gains_most_over_the_call_is_chosen(monkeypatch):
    net = _net()
    lin = net[0]
    threads = torch.get_num_threads()
    monkeypatch.setattr(pk, "_MEASURED", {  # over 30 steps MKL gains 0.019 s, oneDNN 0.010; over 60 0.049 and 0.070
        (384, 192, 6, threads): {"mkl": (0.011, 0.001), "onednn": (0.050, 0.002)},
        (192, 384, 6, threads): {"mkl": (0.001, -0.001), "onednn": (0.001, -0.002)}})
    for steps, kind in ((30, "mkl"), (60, "onednn")):
        with torch.no_grad(), pk.packed_linears(net, rows=32, steps=steps) as n:
            ran = _products(lambda: lin(torch.randn(32, 192)))
        assert n == 1 and [name for name, _ in ran] == [PRODUCTS[kind]], steps


def test_an_unmeasured_shape_is_timed_once_per_row_scale_and_thread_count(monkeypatch):
    monkeypatch.setattr(pk, "_MEASURED", {})
    with torch.no_grad(), pk.packed_linears(_net(), rows=32, steps=64):
        pass
    threads = torch.get_num_threads()
    assert set(pk._MEASURED) == {(384, 192, 6, threads), (192, 384, 6, threads)}
    for by_kind in pk._MEASURED.values():
        assert set(by_kind) == set(KINDS)
        for pack_s, saving_s in by_kind.values():
            assert 0 < pack_s < 10 and abs(saving_s) < 10
    timed = dict(pk._MEASURED)
    with torch.no_grad(), pk.packed_linears(_net(), rows=40, steps=64):  # 32-63 rows: the same scale
        pass
    assert pk._MEASURED == timed


def test_a_shape_is_timed_over_its_layers_in_turn_and_their_copies_kept(monkeypatch):
    """A decode streams every layer's weight in turn: a shape is timed over as many of its layers as
    ``STREAM_BYTES`` holds, and the copies packed to time them serve the call (no layer packed twice)."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(*[torch.nn.Linear(256, 256, bias=False) for _ in range(5)])  # 256 KB each
    monkeypatch.setattr(pk, "_MEASURED", {})
    monkeypatch.setattr(pk, "STREAM_BYTES", 3 * 256 * 256 * 4)
    packs, pack = [], pk._pack
    monkeypatch.setattr(pk, "_pack", lambda kind, w, hint: packs.append((kind, w.data_ptr())) or pack(kind, w, hint))
    ptrs = [m.weight.data_ptr() for m in net]
    with torch.no_grad(), pk.packed_linears(net, rows=32, always=True) as n:
        x = torch.randn(32, 256)
        assert n == 5 and ((net(x) - net[4](net[3](net[2](net[1](F.linear(x, net[0].weight)))))).abs() <= 1e-4).all()
    chosen = max(pk._MEASURED[(256, 256, 6, torch.get_num_threads())].items(), key=lambda kv: kv[1][1] * 16 - kv[1][0])
    assert [p for k, p in packs[:6]] == ptrs[:3] * 2 and {k for k, _ in packs[:6]} == set(KINDS)  # timed: three
    assert packs[6:] == [(chosen[0], ptrs[3]), (chosen[0], ptrs[4])]  # the rest, once each


def test_a_frozen_model_is_packed_for_good_where_it_pays(monkeypatch):
    net = _net()
    threads, scale = torch.get_num_threads(), pk.FROZEN_ROWS.bit_length()
    monkeypatch.setattr(pk, "_MEASURED", {(384, 192, scale, threads): {"onednn": (1.0, 1e-6)},  # pays over a job
                                          (192, 384, scale, threads): {"onednn": (1e-3, -1e-6)}})  # slower packed
    x = torch.randn(300, 192)
    want = F.linear(x, net[0].weight, net[0].bias)
    assert pk.pack_frozen(net) == 1 and "forward" not in vars(net[2])
    with torch.no_grad():
        ran = _products(lambda: net[0](x))
        got = net[0](x)
    assert [name for name, _ in ran] == [PRODUCTS["onednn"]]  # and it stays so: nothing puts the layer back
    assert ((got - want).abs() <= _tol(x, net[0].weight, net[0].bias)).all()


def test_a_jobs_reference_is_packed_once_and_its_policy_is_not(tmp_path, models_dir, monkeypatch):
    from trainer import distributed, loop
    from trainer.config import JobSpec

    monkeypatch.setattr(pk, "MIN_ENTRIES", 0)  # the tiny model's layers are below it
    monkeypatch.setattr(pk, "_MEASURED", {})
    pays = pk._kind_that_pays
    monkeypatch.setattr(pk, "_kind_that_pays", lambda ws, hint, steps, always, k: pays(ws, hint, steps, True, "onednn"))
    spec = JobSpec.model_validate({"model": {"path": "builtin:tiny-arith"}, "data": {"eval_size": 8},
                                   "algo": {"kl_coef": 0.05}, "train": {"steps": 1, "threads": 1}})
    with distributed.group(1, spec.model_dump_json(), tmp_path, models_dir, "cpu") as dist:
        ctx = loop.setup(spec, tmp_path, models_dir, dist, None, lambda m: None).ctx
    packed = lambda m: getattr(vars(m).get("forward"), "__qualname__", "").startswith("_packed_forward")  # noqa: E731
    ref_layers = [m for m in ctx.ref.modules() if type(m) is torch.nn.Linear]
    assert ref_layers and all(packed(m) for m in ref_layers)
    assert not any(packed(m) for m in ctx.policy.modules())  # it trains: packed per sampling call only


@pytest.mark.parametrize("kind", KINDS)
def test_sampling_draws_the_same_tokens_packed_or_not(tiny_model, monkeypatch, kind):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainer.engines import HFEngine
    from trainer.rollout import SamplingParams

    model, tok = AutoModelForCausalLM.from_pretrained(tiny_model), AutoTokenizer.from_pretrained(tiny_model)
    prompts = ["What is 12+7?", "What is 3*4?", "What is 40-9?"]
    monkeypatch.setattr(pk, "MIN_ENTRIES", 0)  # the tiny model's layers are below it: switch them all here
    pays = pk._kind_that_pays
    monkeypatch.setattr(pk, "_kind_that_pays", lambda ws, hint, steps, always, k: pays(ws, hint, steps, True, kind))
    calls, make = [], pk._packed_forward

    def counted(*a):
        f = make(*a)
        return lambda x: calls.append(1) or f(x)

    monkeypatch.setattr(pk, "_packed_forward", counted)
    out = {}
    for packed in (False, True):
        torch.manual_seed(0)
        out[packed] = HFEngine(model, tok, packed=packed).generate(prompts, 4, SamplingParams(pk.MIN_STEPS))
    assert calls  # the packed layers ran
    assert torch.equal(out[False].completion_ids, out[True].completion_ids)
    # log-probs through four layers of such products: a few hundred float32 roundings of their size at most
    lp = out[False].logprobs
    tol = 256 * torch.finfo(torch.float32).eps * max(1.0, lp.abs().max().item())
    assert (out[True].logprobs - lp).abs().max().item() <= tol
    assert not any("forward" in vars(m) for m in model.modules())
