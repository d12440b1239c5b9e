"""Rollout engines: our KV-cache sampling loop against transformers ``model.generate``.

All on the bundled tiny model (CPU, a few seconds). What is checked: greedy output is token-for-token
``generate``'s; seeded sampling at a temperature and top-p draws exactly what ``generate`` draws;
the first-token distribution matches the model's exact nucleus distribution statistically; every
sampled token lies in the nucleus of a full (no-cache) forward; returned log-probs equal the
trainer's recomputation; the padded layout, EOS mask and truncation flags are right; dropping
finished rows and splitting into chunks change nothing.
"""
from __future__ import annotations

import pytest
import torch

from trainer.data import arithmetic_split
from trainer.engines import ENGINES, GenerateEngine, HFEngine, auto_engine, vllm_available
from trainer.rollout import (
    Rollout,
    SamplingParams,
    draw_inverse_cdf,
    logprob_mismatch,
    render_prompt,
    top_p_filter,
)


@pytest.fixture(scope="module")
def model_tok(tiny_model):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)  # tiny model: threads only add contention on a shared CI box
    return AutoModelForCausalLM.from_pretrained(tiny_model).eval(), AutoTokenizer.from_pretrained(tiny_model)


@pytest.fixture(scope="module")
def prompts():
    _, held = arithmetic_split(400)
    # mixed lengths, so left padding is really exercised
    return [s["prompt"] for s in held[:48]]


def _full_logits(model, ro: Rollout) -> torch.Tensor:
    """(N, T, V) next-token logits for every completion position, one forward, no KV cache."""
    ids = torch.cat([ro.prompt_ids, ro.completion_ids], 1)
    attn = torch.cat([ro.prompt_mask, ro.completion_mask], 1)
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    P = ro.prompt_ids.shape[1]
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=attn, position_ids=pos).logits[:, P - 1 : -1].float()


@pytest.mark.parametrize("drop_finished", [0.0, 0.25, 2.0])
def test_greedy_equals_model_generate(model_tok, prompts, drop_finished):
    model, tok = model_tok
    params = SamplingParams(max_new_tokens=12, greedy=True)
    ours = HFEngine(model, tok, drop_finished=drop_finished).generate(prompts, 2, params)
    ref = GenerateEngine(model, tok).generate(prompts, 2, params)
    assert torch.equal(ours.completion_ids, ref.completion_ids)
    assert torch.equal(ours.completion_mask, ref.completion_mask)
    assert torch.equal(ours.truncated, ref.truncated)
    assert ours.texts == ref.texts
    assert torch.equal(ours.prompt_ids, ref.prompt_ids) and torch.equal(ours.prompt_mask, ref.prompt_mask)
    assert any("boxed" in t for t in ours.texts)  # the model really answers, not an empty match


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.9), (1.5, 0.6)])
def test_seeded_sampling_equals_model_generate(model_tok, prompts, temperature, top_p):
    """Same seed, same batch, rows never dropped, multinomial draws: exactly ``generate``'s tokens."""
    model, tok = model_tok
    params = SamplingParams(max_new_tokens=12, temperature=temperature, top_p=top_p)
    torch.manual_seed(123)
    ours = HFEngine(model, tok, drop_finished=2.0, draw="multinomial").generate(prompts[:16], 8, params)
    torch.manual_seed(123)
    ref = GenerateEngine(model, tok).generate(prompts[:16], 8, params)
    assert torch.equal(ours.completion_ids, ref.completion_ids)
    assert len(set(ours.texts)) > 16  # really sampled: groups are not 8 copies of one answer


@pytest.mark.parametrize("draw", ["inverse_cdf", "multinomial"])
def test_first_token_distribution_matches_the_model(model_tok, draw):
    """20k draws of one token at T=1.3, top_p=0.8 against the exact nucleus distribution.

    The prompt ends inside the answer (after "\\boxed{"), where the tiny model is unsure of the first
    digit; right after the chat header it always writes a backslash, which would test nothing."""
    import copy

    model, tok = model_tok
    tok = copy.deepcopy(tok)
    tok.chat_template = None  # the prompt text below goes to the model verbatim
    prompt = "<|user|>What is 37 + 48?<|assistant|>\\boxed{"
    T, top_p, n = 1.3, 0.8, 20_000
    enc = tok([prompt], return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        logits = model(**enc).logits[:, -1].float()
    exact = top_p_filter(logits / T, top_p).softmax(-1)[0]  # (V,)
    support = exact > 0
    assert 3 <= int(support.sum()) < exact.numel()  # a real nucleus: several tokens, not all
    torch.manual_seed(0)
    engine = HFEngine(model, tok, max_batch=n, draw=draw)
    ro = engine.generate([prompt], n, SamplingParams(1, temperature=T, top_p=top_p))
    counts = torch.bincount(ro.completion_ids[:, 0], minlength=exact.numel()).float()
    assert counts[~support].sum() == 0, "sampled a token outside the nucleus"
    tv = 0.5 * (counts / n - exact).abs().sum().item()
    # E[TV] for k categories and n draws is about sum_i sqrt(p_i (1 - p_i) / (2 pi n)) < 0.007 here
    assert tv < 0.02, (tv, int(support.sum()))



def test_sample_next_logp_and_entropy_from_the_draws_probabilities():
    """Without a top-p cut the log-prob is log p of the drawn token and the entropy comes from the same
    probabilities (no second log-sum-exp): both equal the log-softmax expressions the trainer uses, in float32
    to its rounding of values of this size, and a token whose probability is subnormal (float32 keeps too few
    of its bits) gets its log-prob from the log-sum-exp instead."""
    from trainer.rollout import sample_next, token_entropy

    torch.manual_seed(0)
    logits = torch.randn(6, 300) * 4
    logits[0, 7] = logits[0].max() - 95.0  # p ~ e^-95: below float32's smallest normal number
    chosen = torch.tensor([7, 1, 2, 3, 4, 5])
    for T in (1.0, 0.6):
        tok, logp, ent = sample_next(logits, SamplingParams(4, temperature=T, entropy=True), draw=lambda p: chosen)
        ref = (logits / T).log_softmax(-1)
        assert torch.equal(tok, chosen)
        eps = torch.finfo(torch.float32).eps
        # a few roundings of numbers as large as the log-sum-exp (|logits / T| up to ~30 here)
        tol = 16 * eps * float((logits / T).abs().max())
        assert torch.allclose(logp, ref.gather(1, chosen[:, None]).squeeze(1), atol=tol, rtol=0)
        assert torch.allclose(ent, token_entropy(logits, T), atol=tol, rtol=0) and (ent >= 0).all()
    assert sample_next(logits, SamplingParams(4), draw=lambda p: chosen)[2] is None  # not asked

def test_inverse_cdf_draws_on_hand_probabilities():
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.3, 0.2, 0.0]]).repeat(50_000, 1)
    torch.manual_seed(0)
    counts = torch.bincount(draw_inverse_cdf(probs), minlength=6).float() / 50_000
    assert counts[0] == counts[2] == counts[5] == 0  # zero-probability tokens never drawn, even at the ends
    assert torch.allclose(counts, probs[0], atol=0.01), counts


def test_inverse_cdf_in_blocks_on_a_large_vocabulary():
    """The two-level draw (a vocabulary of several blocks and a shorter last one): the exact distribution,
    and never a zero-probability token — not at a block's edges, not in an all-zero block, not in the tail."""
    from trainer.rollout import _CDF_BLOCK

    V = 4 * _CDF_BLOCK + 37
    weights = torch.zeros(V, dtype=torch.float64)
    picks = {0: 1.0, _CDF_BLOCK - 1: 2.0, _CDF_BLOCK: 0.5, 3 * _CDF_BLOCK + 5: 3.0, V - 2: 1.5}  # block 2: all zero
    weights[list(picks)] = torch.tensor(list(picks.values()), dtype=torch.float64)
    weights[_CDF_BLOCK + 1 : _CDF_BLOCK + 100] = 1e-3  # many small ones beside a large one
    probs = (weights / weights.sum()).float()
    n = 200_000
    torch.manual_seed(0)
    counts = torch.bincount(draw_inverse_cdf(probs.repeat(n, 1)), minlength=V).double() / n
    assert counts[probs == 0].sum() == 0, "drew a zero-probability token"
    exact = probs.double()
    tv = 0.5 * (counts - exact).abs().sum().item()
    # E[TV] over these ~104 categories at 200k draws is ~0.004; the small ones' total mass is 0.012
    assert tv < 0.01, tv
    small = slice(_CDF_BLOCK + 1, _CDF_BLOCK + 100)
    assert abs(counts[small].sum().item() - exact[small].sum().item()) < 0.002  # their mass is not lost


def test_inverse_cdf_in_blocks_matches_one_scan():
    """The same uniforms pick the same tokens through the two levels as through one whole-row scan (the
    boundaries differ only by float64 rounding, which these random rows do not meet)."""
    import trainer.rollout as r

    probs = torch.randn(64, 3 * r._CDF_BLOCK + 11).mul(2).softmax(-1)
    torch.manual_seed(3)
    two = r.draw_inverse_cdf(probs)
    cdf = probs.double().cumsum(-1)
    torch.manual_seed(3)
    u = torch.rand((64, 1), dtype=torch.float64) * cdf[:, -1:]
    one = torch.searchsorted(cdf, u, right=True).squeeze(1)
    assert torch.equal(two, one)


def test_samples_stay_in_the_nucleus_and_logprobs_match_the_trainer(model_tok, prompts):
    """At every step, not just the first: each sampled token is inside the top-p set of a full
    forward without cache, and the engine's log-probs are the trainer's recomputation."""
    model, tok = model_tok
    T, top_p = 1.2, 0.7
    torch.manual_seed(1)
    ro = HFEngine(model, tok).generate(prompts[:16], 8, SamplingParams(12, temperature=T, top_p=top_p))
    mask = ro.completion_mask.bool()
    logits = _full_logits(model, ro)
    N, W, V = logits.shape
    nucleus = top_p_filter((logits / T).reshape(N * W, V), top_p).reshape(N, W, V)
    sampled = nucleus.gather(2, ro.completion_ids[..., None]).squeeze(2)
    assert torch.isfinite(sampled[mask]).all(), "a sampled token lies outside the nucleus"
    # the trainer's recomputation: log-softmax of the full forward's logits / T at the sampled token
    trainer_logp = (logits / T).log_softmax(-1).gather(2, ro.completion_ids[..., None]).squeeze(2)
    assert ro.logprobs is not None and ro.logprobs.shape == mask.shape
    assert torch.allclose(ro.logprobs[mask], trainer_logp[mask], atol=1e-4)
    assert (ro.logprobs[~mask] == 0).all()
    stats = logprob_mismatch(ro.logprobs, trainer_logp, ro.completion_mask)
    assert stats["rollout/logp_abs_diff_max"] < 1e-4 and abs(stats["rollout/is_ratio_mean"] - 1) < 1e-4



@pytest.mark.parametrize("drop_finished", [0.0, 2.0])
def test_entropy_at_each_position_is_the_trainers(model_tok, prompts, drop_finished):
    """Asked, the sampler returns each sampled position's entropy of softmax(logits / T) without the top-p cut:
    what the trainer's forward reports (trainer/online.py takes it for the rows the update skips). Rows
    dropped from the batch mid-call keep theirs; select/concat/trim carry it."""
    from trainer.batch import forward
    from trainer.rollout import concat, select, trim

    model, tok = model_tok
    T, top_p = 1.2, 0.7
    torch.manual_seed(2)
    engine = HFEngine(model, tok, drop_finished=drop_finished)
    ro = engine.generate(prompts[:8], 4, SamplingParams(12, temperature=T, top_p=top_p, entropy=True))
    mask = ro.completion_mask.bool()
    with torch.no_grad():
        trainer = forward(model, ro, T).entropy
    assert ro.entropy is not None and ro.entropy.shape == mask.shape and ro.entropy.dtype == torch.float32
    # the logprob test's tolerance: decode with a KV cache against one full forward, float32 round-off
    assert torch.allclose(ro.entropy[mask], trainer[mask], atol=1e-4)
    assert (ro.entropy[mask] > 0).all() and (ro.entropy[~mask] == 0).all()
    both = concat([select(ro, [0, 1]), trim(select(ro, [5]))], tok.pad_token_id)
    assert torch.equal(both.entropy[:2], ro.entropy[[0, 1]])
    assert torch.equal(both.entropy[2, : ro.entropy.shape[1]], ro.entropy[5, : both.entropy.shape[1]])
    assert engine.generate(prompts[:2], 2, SamplingParams(4)).entropy is None  # not asked: not computed
    assert engine.generate(prompts[:2], 1, SamplingParams(4, greedy=True, entropy=True)).entropy is None

def test_layout_eos_mask_and_truncation(model_tok, prompts):
    model, tok = model_tok
    n, max_new = 4, 10  # answers are 9-12 tokens: some completions end, some are cut off
    torch.manual_seed(2)
    ro = HFEngine(model, tok).generate(prompts[:12], n, SamplingParams(max_new, temperature=1.0))
    pad, eos = tok.pad_token_id, tok.eos_token_id
    N = 12 * n
    assert ro.prompt_ids.shape[0] == ro.completion_ids.shape[0] == N == len(ro.texts)
    assert ro.completion_ids.shape[1] <= max_new
    assert 0 < int(ro.truncated.sum()) < N, "want both finished and truncated rows"
    # prompts: left-padded, group-major (the n rows of a prompt are contiguous copies)
    assert (ro.prompt_mask[:, -1] == 1).all()
    assert torch.equal(ro.prompt_ids[ro.prompt_mask == 0], torch.full_like(ro.prompt_ids[ro.prompt_mask == 0], pad))
    for i in range(12):
        expect = tok(render_prompt(tok, prompts[i]), add_special_tokens=False)["input_ids"]
        for j in range(n):
            row = ro.prompt_ids[i * n + j][ro.prompt_mask[i * n + j].bool()].tolist()
            assert row == expect
    for r in range(N):
        ids, m = ro.completion_ids[r].tolist(), ro.completion_mask[r].tolist()
        if eos in ids:
            k = ids.index(eos)
            assert not ro.truncated[r]
            assert m == [1] * (k + 1) + [0] * (len(ids) - k - 1)  # through the first EOS inclusive
            assert all(t == pad for t in ids[k + 1 :])
        else:
            assert ro.truncated[r] and all(m) and len(ids) == max_new
        kept = [t for t, keep in zip(ids, m) if keep]
        assert ro.texts[r] == tok.decode(kept, skip_special_tokens=True)


def test_chunking_changes_nothing(model_tok, prompts):
    """max_batch splits the prompts into several forwards; groups stay whole; layout is re-padded."""
    model, tok = model_tok
    params = SamplingParams(10, greedy=True)
    whole = HFEngine(model, tok).generate(prompts, 3, params)
    chunked = HFEngine(model, tok, max_batch=7).generate(prompts, 3, params)  # 2 prompts per chunk
    assert whole.texts == chunked.texts
    for a, b in [(whole.completion_mask, chunked.completion_mask), (whole.truncated, chunked.truncated)]:
        assert torch.equal(a, b)
    m = whole.completion_mask.bool()
    assert torch.equal(whole.completion_ids[m], chunked.completion_ids[m])
    assert torch.allclose(whole.logprobs[m], chunked.logprobs[m], atol=1e-5)
    # prompts re-padded to one width, still aligned at the right edge
    assert torch.equal(whole.prompt_ids[:, -5:], chunked.prompt_ids[:, -5:])


def test_engine_keeps_model_training_mode(model_tok, prompts):
    model, tok = model_tok
    model.train()
    try:
        HFEngine(model, tok).generate(prompts[:2], 2, SamplingParams(4))
        assert model.training
    finally:
        model.eval()


def test_mismatch_and_tis_on_hand_values():
    engine = torch.tensor([[-1.0, -2.0, 0.0]])
    trainer = torch.tensor([[-1.0, -1.0, -5.0]])
    mask = torch.tensor([[1, 1, 0]])
    s = logprob_mismatch(engine, trainer, mask)
    assert s["rollout/logp_abs_diff_mean"] == pytest.approx(0.5)
    assert s["rollout/logp_abs_diff_max"] == pytest.approx(1.0)
    assert s["rollout/is_ratio_mean"] == pytest.approx((1 + torch.e) / 2)
    assert s["rollout/logp_kl_k3"] == pytest.approx((0 + torch.e - 2) / 2)
    from trainer.algos import is_token_truncate

    w = is_token_truncate(trainer - engine, mask, 2.0, 0.5)
    assert torch.allclose(w, torch.tensor([[1.0, 2.0, torch.exp(torch.tensor(-5.0)).item()]]))
    assert logprob_mismatch(engine, trainer, torch.zeros_like(mask)) == {}


def test_auto_picks_hf_without_gpu_or_vllm(model_tok):
    model, tok = model_tok
    if torch.cuda.is_available() and vllm_available():
        pytest.skip("this machine has a GPU and vLLM: auto picks vLLM (tested in test_rollout_vllm.py)")
    assert isinstance(auto_engine(model, tok), HFEngine)
    assert isinstance(ENGINES["hf"](model, tok), HFEngine)


def test_vllm_engine_without_vllm_says_how_to_install(model_tok):
    if vllm_available():
        pytest.skip("vLLM is installed here")
    model, tok = model_tok
    with pytest.raises(ImportError, match=r"rlvr\[vllm\]"):
        ENGINES["vllm"](model, tok)


def test_peft_wrapped_model_decodes_like_generate(model_tok, prompts):
    """LoRA jobs hand the engine a PEFT wrapper: same greedy output as ``generate`` through it."""
    peft = pytest.importorskip("peft", reason="peft is only needed by LoRA jobs")
    import copy

    model, tok = model_tok
    wrapped = peft.get_peft_model(copy.deepcopy(model), peft.LoraConfig(r=4, lora_alpha=8, task_type="CAUSAL_LM"))
    params = SamplingParams(12, greedy=True)
    ours = HFEngine(wrapped, tok).generate(prompts[:8], 2, params)
    ref = GenerateEngine(wrapped, tok).generate(prompts[:8], 2, params)
    assert torch.equal(ours.completion_ids, ref.completion_ids)


def test_shared_prompt_prefix_is_prefilled_once_and_changes_nothing(model_tok, prompts):
    """Few-shot prompts share their first turns: prefilled once (one row), same greedy output as
    ``generate``, same log-probs as the trainer's full forward."""
    model, tok = model_tok
    _, held = arithmetic_split(400)
    shots = [{"role": "user", "content": "What is 2 + 3?"}, {"role": "assistant", "content": "\\boxed{5}"},
             {"role": "user", "content": "What is 10 - 4?"}, {"role": "assistant", "content": "\\boxed{6}"}]
    fewshot = [shots + [{"role": "user", "content": p}] for p in prompts[:12]]
    engine = HFEngine(model, tok)
    shapes = []
    inner = engine._forward
    engine._forward = lambda ids, *a: shapes.append(tuple(ids.shape)) or inner(ids, *a)
    params = SamplingParams(12, greedy=True)
    ours = engine.generate(fewshot, 2, params)
    assert shapes[0][0] == 1 and shapes[0][1] >= 40, shapes[:2]  # the shared turns, one row
    assert shapes[1][0] == 12 and shapes[1][1] < 20                # then each prompt's own tokens
    ref = GenerateEngine(model, tok).generate(fewshot, 2, params)
    assert torch.equal(ours.completion_ids, ref.completion_ids)
    assert torch.equal(ours.prompt_ids, ref.prompt_ids) and torch.equal(ours.prompt_mask, ref.prompt_mask)
    torch.manual_seed(3)
    ro = engine.generate(fewshot, 4, SamplingParams(12, temperature=1.0))
    logits = _full_logits(model, ro)
    trainer_logp = logits.log_softmax(-1).gather(2, ro.completion_ids[..., None]).squeeze(2)
    m = ro.completion_mask.bool()
    assert torch.allclose(ro.logprobs[m], trainer_logp[m], atol=1e-4)


def test_generation_config_stop_ids_end_completions_like_eos(model_tok, prompts):
    """Chat models list several end-of-turn ids in their generation config (Llama 3, Qwen): every
    engine stops at any of them, and the mask ends there, as it would at the tokenizer's EOS."""
    import copy

    from trainer.rollout import completion_mask, stop_ids

    base, tok = model_tok
    model = copy.deepcopy(base)
    brace = tok.convert_tokens_to_ids("}")
    model.generation_config.eos_token_id = [tok.eos_token_id, brace]
    assert stop_ids(tok, model) == [tok.eos_token_id, brace]
    params = SamplingParams(max_new_tokens=12, greedy=True)
    full = HFEngine(base, tok).generate(prompts, 1, params)
    assert sum("}" in t for t in full.texts) > len(prompts) // 2  # the brace is really produced
    ours = HFEngine(model, tok).generate(prompts, 1, params)
    ref = GenerateEngine(model, tok).generate(prompts, 1, params)
    assert torch.equal(ours.completion_ids, ref.completion_ids) and torch.equal(ours.completion_mask,
                                                                                ref.completion_mask)
    for row, n, text, trunc in zip(ours.completion_ids, ours.completion_mask.sum(1), ours.texts, ours.truncated):
        if not trunc:
            assert int(row[n - 1]) in (tok.eos_token_id, brace)  # the mask ends on a stop id
        assert "}" not in text[:-1]  # nothing generated after the first brace
    assert any(t.endswith("}") for t in ours.texts)
    mask, truncated = completion_mask(torch.tensor([[7, brace, 9], [7, 8, 9]]), [tok.eos_token_id, brace])
    assert mask.tolist() == [[1, 1, 0], [1, 1, 1]] and truncated.tolist() == [False, True]


def test_vllm_pushes_lora_policies_as_merged_weights(model_tok):
    """The vLLM engine serves a LoRA policy by pushing base + scale * B @ A under the base's names:
    exactly what merge_and_unload gives, with the trained model left as it is (no vLLM needed)."""
    import copy

    pytest.importorskip("peft")
    from peft import LoraConfig, get_peft_model

    from trainer.checkpoint import merged_weights

    base, _ = model_tok
    model = get_peft_model(copy.deepcopy(base), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    for n, p in model.named_parameters():
        if "lora_B" in n:
            torch.nn.init.normal_(p, std=0.05)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    got = dict(merged_weights(model))
    want = copy.deepcopy(model).merge_and_unload().state_dict()
    assert set(got) == set(want)
    assert all(torch.allclose(got[k], want[k], atol=1e-6) for k in want)
    assert any(not torch.equal(got[k], base.state_dict()[k]) for k in want if "q_proj" in k)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # untouched


@pytest.mark.parametrize("engine", ["ours", "generate"])
def test_stop_strings_end_completions_where_the_string_completes(model_tok, prompts, engine):
    """A stop string spanning several tokens ends each completion at the token that completes it; the
    mask ends there, the row is not truncated, the text ends with the string, and nothing before that
    point changes (the same tokens as the run without the stop)."""
    model, tok = model_tok
    stop = "ed{"  # inside every "\\boxed{…}" answer, three tokens of the character-level model
    cls = HFEngine if engine == "ours" else GenerateEngine
    full = cls(model, tok).generate(prompts, 1, SamplingParams(max_new_tokens=16, greedy=True))
    cut = cls(model, tok).generate(prompts, 1, SamplingParams(max_new_tokens=16, greedy=True, stop=(stop,)))
    hits = 0
    for r, text in enumerate(full.texts):
        n = int(cut.completion_mask[r].sum())
        if stop in text:
            hits += 1
            assert cut.texts[r] == text[: text.index(stop) + len(stop)]
            assert not cut.truncated[r]
            assert cut.completion_ids[r, :n].tolist() == full.completion_ids[r, :n].tolist()
            assert cut.completion_mask[r, n:].sum() == 0
        else:  # never met: exactly as without the stop
            assert cut.texts[r] == text and bool(cut.truncated[r]) == bool(full.truncated[r])
    assert hits > len(prompts) // 2  # the string really occurs, so the cut is exercised
    ours = HFEngine(model, tok).generate(prompts, 1, SamplingParams(max_new_tokens=16, greedy=True, stop=(stop,)))
    assert ours.texts == cut.texts and torch.equal(ours.completion_mask, cut.completion_mask)


def test_sampled_rows_end_at_a_stop_string_and_keep_their_logprobs(model_tok, prompts):
    model, tok = model_tok
    torch.manual_seed(3)
    ro = HFEngine(model, tok).generate(prompts[:12], 4, SamplingParams(16, temperature=1.0, stop=("{", "}")))
    ended = 0
    for r in range(ro.completion_ids.shape[0]):
        n = int(ro.completion_mask[r].sum())
        text = tok.decode(ro.completion_ids[r, :n].tolist(), skip_special_tokens=True)
        assert ro.texts[r] == text
        if not ro.truncated[r] and int(ro.completion_ids[r, n - 1]) != tok.eos_token_id:
            ended += 1
            assert text[-1] in "{}" and "{" not in text[:-1] and "}" not in text[:-1]
        assert (ro.logprobs[r, :n] < 0).all() and (ro.logprobs[r, n:] == 0).all()
    assert ended > 0


class _PieceTokenizer:
    """Multi-character tokens, as a BPE vocabulary has: what a stop string meets on a real model."""
    pieces = ["def", " f", "():\n", "```", "\n", "\n```\n\n", "x", "```\n"]

    def batch_decode(self, rows, skip_special_tokens=False):
        return ["".join(self.pieces[i] for i in row) for row in rows]


def test_stop_strings_across_and_inside_tokens():
    from trainer.rollout import StopStrings, cut_at

    s = StopStrings(_PieceTokenizer(), ["\n```\n"])
    assert s.window == len("\n```\n") + 2
    rows = torch.tensor([[0, 1, 2, 4, 3, 4],    # completed across three tokens
                         [0, 1, 2, 6, 6, 5],    # inside one token that carries more text
                         [0, 1, 2, 6, 4, 3],    # not yet: the newline after the fence is missing
                         [3, 0, 1, 2, 6, 7]])   # an opening fence alone is not the closing one
    assert s.hits(rows).tolist() == [True, True, False, False]
    assert not StopStrings(_PieceTokenizer(), [])  # no stop strings: the samplers skip the check
    mask, trunc = cut_at(torch.ones(3, 4, dtype=torch.long), torch.tensor([True, True, False]), [2, None, None])
    assert mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 1, 1]] and trunc.tolist() == [False, True, False]
    ends = s.ends(rows, torch.ones_like(rows))
    assert ends == [6, 6, None, None]


def test_a_jobs_stop_strings_reach_training_and_evaluation_sampling(tmp_path, models_dir, monkeypatch):
    from trainer import engines
    from trainer.config import JobSpec
    from trainer.loop import train

    seen = []

    class Recording(HFEngine):
        def generate(self, prompts, n, params):
            ro = super().generate(prompts, n, params)
            seen.append((params.greedy, params.stop, ro.texts))
            return ro

    monkeypatch.setitem(engines.ENGINES, "hf", Recording)
    spec = JobSpec.model_validate({
        "data": {"eval_size": 8}, "rollout": {"group_size": 2, "max_new_tokens": 12, "stop": ["{"]},
        "train": {"steps": 2, "prompts_per_step": 2, "eval_every": 1, "threads": 1}})
    train(spec, tmp_path / "run", models_dir=models_dir, log=lambda m: None)
    assert {greedy for greedy, _, _ in seen} == {True, False}  # evaluation and training both sampled
    assert all(stop == ("{",) for _, stop, _ in seen)
    assert all("{" not in t[:-1] for _, _, texts in seen for t in texts)
    assert any(t.endswith("{") for _, _, texts in seen for t in texts)


def test_trim_drops_only_the_padding_columns_no_row_uses():
    from trainer.rollout import trim

    ro = Rollout(prompt_ids=torch.tensor([[0, 0, 7, 8], [0, 0, 0, 9]]),
                 prompt_mask=torch.tensor([[0, 0, 1, 1], [0, 0, 0, 1]]),
                 completion_ids=torch.tensor([[5, 4, 0, 0], [6, 0, 0, 0]]),
                 completion_mask=torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0]]), texts=["a", "b"],
                 truncated=torch.tensor([False, True]), logprobs=torch.tensor([[-1.0, -2.0, 0, 0], [-3.0, 0, 0, 0]]))
    t = trim(ro)
    assert t.prompt_ids.tolist() == [[7, 8], [0, 9]] and t.prompt_mask.tolist() == [[1, 1], [0, 1]]
    assert t.completion_ids.tolist() == [[5, 4], [6, 0]] and t.completion_mask.tolist() == [[1, 1], [1, 0]]
    assert t.logprobs.tolist() == [[-1.0, -2.0], [-3.0, 0.0]] and t.truncated.tolist() == [False, True]
    assert t.texts == ["a", "b"]
    same = trim(t)  # nothing left to drop
    assert same.prompt_ids.tolist() == t.prompt_ids.tolist()
    assert same.completion_ids.tolist() == t.completion_ids.tolist()
