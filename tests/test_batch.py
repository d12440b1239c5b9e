"""The shared-prompt forward: rows that share a prompt run it once, and nothing changes but the cost.

Checked against one full forward per row, on a real (tiny) model with sampled completions of
different lengths and left-padded prompts of different lengths: log-probs, entropies, hidden
states and every parameter's gradient agree to float32 rounding, for a plain model and a LoRA one.
Both ways of sharing are checked: one model call over a packed row of the real tokens
(trainer/models/segments.py, the CPU default for Llama-like models) and two calls, the completions over
a cache of the prompts (``rlvr_segments = False``; other models and devices).
"""
from __future__ import annotations

import pytest
import torch

from trainer.batch import concat, encode, forward, last_hidden, select
from trainer.engines import ENGINES
from trainer.rollout import SamplingParams

pytestmark = pytest.mark.numerics  # float32 comparisons: CI runs them under a second CPU kernel path too


@pytest.fixture(scope="module")
def tiny(models_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = models_dir / "tiny-arith"
    return AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)


def _loss_and_grads(model, ro, share: bool, hidden: bool):
    f = forward(model, ro, 0.9, hidden=hidden, entropy_grad=True, share_prompts=share)
    m = ro.completion_mask.float()
    loss = (f.logp * m).sum() + 0.1 * (f.entropy * m).sum()
    if hidden:
        loss = loss + 1e-3 * (f.hidden * m.unsqueeze(-1)).sum()
    params = [p for p in model.parameters() if p.requires_grad]
    return f, torch.autograd.grad(loss, params)


def _calls(model) -> tuple[list, object]:
    """The model calls a forward makes (a hook; removed by the caller)."""
    calls: list[int] = []
    return calls, model.register_forward_pre_hook(lambda m, a, kw: calls.append(1), with_kwargs=True)


def _rollout(model, tok):
    torch.manual_seed(0)
    # prompts of different lengths (left padding differs), groups of 4 with completions that end early
    return ENGINES["hf"](model, tok).generate(["1+2", "100-45", "17+8", "3-3"], 4, SamplingParams(12))


@pytest.mark.parametrize("segments", [True, False])
@pytest.mark.parametrize("hidden", [False, True])
def test_shared_prompt_forward_equals_per_row_forward(tiny, hidden, segments):
    model, tok = tiny
    ro = _rollout(model, tok)
    assert len(torch.unique(ro.prompt_ids, dim=0)) == 4 and ro.completion_mask.sum(1).min() < 12
    model.train()
    model.rlvr_segments = segments
    calls, hook = _calls(model)
    try:
        a, ga = _loss_and_grads(model, ro, True, hidden)
        assert len(calls) == (1 if segments else 2)  # one packed row, or the prompts then the completions
        b, gb = _loss_and_grads(model, ro, False, hidden)
    finally:
        hook.remove()
        del model.rlvr_segments
    m = ro.completion_mask.bool()
    assert torch.allclose(a.logp[m], b.logp[m], atol=1e-5)
    assert torch.allclose(a.entropy[m], b.entropy[m], atol=1e-5)
    if hidden:
        assert torch.allclose(a.hidden[m], b.hidden[m], atol=1e-5)
        with torch.no_grad():  # the critic's logits-free path: the same hidden states
            for share in (True, False):
                assert torch.allclose(last_hidden(model, ro, share)[m], b.hidden[m], atol=1e-5)
    for x, y in zip(ga, gb):
        assert torch.allclose(x, y, rtol=1e-4, atol=1e-5 * y.abs().max().item())


@pytest.mark.parametrize("share", [True, False])
def test_log_p_only_forward_is_the_same_log_p(tiny, share):
    """The reference's, teacher's and drift probe's no-graph forwards ask for log p alone (entropy=False):
    the same bits as the full forward's log p, and no entropy."""
    model, tok = tiny
    ro = _rollout(model, tok)
    model.eval()
    with torch.no_grad():
        full = forward(model, ro, 0.9, share_prompts=share)
        alone = forward(model, ro, 0.9, share_prompts=share, entropy=False)
    assert alone.entropy is None and full.entropy is not None
    assert torch.equal(alone.logp, full.logp)


def test_rows_in_any_order_and_mixed_prompts_share_correctly(tiny):
    """Groups shuffled together (minibatches draw random rows) still map each row to its prompt."""
    model, tok = tiny
    ro = _rollout(model, tok)
    perm = torch.randperm(len(ro.texts), generator=torch.Generator().manual_seed(3))[:10]
    part = select(ro, perm)
    model.eval()
    with torch.no_grad():
        a = forward(model, part, 1.0)
        b = forward(model, part, 1.0, share_prompts=False)
    m = part.completion_mask.bool()
    assert torch.allclose(a.logp[m], b.logp[m], atol=1e-5)


def test_preference_pairs_share_their_prompt(tiny):
    model, tok = tiny
    pairs = concat([encode(tok, ["12+30"], [r"\boxed{42}"]), encode(tok, ["12+30"], [r"\boxed{41} is it"]),
                    encode(tok, ["9-4"], ["5"])], tok.pad_token_id)
    model.eval()
    with torch.no_grad():
        a, b = forward(model, pairs, 1.0), forward(model, pairs, 1.0, share_prompts=False)
    m = pairs.completion_mask.bool()
    assert torch.allclose(a.logp[m], b.logp[m], atol=1e-5)


def test_lora_model_shares_prompts_with_the_same_gradients(tiny):
    from peft import LoraConfig, get_peft_model

    base, tok = tiny
    import copy

    model = get_peft_model(copy.deepcopy(base), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    for n, p in model.named_parameters():  # non-zero B, so adapters shape the forward too
        if "lora_B" in n:
            torch.nn.init.normal_(p, std=0.05)
    ro = _rollout(base, tok)
    model.train()
    a, ga = _loss_and_grads(model, ro, True, False)
    b, gb = _loss_and_grads(model, ro, False, False)
    m = ro.completion_mask.bool()
    assert torch.allclose(a.logp[m], b.logp[m], atol=1e-5)
    # the gradients: the shared forward's as close to a float64 model's as the unshared one's (float32 sums in
    # another order: the packed row's attention, csrc/segment_attend.cpp, adds a prompt key's terms per completion)
    _, g64 = _loss_and_grads(copy.deepcopy(model).double(), ro, False, False)
    assert len(ga) > 0
    eps = torch.finfo(torch.float32).eps
    for x, y, w in zip(ga, gb, g64):
        err, err_unshared = (x.double() - w).abs().max().item(), (y.double() - w).abs().max().item()
        assert err <= 2 * err_unshared + 4 * eps * w.abs().max().item(), (err, err_unshared)


def _tiny_config(arch: str):
    import transformers as T

    common = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2)
    return {
        "qwen2": lambda: T.Qwen2Config(**common),
        "qwen3": lambda: T.Qwen3Config(**common, head_dim=8),
        # sliding windows shorter than prompt + completion: the gathered cache must keep their masks right
        "mistral-sliding": lambda: T.MistralConfig(**common, sliding_window=4),
        "gemma2-sliding": lambda: T.Gemma2Config(**common, head_dim=8, sliding_window=4),
    }[arch]()


@pytest.mark.parametrize("segments", [True, False])
@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "mistral-sliding", "gemma2-sliding"])
def test_other_architectures_share_prompts_exactly(arch, segments):
    """Qwen2 and Qwen3 (norms on the query and key heads) run the packed row; models with a sliding window
    (their masks are more than a prompt and a completion) keep the two calls."""
    from transformers import AutoModelForCausalLM

    from trainer.rollout import Rollout

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(_tiny_config(arch)).train()
    model.rlvr_segments = segments
    P, T, G = 6, 5, 3
    p_ids, p_mask = torch.randint(1, 64, (2, P)), torch.ones(2, P, dtype=torch.long)
    p_ids[1, :2], p_mask[1, :2] = 0, 0  # the second prompt is left-padded
    comp_mask = torch.ones(2 * G, T, dtype=torch.long)
    comp_mask[0, 3:] = 0
    ro = Rollout(p_ids.repeat_interleave(G, 0), p_mask.repeat_interleave(G, 0), torch.randint(1, 64, (2 * G, T)),
                 comp_mask, [""] * (2 * G), torch.zeros(2 * G, dtype=torch.bool))
    calls, hook = _calls(model)
    a, ga = _loss_and_grads(model, ro, True, False)
    hook.remove()
    assert len(calls) == (1 if segments and arch in ("qwen2", "qwen3") else 2)
    b, gb = _loss_and_grads(model, ro, False, False)
    m = comp_mask.bool()
    assert torch.allclose(a.logp[m], b.logp[m], atol=1e-5)
    assert all(torch.allclose(x, y, rtol=1e-4, atol=1e-6) for x, y in zip(ga, gb))


@pytest.mark.parametrize("share", [True, False])
@pytest.mark.parametrize("arch", ["tiny-arith", "gemma2-sliding"])  # gemma2: a softcap after its output layer
def test_output_layer_runs_over_the_completion_tokens_only(tiny, monkeypatch, share, arch):
    """The output layer and the vocabulary's softmax skip the completions' padding: they get the tokens' rows
    alone, the results and every gradient are those of the full (B, T, V) logits, and padding reads 0."""
    import contextlib

    from transformers import AutoModelForCausalLM

    import trainer.batch as batch

    if arch == "tiny-arith":
        model, tok = tiny
        ro = _rollout(model, tok)
        model = AutoModelForCausalLM.from_pretrained(tiny[0].name_or_path, dtype=torch.float64).train()
    else:
        from trainer.rollout import Rollout

        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(_tiny_config(arch)).double().train()
        G, comp_mask = 3, torch.ones(6, 5, dtype=torch.long)
        comp_mask[0, 3:], comp_mask[4, 1:] = 0, 0
        ro = Rollout(torch.randint(1, 64, (2, 6)).repeat_interleave(G, 0), torch.ones(6, 6, dtype=torch.long),
                     torch.randint(1, 64, (6, 5)), comp_mask, [""] * 6, torch.zeros(6, dtype=torch.bool))
    m = ro.completion_mask.bool()
    assert 0 < m.sum() < m.numel()  # completions that end early: there is padding to skip
    rows = []
    handle = model.get_output_embeddings().register_forward_hook(
        lambda mod, args, out: rows.append(out.numel() // out.shape[-1]))
    a, ga = _loss_and_grads(model, ro, share, False)
    assert rows[-1] == int(m.sum())
    monkeypatch.setattr(batch, "_head_rows", lambda model, rows: contextlib.nullcontext())
    model.rlvr_segments = False  # the packed row selects its rows itself: the peer is the two calls' full logits
    b, gb = _loss_and_grads(model, ro, share, False)
    handle.remove()
    assert rows[-1] == m.numel()  # the full path: every position, padding included
    assert torch.allclose(a.logp[m], b.logp[m], rtol=0, atol=1e-12)
    assert torch.allclose(a.entropy[m], b.entropy[m], rtol=0, atol=1e-12)
    assert not a.logp[~m].any() and not a.entropy[~m].any()
    assert len(ga) > 0
    for x, y in zip(ga, gb):
        assert torch.allclose(x, y, rtol=1e-10, atol=1e-12 * y.abs().max().item())


@pytest.mark.parametrize("share", [True, False])
def test_rows_run_without_the_columns_none_of_them_uses(tiny, monkeypatch, share):
    """A subset of a batch's rows keeps the batch's widths; its forward runs only the prompt and completion
    columns some row of it uses. Results, hidden states and gradients are those of the full-width forward,
    and the columns it left out read 0."""
    import contextlib

    from transformers import AutoModelForCausalLM

    import trainer.batch as batch

    model, tok = tiny
    ro = _rollout(model, tok)
    lengths, plen = ro.completion_mask.sum(1), ro.prompt_mask.sum(1)
    # rows of the shorter prompts and shorter completions: both sides have columns no row of them uses
    rows = [i for i in range(len(lengths)) if lengths[i] < lengths.max() and plen[i] < plen.max()]
    part = select(ro, rows)
    assert len(rows) > 2 and part.completion_mask.sum(1).max() < part.completion_ids.shape[1]
    assert part.prompt_mask.sum(1).max() < part.prompt_ids.shape[1]
    model = AutoModelForCausalLM.from_pretrained(model.name_or_path, dtype=torch.float64).train()
    model.rlvr_segments = False  # the widths of the two calls' layouts (a packed row has only real tokens)
    widths = []
    hook = model.register_forward_pre_hook(lambda m, a, kw: widths.append(kw["input_ids"].shape[1]), with_kwargs=True)
    a, ga = _loss_and_grads(model, part, share, True)
    narrow = sum(widths)
    widths.clear()
    monkeypatch.setattr(batch, "_unpadded", lambda ro: ro)
    monkeypatch.setattr(batch, "_head_rows", lambda model, rows: contextlib.nullcontext())
    b, gb = _loss_and_grads(model, part, share, True)
    hook.remove()
    assert narrow < sum(widths)  # fewer columns ran
    m = part.completion_mask.bool()
    for x, y in ((a.logp, b.logp), (a.entropy, b.entropy), (a.hidden, b.hidden)):
        assert x.shape == y.shape and torch.allclose(x[m], y[m], rtol=0, atol=1e-12)
    unused = torch.zeros_like(m)
    unused[:, int(m.sum(1).max()):] = True
    assert not a.logp[unused].any() and not a.hidden[unused].any()
    for x, y in zip(ga, gb):
        assert torch.allclose(x, y, rtol=1e-10, atol=1e-12 * y.abs().max().item())


def _counting_rows(model):
    """Rows each decoder layer's MLP and query projection multiply, per call (hooks; removed by the caller)."""
    seen: list[tuple[str, int]] = []
    layer = model.get_decoder().layers[0]
    return seen, [mod.register_forward_hook(lambda m, a, o, n=name: seen.append((n, a[0].numel() // a[0].shape[-1])))
                  for name, mod in (("mlp", layer.mlp), ("q", layer.self_attn.q_proj))]


def _padded_batch(arch: str):
    """A float64 model of ``arch`` and a batch whose completions end early (right padding) under prompts of
    different lengths (left padding), two rows per prompt."""
    from transformers import AutoModelForCausalLM

    from trainer.rollout import Rollout

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(_tiny_config(arch)).double().train()
    P, T, G = 6, 5, 2
    p_ids, p_mask = torch.randint(1, 64, (3, P)), torch.ones(3, P, dtype=torch.long)
    p_ids[1, :2], p_mask[1, :2] = 0, 0
    comp_mask = torch.ones(3 * G, T, dtype=torch.long)
    comp_mask[0, 3:], comp_mask[3, 1:], comp_mask[5, 4:] = 0, 0, 0
    ro = Rollout(p_ids.repeat_interleave(G, 0), p_mask.repeat_interleave(G, 0), torch.randint(1, 64, (3 * G, T)),
                 comp_mask, [""] * (3 * G), torch.zeros(3 * G, dtype=torch.bool))
    return model, ro


@pytest.mark.parametrize("share", [True, False])
@pytest.mark.parametrize("arch", ["tiny-arith", "qwen3", "mistral-sliding", "lora"])
def test_padding_positions_skip_the_layers_products(tiny, monkeypatch, share, arch):
    """The layers' MLPs and attention projections multiply only the positions that predict a completion token
    or are a prompt's token: the completions' right padding and the prompts' left padding are skipped. Results,
    hidden states and every gradient are the full forward's, to float64 rounding (qwen3: norms on the query and
    key heads; mistral: a sliding window shorter than the rows; lora: adapters on the projections). (Not gemma2:
    in float64 its eager attention gives NaN to the left-padded rows' real tokens with or without skipping.)"""
    import trainer.batch as batch

    monkeypatch.setattr(batch, "MIN_UNPAD_ENTRIES", 0)  # the test models' layers are smaller than it
    if arch in ("tiny-arith", "lora"):
        base, tok = tiny
        ro = _rollout(base, tok)
        model = type(base).from_pretrained(base.name_or_path, dtype=torch.float64).train()
        if arch == "lora":
            from peft import LoraConfig, get_peft_model

            model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"]))
            for n, p in model.named_parameters():
                if "lora_B" in n:
                    torch.nn.init.normal_(p, std=0.05)
    else:
        model, ro = _padded_batch(arch)
    m = ro.completion_mask.bool()
    assert 0 < m.sum() < m.numel() and not ro.prompt_mask.all()
    seen, hooks = _counting_rows(model)
    a, ga = _loss_and_grads(model, ro, share, True)
    skipped = list(seen)
    seen.clear()
    model.rlvr_unpad = False
    b, gb = _loss_and_grads(model, ro, share, True)
    del model.rlvr_unpad
    for h in hooks:
        h.remove()
    # the rows multiplied: shared, the distinct prompts' real tokens but their last, then every row's positions
    # that predict a completion token (in one packed row where the model runs one: trainer/models/segments.py);
    # unshared, each row's prompt tokens and those positions
    B, P, T = len(m), ro.prompt_ids.shape[1], m.shape[1]
    if share:
        uniq = torch.unique(torch.cat([ro.prompt_ids, ro.prompt_mask], 1), dim=0)[:, P:]
        want, full = [int(uniq[:, :-1].sum()), int(m.sum())], [len(uniq) * (P - 1), B * T]
        if arch != "mistral-sliding":
            want = [sum(want)]
    else:
        want = [int(ro.prompt_mask.sum() + ro.completion_mask[:, 1:].sum())]
        full = [B * (P + T - 1)]
    assert [r for n, r in skipped if n == "mlp"] == want and [r for n, r in skipped if n == "q"] == want
    assert [r for n, r in seen if n == "mlp"] == full and [r for n, r in seen if n == "q"] == full
    for x, y in ((a.logp, b.logp), (a.entropy, b.entropy), (a.hidden, b.hidden)):
        assert torch.allclose(x[m], y[m], rtol=0, atol=1e-12)
    assert len(ga) > 0
    for x, y in zip(ga, gb):
        assert torch.allclose(x, y, rtol=1e-10, atol=1e-12 * y.abs().max().item())


def test_small_layers_and_unpadded_batches_run_whole(tiny):
    """Below MIN_UNPAD_ENTRIES a module runs every position (its gather and scatter cost what the padding
    would); a batch with no padding adds no hooks at all."""
    from trainer.batch import MIN_UNPAD_ENTRIES

    model, tok = tiny
    layer = model.get_decoder().layers[0]
    assert sum(p.numel() for p in layer.self_attn.q_proj.parameters() if p.dim() == 2) < MIN_UNPAD_ENTRIES
    assert sum(p.numel() for p in layer.mlp.parameters() if p.dim() == 2) >= MIN_UNPAD_ENTRIES
    ro = _rollout(model, tok)
    seen, hooks = _counting_rows(model)
    model.rlvr_segments = False  # the two calls' layouts, whose padding the hooks skip (a packed row has none)
    try:
        with torch.no_grad():
            forward(model, ro, 1.0)
            full = select(ro, [int(ro.completion_mask.sum(1).argmax())])  # one row: nothing to skip
            forward(model, full, 1.0)
    finally:
        del model.rlvr_segments
        for h in hooks:
            h.remove()
    B, T = ro.completion_mask.shape
    assert [r for n, r in seen if n == "mlp"][1] == int(ro.completion_mask.sum()) < B * T
    assert [r for n, r in seen if n == "q"][1] == B * T  # the projections ran whole
    assert [r for n, r in seen if n == "mlp"][2:] == [r for n, r in seen if n == "q"][2:]
