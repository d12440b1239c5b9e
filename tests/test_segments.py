"""trainer/models/segments.py: a batch's real tokens as one packed row (each prompt once, then each completion).

Its layouts by hand on a small batch, then the forward against one full forward per row in float64 on the
shapes that stress it: a prompt of one token (nothing of its own in the prompt part), a completion of none,
prompts and completions of different lengths, rows of a group apart in the batch; and the batches it leaves
to the two-call forward.
"""
from __future__ import annotations

import functools

import pytest
import torch

from trainer.batch import forward, last_hidden
from trainer.models.segments import Segments
from trainer.rollout import Rollout

pytestmark = pytest.mark.numerics  # float comparisons: CI runs them under a second CPU kernel path too


def test_layouts_by_hand():
    """Prompts of 2 and 0 tokens in the prompt part (their real lengths 3 and 1), three rows (the middle one on
    the second prompt), completions of 2, 1 and 0 tokens."""
    s = Segments.build(torch.tensor([2, 0]), torch.tensor([0, 1, 0]), torch.tensor([2, 1, 0]))
    assert (s.n_prompt, s.n, s.shape) == (2, 5, (2, 2, 3, 2))
    # packed rows: 0-1 prompt 0; 2-3 row 0's completion part, 4 row 1's; padding reads row 0
    assert s.prompt_src.tolist() == [0, 1, 0, 0]
    assert s.comp_src.tolist() == [2, 3, 4, 0, 0, 0]
    assert s.key_src.view(3, 4).tolist() == [[0, 1, 2, 3], [0, 0, 4, 0], [0, 1, 0, 0]]
    T, F = True, False
    assert s.comp_mask[:, 0].tolist() == [
        [[T, T, T, F], [T, T, T, T]],   # row 0: its prompt's 2 tokens, then itself causally
        [[F, F, T, F], [T, T, T, T]],   # row 1: no prompt part; its 2nd column is padding (reads every key)
        [[T, T, T, T], [T, T, T, T]],   # row 2: no token at all
    ]
    # each packed row's place in [prompt layout (2 x 2), completion layout (3 x 2)]
    assert s.out_src.tolist() == [0, 1, 4, 5, 6]


def _model(arch: str):
    import transformers as T

    torch.manual_seed(0)
    common = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2)
    cfg = {"llama": lambda: T.LlamaConfig(**common), "qwen3": lambda: T.Qwen3Config(**common, head_dim=8)}[arch]()
    return T.AutoModelForCausalLM.from_config(cfg).double().train()


# six completions of 5, 2, 1, 0, 4 and 3 tokens (right-padded to 5)
EVERY_LENGTH = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 0, 0, 0, 0],
                             [0, 0, 0, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 0, 0]])


def _float64_and_32(cfg):
    """A float64 model from ``cfg`` (seed 0) and a float32 copy of its weights."""
    import transformers as T

    torch.manual_seed(0)
    truth = T.AutoModelForCausalLM.from_config(cfg).double()
    model = T.AutoModelForCausalLM.from_config(cfg)
    model.load_state_dict({k: v.float() for k, v in truth.state_dict().items()})
    return truth, model


def _batch(comp_mask: torch.Tensor, p_lens=(6, 1, 4), order=(0, 1, 2, 0, 1, 2)) -> Rollout:
    """Rows on prompts of ``p_lens`` real tokens (left-padded to 6), in ``order``."""
    g = torch.Generator().manual_seed(1)
    P = max(p_lens)
    prompts = torch.randint(1, 64, (len(p_lens), P), generator=g)
    pmask = torch.stack([torch.arange(P) >= P - n for n in p_lens]).long()
    prompts = prompts * pmask
    idx = torch.tensor(order)
    B, T = comp_mask.shape
    return Rollout(prompts[idx], pmask[idx], torch.randint(1, 64, (B, T), generator=g) * comp_mask, comp_mask,
                   [""] * B, torch.zeros(B, dtype=torch.bool))


def _loss_and_grads(model, ro):
    f = forward(model, ro, 0.7, hidden=True, entropy_grad=True)
    m = ro.completion_mask.double()
    loss = (f.logp * m).sum() + 0.1 * (f.entropy * m).sum() + 1e-2 * (f.hidden * m.unsqueeze(-1)).sum()
    return f, torch.autograd.grad(loss, [p for p in model.parameters() if p.requires_grad])


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_packed_row_equals_one_forward_per_row(arch):
    """Log-probs, entropies and hidden states equal the unshared forward's to float64 rounding (the gradients to
    float32's: below), with a one-token prompt, an empty completion and completions of every length; the critic's
    forward too."""
    model = _model(arch)
    comp_mask = EVERY_LENGTH.clone()
    ro = _batch(comp_mask)
    calls = []
    hook = model.register_forward_pre_hook(lambda m, a, kw: calls.append(kw["input_ids"].shape), with_kwargs=True)
    a, ga = _loss_and_grads(model, ro)
    with torch.no_grad():
        h = last_hidden(model, ro)
    hook.remove()
    # one call each, over the real tokens only: prompts 5 + 0 + 3, completions 5 + 2 + 1 + 0 + 4 + 3
    assert calls == [torch.Size([1, 23])] * 2
    model.rlvr_share_prompts = False
    b, gb = _loss_and_grads(model, ro)
    m = comp_mask.bool()
    for x, y in ((a.logp, b.logp), (a.entropy, b.entropy), (a.hidden, b.hidden), (h, b.hidden)):
        assert torch.allclose(x[m], y[m], rtol=0, atol=1e-12)
    assert not a.logp[~m].any() and not a.hidden[~m].any() and not h[~m].any()
    assert len(ga) > 0
    # transformers' RMSNorm computes in float32 whatever the model's dtype, so its backward rounds each gradient it
    # passes to float32: the packed row sums a prompt token's gradient over its group before that rounding, the
    # per-row forward after it. The gradients agree to a few units of float32's rounding, not float64's.
    for x, y in zip(ga, gb):
        assert torch.allclose(x, y, rtol=0, atol=8 * torch.finfo(torch.float32).eps * y.abs().max().item())


def test_batches_it_does_not_lay_out_take_the_two_calls():
    """A completion mask with a hole (not right padding) and a float32 model off the listed types keep the
    two-call forward, with the same results."""
    import transformers as T

    model = _model("llama")
    comp_mask = torch.tensor([[1, 0, 1], [1, 1, 0], [1, 1, 1], [1, 0, 0]])
    ro = _batch(comp_mask, p_lens=(3, 2), order=(0, 1, 0, 1))
    calls = []
    hook = model.register_forward_pre_hook(lambda m, a, kw: calls.append(1), with_kwargs=True)
    with torch.no_grad():
        a = forward(model, ro, 1.0)
        assert len(calls) == 2
        model.rlvr_share_prompts = False
        b = forward(model, ro, 1.0)
    hook.remove()
    m = comp_mask.bool()
    assert torch.allclose(a.logp[m], b.logp[m], rtol=0, atol=1e-12)
    torch.manual_seed(0)
    gemma = T.AutoModelForCausalLM.from_config(T.Gemma2Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8))
    from trainer.models import segments

    assert segments.eligible(model) and not segments.eligible(gemma)


def _flash_calls(fn) -> int:
    with torch.profiler.profile() as prof:
        out = fn()
    return sum(e.name == "aten::_scaled_dot_product_flash_attention_for_cpu" for e in prof.events()), out


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_small_completion_blocks_take_math_attention_when_a_backward_follows(monkeypatch, kv_heads):
    """float32, every query head its own key/value head, a graph: the completion call runs torch's math attention
    (segments.MATH_MAX_SCORES), its gradients as close to float64's as the flash kernel's; without a graph, with
    grouped heads or over the bound, the flash kernel."""
    import transformers as T

    from trainer.models import segments

    cfg = T.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=kv_heads)
    truth, model = (m.train() for m in _float64_and_32(cfg))
    comp_mask = EVERY_LENGTH.clone()
    ro = _batch(comp_mask)
    layers = cfg.num_hidden_layers

    def grads(m):
        f = forward(m, ro, 0.7, entropy_grad=True)
        mask = ro.completion_mask.to(f.logp.dtype)
        loss = (f.logp * mask).sum() + 0.1 * (f.entropy * mask).sum()
        return [g.double() for g in torch.autograd.grad(loss, [p for p in m.parameters() if p.requires_grad])]

    want = grads(truth)
    n_math, got_math = _flash_calls(lambda: grads(model))
    with torch.no_grad():
        n_nograd, _ = _flash_calls(lambda: forward(model, ro, 0.7))
    monkeypatch.setattr(segments, "MATH_MAX_SCORES", 0)
    n_flash, got_flash = _flash_calls(lambda: grads(model))
    # the prompt part's call is the flash kernel's either way; the completions' too with grouped heads
    assert n_flash == n_nograd == 2 * layers
    assert n_math == (layers if kv_heads == 4 else 2 * layers)
    eps = torch.finfo(torch.float32).eps
    for w, m, f in zip(want, got_math, got_flash):
        scale = w.abs().max().item()
        spread = (f - w).abs().max().item()
        assert (m - w).abs().max().item() <= 4 * spread + 8 * eps * scale
    assert any((m - f).abs().max() > 0 for m, f in zip(got_math, got_flash)) == (kv_heads == 4)


@functools.cache
def _avx2_build():
    """csrc/segment_attend.cpp built for x86-64-v3 (AVX2 and FMA, no AVX-512) however wide this host's vectors: its
    AVX2 branch (16-key score tiles, fewer sums in registers) is tested on an AVX-512 host too. Built once
    per venv (~40 s) beside make setup's, loaded once per session; None where this CPU cannot run it."""
    from trainer.engines import native
    from trainer.models.gemm import cpu

    if not {"avx2", "fma"} <= cpu()[1]:  # not an x86-64-v3 CPU (or not x86): the build would not run here
        return None
    # the last -march wins: native._load's -march=native, then this
    mod = native._load("rlvr_segment_attend_x86_64_v3", "segment_attend.cpp", "", ("-march=x86-64-v3",))
    assert mod is not None and mod.vector_bits == 256, "the x86-64-v3 build must take the AVX2 branch"
    return mod


def _kernel_calls(monkeypatch, build: str = "native") -> list:
    """Calls of csrc/segment_attend.cpp (``build``: this host's, or "avx2", _avx2_build's) through segments.py:
    ("forward" or "graph", dtype) and ("backward", dtype)."""
    import types

    from trainer.engines import native

    kernel, calls = native.segment_attend() if build == "native" else _avx2_build(), []
    if kernel is None and build == "avx2":
        pytest.skip("this CPU cannot run an x86-64-v3 build")
    assert kernel is not None, "the kernel must build here (make setup builds it)"

    def counted(name, fn):
        return lambda q, *rest: calls.append((name, q.dtype)) or fn(q, *rest)

    monkeypatch.setattr(native, "segment_attend", lambda: types.SimpleNamespace(
        segment_attend=counted("forward", kernel.segment_attend), forward=counted("graph", kernel.forward),
        backward=counted("backward", kernel.backward)))
    return calls


def _packed(prompt_len, inv, comp_len, H, Hkv, D, gen):
    """A Segments layout and (1, heads, n, d) queries, keys and values as a layer passes them (views of (n, heads,
    d) rows)."""
    s = Segments.build(torch.tensor(prompt_len), torch.tensor(inv), torch.tensor(comp_len))
    q = torch.randn(1, s.n, H, D, generator=gen).transpose(1, 2) * 2
    k, v = (torch.randn(1, s.n, Hkv, D, generator=gen).transpose(1, 2) for _ in "kv")
    return s, q, k, v


def _attend_and_grads(s, q, k, v, g):
    """The attention's output and its inputs' gradients for output gradient ``g``."""
    q, k, v = (x.detach().requires_grad_(True) for x in (q, k, v))
    out = s.attend(q, k, v, None)
    out.backward(g.to(out.dtype))
    return [t.detach() for t in (out, q.grad, k.grad, v.grad)]


@pytest.mark.parametrize("D", [32, 64, 128])  # the tiny model's, SmolLM2's, larger models' head sizes
@pytest.mark.parametrize("heads", [(4, 4), (6, 2)])
@pytest.mark.parametrize("build", ["native", "avx2"])
def test_the_packed_row_kernel_against_float64(monkeypatch, D, heads, build):
    """float32 attention over the packed row runs csrc/segment_attend.cpp, without a graph and with one (its
    backward too): the output and the query, key and value gradients as close to float64's as torch's kernels on
    the same layout (each within 2x their error + 4 eps), with prompts of no token, one and many, completions of
    none, one and more keys than a score tile, rows of a group apart; the same bits at one and two threads. For
    this host's build and for the AVX2 one (_avx2_build)."""
    from trainer.models import segments

    H, Hkv = heads
    calls = _kernel_calls(monkeypatch, build)
    gen = torch.Generator().manual_seed(7)
    s, q, k, v = _packed([7, 0, 33, 1], [2, 0, 3, 2, 1, 0, 2], [5, 1, 40, 0, 12, 3, 17], H, Hkv, D, gen)
    g = torch.randn(1, s.n, H, D, generator=gen)
    with torch.no_grad():
        ours = s.attend(q, k, v, None)
    assert calls == [("forward", torch.float32)]
    ours_g = _attend_and_grads(s, q, k, v, g)
    assert calls[1:] == [("graph", torch.float32), ("backward", torch.float32)]
    assert torch.equal(ours_g[0], ours)  # the same forward with or without a graph
    monkeypatch.setattr(segments, "ENABLED", False)
    stock = _attend_and_grads(s, q, k, v, g)
    want = _attend_and_grads(s, q.double(), k.double(), v.double(), g)
    assert len(calls) == 3 and ours.shape == stock[0].shape == (1, s.n, H, D)
    for name, a, b, w in zip(("out", "dq", "dk", "dv"), ours_g, stock, want):
        err, err_stock = (a.double() - w).abs().max().item(), (b.double() - w).abs().max().item()
        eps = torch.finfo(torch.float32).eps * w.abs().max().item()
        assert err <= 2 * err_stock + 4 * eps, (name, err / eps, err_stock / eps)
    monkeypatch.setattr(segments, "ENABLED", True)
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):  # each (unit, key/value head) is one thread's, its sums in one order
            torch.set_num_threads(threads)
            with torch.no_grad():
                assert torch.equal(s.attend(q, k, v, D ** -0.5), ours), threads
            for a, b in zip(_attend_and_grads(s, q, k, v, g), ours_g):
                assert torch.equal(a, b), threads
    finally:
        torch.set_num_threads(before)


def test_the_packed_row_kernel_only_where_it_fits_and_refuses_a_bad_layout(monkeypatch):
    """float64, a head size the kernel has no tile for, a host without the kernel: torch's kernels. Called
    directly, the kernel refuses a layout whose units miss a row, take one twice or reach out of the row."""
    from trainer.engines import native

    calls = _kernel_calls(monkeypatch)
    g = torch.Generator().manual_seed(3)
    s, q, k, v = _packed([3, 2], [0, 1, 0], [2, 4, 1], 4, 2, 32, g)
    with torch.no_grad():
        s.attend(q.double(), k.double(), v.double(), None)
        s24, q24, k24, v24 = _packed([3, 2], [0, 1, 0], [2, 4, 1], 4, 2, 24, g)
        s24.attend(q24, k24, v24, None)
    assert calls == []
    kernel = native.segment_attend().segment_attend
    qn, kn, vn = (x[0].transpose(0, 1) for x in (q, k, v))
    assert torch.equal(kernel(qn, kn, vn, s.units, 0.5), kernel(qn.contiguous(), kn, vn, s.units, 0.5))
    bad = {"in two units": torch.cat([s.units, s.units[:1]]), "in no unit": s.units[1:],
           "out of the row": torch.cat([s.units[:-1], s.units[-1:] + torch.tensor([[0, 0, s.n, 0]])])}
    for why, units in bad.items():
        with pytest.raises(RuntimeError, match=why):
            kernel(qn, kn, vn, units, 0.5)
    with pytest.raises(RuntimeError, match="head size"):
        kernel(q24[0].transpose(0, 1), k24[0].transpose(0, 1), v24[0].transpose(0, 1), s24.units, 0.5)
    with pytest.raises(RuntimeError, match="float32"):
        kernel(qn.double(), kn, vn, s.units, 0.5)
    # a host that cannot build it (native's loader returns None, with its warning): torch's kernels, the same bits
    from trainer.models import segments

    monkeypatch.setattr(native, "segment_attend", lambda: None)
    with torch.no_grad():
        fallback = s.attend(q, k, v, None)
        monkeypatch.setattr(segments, "ENABLED", False)
        assert torch.equal(fallback, s.attend(q, k, v, None))


def test_a_float32_models_forwards_through_the_kernel(monkeypatch):
    """A float32 model (head size 32, grouped heads): log-probs and the critic's hidden states of the packed row
    through the kernel, without a graph, and the gradients of a loss on them with one, are as close to a float64
    model's as the per-row forward's are."""
    import transformers as T

    calls = _kernel_calls(monkeypatch)
    cfg = T.LlamaConfig(vocab_size=64, hidden_size=128, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2)
    truth, model = (m.eval() for m in _float64_and_32(cfg))
    comp_mask = EVERY_LENGTH.clone()
    ro = _batch(comp_mask)
    m = comp_mask.bool()
    with torch.no_grad():
        want, want_h = forward(truth, ro, 0.7).logp, last_hidden(truth, ro)
        ours, ours_h = forward(model, ro, 0.7).logp, last_hidden(model, ro)
        assert calls == [("forward", torch.float32)] * 2 * cfg.num_hidden_layers
    grads = {}
    for name, net in (("truth", truth), ("ours", model)):
        _, gr = _loss_and_grads(net, ro)
        grads[name] = [x.double() for x in gr]
    assert calls[2 * cfg.num_hidden_layers:] == [("graph", torch.float32)] * cfg.num_hidden_layers + [
        ("backward", torch.float32)] * cfg.num_hidden_layers
    model.rlvr_share_prompts = False
    with torch.no_grad():
        row, row_h = forward(model, ro, 0.7).logp, last_hidden(model, ro)
    _, gr = _loss_and_grads(model, ro)
    grads["row"] = [x.double() for x in gr]
    eps = torch.finfo(torch.float32).eps
    pairs = [(ours[m], row[m], want[m]), (ours_h[m], row_h[m], want_h[m]), *zip(grads["ours"], grads["row"],
                                                                                  grads["truth"])]
    for a, b, w in pairs:
        err, err_row = (a.double() - w).abs().max().item(), (b.double() - w).abs().max().item()
        assert err <= 2 * err_row + 4 * eps * w.abs().max().item(), (err, err_row)
