"""bench/_ceilings.py's FLOP counter (the work behind `update_peak_frac`, `roofline_frac`): what it counts for a
forward, and that counting leaves the sampler as a job runs it."""
from __future__ import annotations

import collections
import importlib.util

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from tests.conftest import REPO
from trainer.engines import packed

# loaded from its file, not by putting bench/ on sys.path: bench/sandbox.py would shadow the sandbox package
_spec = importlib.util.spec_from_file_location("bench_ceilings", REPO / "bench" / "_ceilings.py")
_ceilings = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_ceilings)
ForwardFlops = _ceilings.ForwardFlops


@pytest.fixture
def model():
    # an output layer of 65,536 entries: large enough for trainer/engines/packed.py to consider it
    cfg = LlamaConfig(vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).eval()


def test_counting_leaves_the_output_layer_packable(model):
    """The counter once hooked the output layer, and packed.py switches no hooked layer: in bench/rollout.py the
    sampler timed as ours never packed SmolLM2's output layer (49,152 x 576), the one layer whose packing a job's
    sampler measured to pay there, and `packed_speedup` compared two unpacked samplers."""
    assert packed._switchable(model.lm_head)
    counter = ForwardFlops(model)
    try:
        assert packed._switchable(model.lm_head)
        assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules() if m is not model)
    finally:
        counter.remove()


@pytest.mark.parametrize("keep", [1, 0, 3])
def test_the_output_layers_products_are_counted_from_the_logits_rows(model, keep):
    """A forward of B x L new tokens: the layers' and attention's products from the shapes, the output layer's
    from the rows of logits it returned (logits_to_keep=1: one a row; 0: every position)."""
    B, L = 3, 5
    counter = ForwardFlops(model)
    try:
        with torch.no_grad():
            out = model(input_ids=torch.randint(0, 1024, (B, L)), logits_to_keep=keep)
    finally:
        counter.remove()
    rows = B * (keep or L)
    assert out.logits.shape[:2] == (B, keep or L)
    expected = counter.body_flops(B, L, 0) + 2.0 * rows * 64 * 1024
    assert counter.flops == expected and counter.calls == [(expected, counter.calls[0][1])]
    assert counter.body_flops(B, L, 0) >= 2.0 * B * L * sum(
        m.weight.numel() for m in model.model.layers.modules() if isinstance(m, torch.nn.Linear))


def test_a_packed_rows_work_is_counted_as_the_two_calls_it_replaced(model, monkeypatch):
    """trainer/models/segments.py runs a shared-prompt forward as one packed row (1 x the real tokens): its attention
    is counted from the segments (each prompt's rectangle, each completion's over its prompt and itself), not as
    one rectangle over the row, so the same work counts the same as the two calls (prompts, then completions over
    their cache) with the padding's rows skipped."""
    import trainer.batch as batch
    from trainer.rollout import Rollout

    monkeypatch.setattr(batch, "MIN_UNPAD_ENTRIES", 0)  # the two calls skip the padding in every layer too
    g = torch.Generator().manual_seed(0)
    p_mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]]).repeat_interleave(3, 0)
    c_mask = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0]]).repeat(2, 1)
    ro = Rollout(torch.randint(1, 1024, (2, 4), generator=g).repeat_interleave(3, 0) * p_mask, p_mask,
                 torch.randint(1, 1024, (6, 3), generator=g) * c_mask, c_mask, [""] * 6,
                 torch.zeros(6, dtype=torch.bool))
    counted = {}
    for packed_row in (True, False):
        model.rlvr_segments = packed_row
        counter = ForwardFlops(model, linear_rows=True)
        calls = []
        hook = model.register_forward_pre_hook(lambda m, a, kw: calls.append(kw["input_ids"].shape), with_kwargs=True)
        try:
            with torch.no_grad():
                batch.forward(model, ro, 1.0)
        finally:
            hook.remove()
            counter.remove()
        counted[packed_row] = (counter.flops, len(calls))
    # real tokens: the prompts' 2 + 3 but their last, the completions' 12
    assert counted[True][1] == 1 and counted[False][1] == 2
    assert counted[True][0] == counted[False][0]
    layer = sum(m.weight.numel() for m in model.model.layers.modules() if isinstance(m, torch.nn.Linear))
    pairs = 2 * 3 * 3 + 6 * 3 * (3 + 3)  # U x Pm x Pm + B x Tm x (Pm + Tm)
    assert counted[True][0] == 2.0 * 17 * layer + 4.0 * 4 * 16 * pairs * 2 + 2.0 * 12 * 64 * 1024
    # head size 32: the no-graph forward attends in csrc/segment_attend.cpp, which scores each query's visible keys
    # only: prompts of 2 and 3 tokens causally, completions of 3, 1, 2 tokens over 2 or 3 prompt keys, twice each
    cfg = LlamaConfig(vocab_size=1024, hidden_size=128, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    wide = LlamaForCausalLM(cfg).eval()
    wide.rlvr_segments = True
    counter = ForwardFlops(wide, linear_rows=True)
    with torch.no_grad():
        batch.forward(wide, ro, 1.0)
    counter.remove()
    layer = sum(m.weight.numel() for m in wide.model.layers.modules() if isinstance(m, torch.nn.Linear))
    pairs = (3 + 6) + sum(t * p + t * (t + 1) // 2 for p in (2, 3) for t in (3, 1, 2))
    assert counter.flops == 2.0 * 17 * layer + 4.0 * 4 * 32 * pairs * 2 + 2.0 * 12 * 128 * 1024


def test_op_times_sets_the_optimisers_step_and_attention_apart(model):
    """`optimizer_op_share` and `update_ceiling_frac` (bench/update.py) rest on OpTimes telling the ops
    ``optimizer.step()`` ran and attention's kernels from the rest: the step's ops count there and only there."""
    model.train()
    model.config._attn_implementation = "sdpa"
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 1024, (2, 8))
    with _ceilings.OpTimes() as bare:
        model(input_ids=ids).logits.sum().backward()
    s = bare.summary()
    assert s["optimizer_s"] == 0.0 and 0 < s["attention_s"] < s["ops_s"] and s["products_s"] > 0
    with _ceilings.OpTimes(opt) as t:
        model(input_ids=ids).logits.sum().backward()
        before = {k: list(r) for k, r in t.ops.items()}
        opt.step()
    grew = {k: r[1] - before.get(k, [0, 0.0])[1] for k, r in t.ops.items() if r[0] > before.get(k, [0])[0]}
    # every op the step ran is the step's, but the profiler's record_function markers around its hooks
    step = {k: dt for k, dt in grew.items() if not k[0].startswith("_record_function")}
    assert {k[0] for k in step} >= {"addcdiv_", "lerp_"}  # AdamW's own arithmetic
    assert t.summary()["optimizer_s"] == pytest.approx(sum(step.values()), rel=1e-9)


    assert t.summary()["attention_s"] > 0
    # the hooks leave with the mode: a later step is nobody's
    assert not opt._optimizer_step_pre_hooks and not opt._optimizer_step_post_hooks


def test_op_times_sees_our_kernels(model):
    """Our C++ kernels are pybind calls the dispatcher never sees: OpTimes times them by their loaders (the packed
    row's attention among attention's time, RMSNorm's, the rotary embedding's), and puts the loaders back."""
    import trainer.batch as batch
    from trainer.engines import native
    from trainer.models import norm, rope
    from trainer.rollout import Rollout

    cfg = LlamaConfig(vocab_size=1024, hidden_size=128, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    wide = LlamaForCausalLM(cfg).train()
    wide.config._attn_implementation = "sdpa"
    norm.fused_rms_norm(wide)
    rope.fused_rope(wide)
    wide.rlvr_segments = True
    mask = torch.ones(3, 4, dtype=torch.long)
    ro = Rollout(torch.randint(1, 1024, (1, 4)).repeat(3, 1), mask, torch.randint(1, 1024, (3, 4)), mask, [""] * 3,
                 torch.zeros(3, dtype=torch.bool))  # three samples of one prompt: the shared-prompt packed row
    loaders = {name: getattr(native, name) for name in _ceilings.NATIVE}
    with _ceilings.OpTimes() as t:
        batch.forward(wide, ro, 1.0).logp.sum().backward()
    assert {name: getattr(native, name) for name in _ceilings.NATIVE} == loaders
    calls = collections.Counter({k[0]: r[0] for k, r in t.ops.items() if k[0].startswith("native:")})
    layers = cfg.num_hidden_layers
    assert calls["native:segment_attend.forward"] == calls["native:segment_attend.backward"] == layers, calls
    assert calls["native:rms_norm.forward"] == 2 * layers + 1 and calls["native:rope.forward"] == layers
    s = t.summary()
    native_attention = sum(r[1] for k, r in t.ops.items() if k[0].startswith("native:segment_attend."))
    assert 0 < native_attention == pytest.approx(s["attention_s"]) and s["attention_s"] < s["ops_s"]


def test_product_tape_replays_the_very_products_in_order():
    """`products_in_sequence_frac` (bench/update.py) rests on ProductTape running again exactly the products a region
    ran, on their own operands (the same memory), in their order, with their FLOPs; other ops are not taped."""
    torch.manual_seed(0)
    a, b, c = torch.randn(6, 4), torch.randn(4, 5), torch.randn(5, 3)
    acc = torch.zeros(6, 5)
    with _ceilings.ProductTape() as tape:
        ab = a @ b
        (ab.relu() @ c).sum()
        acc.addmm_(a, b)  # in place, as a weight gradient into .grad
    names = [f.overloadpacket.__name__ for f, _, _ in tape.calls]
    assert names == ["mm", "mm", "addmm_"]
    assert tape.calls[0][1][0] is a and tape.calls[2][1][0] is acc  # the tensors themselves, not copies
    flops, seconds = tape.replay(passes=2)
    assert flops == 2 * (6 * 4 * 5) + 2 * (6 * 5 * 3) + 2 * (6 * 4 * 5)  # 2mkn each, counted once
    assert seconds > 0
    # the replay ran the in-place product on the same accumulator again, once per pass: three sums in it now
    torch.testing.assert_close(acc, 3 * (a @ b))
