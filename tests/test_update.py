"""The update step's invariances on a real (tiny) model, with deterministic completions.

Gradient accumulation: splitting each optimiser step's batch into micro-batches must leave the
parameters unchanged (losses are normalised by the whole minibatch's counts). LoRA trains adapters
only and leaves the base weights untouched.

The invariance runs are in float64 and compared to within ``TOL`` of the update's size: splitting a
batch changes the float summation order, and Adam divides by sqrt(v), so in float32 a near-zero
gradient's round-off moves single weights by ~1e-6 — by different amounts on different CPUs' kernels
(AVX2 vs AVX-512). In float64 that round-off is ~1e-13 of the update; sqrt(eps64) ~ 1.5e-8 of it is a
bound that holds on any kernel path and still catches a real error (a wrong normaliser is O(1)).
"""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from tests import exact, scripted_engine
from trainer import engines
from trainer.config import JobSpec
from trainer.loop import train

pytestmark = pytest.mark.slow


TOL = torch.finfo(torch.float64).eps ** 0.5  # relative to the largest weight move of the run


def _spec(dtype: str = "float32", **algo) -> JobSpec:
    return JobSpec.model_validate({
        "model": {"path": "builtin:tiny-arith", "dtype": dtype},
        "data": {"eval_size": 8},
        "rollout": {"group_size": 4, "max_new_tokens": 12},
        "algo": {"kl_coef": 0.05, "entropy_coef": 0.01, **algo},
        "optim": {"lr": 1e-3},
        "train": {"steps": 2, "prompts_per_step": 4, "eval_every": 0, "threads": 1, "seed": 1},
    })


@pytest.fixture
def scripted(monkeypatch):
    monkeypatch.setitem(engines.ENGINES, "hf", scripted_engine.ScriptedEngine)
    exact.install()  # float64 models stay float64 through RMSNorm and RoPE (see tests/exact.py)
    yield
    exact.uninstall()


def _weights(run):
    return load_file(run / "checkpoints" / "step-0000002" / "model.safetensors")


def _assert_same_update(a: dict, b: dict, start: dict) -> None:
    move = max((a[k].double() - start[k].double()).abs().max().item() for k in a)
    assert move > 1e-4  # the update did something
    for k in a:
        diff = (a[k] - b[k]).abs().max().item()
        assert diff <= TOL * move, (k, diff, TOL * move)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_micro_batches_leave_the_update_unchanged(tmp_path, models_dir, scripted, agg):
    quiet = lambda m: None  # noqa: E731
    train(_spec("float64", loss_agg=agg), tmp_path / "whole", models_dir=models_dir, log=quiet)
    train(_spec("float64", loss_agg=agg, micro_batch_size=3), tmp_path / "micro", models_dir=models_dir, log=quiet)
    a, b = _weights(tmp_path / "whole"), _weights(tmp_path / "micro")
    assert a["model.embed_tokens.weight"].dtype == torch.float64
    _assert_same_update(a, b, load_file(models_dir / "tiny-arith" / "model.safetensors"))
    la, lb = (_series(tmp_path / r) for r in ("whole", "micro"))
    assert lb == pytest.approx(la, rel=TOL, abs=TOL)


def test_micro_rows_from_a_token_budget():
    from trainer.config import AlgoConfig

    assert AlgoConfig().micro_rows(100) is None                                   # no bound: the whole minibatch
    assert AlgoConfig(micro_batch_tokens=1000).micro_rows(100) == 10
    assert AlgoConfig(micro_batch_tokens=1000).micro_rows(300) == 3               # rounded down: never over
    assert AlgoConfig(micro_batch_tokens=50).micro_rows(300) == 1                 # at least one row
    assert AlgoConfig(micro_batch_tokens=1000, micro_batch_size=4).micro_rows(100) == 4   # the smaller wins
    assert AlgoConfig(micro_batch_tokens=1000, micro_batch_size=40).micro_rows(100) == 10


def test_a_token_budget_bounds_every_forward_and_leaves_the_update_unchanged(tmp_path, models_dir, scripted,
                                                                             monkeypatch):
    """micro_batch_tokens: no forward (graph or none: the reference's, the rows the update skips) holds more padded
    tokens than the budget, and the update is the whole batch's (float64, like micro_batch_size above)."""
    import trainer.online as online

    quiet = lambda m: None  # noqa: E731
    train(_spec("float64"), tmp_path / "whole", models_dir=models_dir, log=quiet)
    seen, real = [], online.forward

    def spy(model, ro, *a, **kw):
        seen.append((len(ro.texts), ro.prompt_ids.shape[1] + ro.completion_ids.shape[1]))
        return real(model, ro, *a, **kw)

    monkeypatch.setattr(online, "forward", spy)
    budget = 60
    train(_spec("float64", micro_batch_tokens=budget), tmp_path / "tokens", models_dir=models_dir, log=quiet)
    assert seen and max(rows for rows, _ in seen) < 16                           # the 16 rows were split
    assert all(rows * w <= budget or rows == 1 for rows, w in seen), seen
    _assert_same_update(_weights(tmp_path / "whole"), _weights(tmp_path / "tokens"),
                        load_file(models_dir / "tiny-arith" / "model.safetensors"))


class _Wider(scripted_engine.ScriptedEngine):
    """The scripted completions, right-padded with 7 more (masked) columns: what a longer sample elsewhere in
    the batch, or on another rank, does to this batch's padded width."""

    def generate(self, prompts, n, params):
        ro = super().generate(prompts, n, params)
        pad = torch.full((len(ro.texts), 7), self.tok.pad_token_id, dtype=ro.completion_ids.dtype)
        ro.completion_ids = torch.cat([ro.completion_ids, pad], 1)
        ro.completion_mask = torch.cat([ro.completion_mask, torch.zeros_like(pad, dtype=ro.completion_mask.dtype)], 1)
        return ro


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_the_padded_width_leaves_the_update_unchanged(tmp_path, models_dir, scripted, monkeypatch, agg):
    """Every aggregation divides by a count that does not depend on padding: Dr. GRPO's constant is the
    generation budget (rollout.max_new_tokens), not the batch's longest sample (the step size would
    otherwise swing with it, and differ between ranks)."""
    quiet = lambda m: None  # noqa: E731
    train(_spec("float64", loss_agg=agg), tmp_path / "tight", models_dir=models_dir, log=quiet)
    monkeypatch.setitem(engines.ENGINES, "hf", _Wider)
    train(_spec("float64", loss_agg=agg), tmp_path / "wide", models_dir=models_dir, log=quiet)
    _assert_same_update(_weights(tmp_path / "tight"), _weights(tmp_path / "wide"),
                        load_file(models_dir / "tiny-arith" / "model.safetensors"))


def _series(run) -> list[float]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [v for r in rows if "loss" in r for v in (r["loss"], r["grad_norm"])]


def test_lora_trains_adapters_only(tmp_path, models_dir, scripted, monkeypatch):
    pytest.importorskip("peft")
    from trainer import loop

    loaded = []  # the policy object the run trains, to read its base weights afterwards
    real_setup = loop.setup

    def keep(*a):
        run = real_setup(*a)
        loaded.append(run.ctx.policy)
        return run

    monkeypatch.setattr(loop, "setup", keep)
    spec = JobSpec.model_validate({**_spec().model_dump(), "model": {"path": "builtin:tiny-arith",
                                                                     "lora": {"r": 4, "alpha": 8}}})
    result = train(spec, tmp_path / "lora", models_dir=models_dir, log=lambda m: None)
    ckpt = tmp_path / "lora" / "checkpoints" / "step-0000002"
    adapter = load_file(ckpt / "adapter_model.safetensors")
    assert adapter and all("lora_" in k for k in adapter)
    assert any(v.abs().max() > 0 for k, v in adapter.items() if "lora_B" in k)  # B starts at 0: it trained
    rows = [json.loads(x) for x in (tmp_path / "lora" / "metrics.jsonl").read_text().splitlines()]
    assert result.status == "succeeded" and rows[-1]["grad_norm"] > 0
    # the base weights are untouched, bit for bit, after two optimiser steps
    start = load_file(models_dir / "tiny-arith" / "model.safetensors")
    base = {k.replace("base_model.model.", "").replace(".base_layer", ""): v
            for k, v in loaded[0].state_dict().items() if "lora_" not in k}
    assert set(start) <= set(base)
    assert all(torch.equal(base[k], start[k]) for k in start)
    # the final checkpoint also holds the merged weights: a plain model equal to merge_and_unload
    import copy

    from transformers import AutoModelForCausalLM

    merged = AutoModelForCausalLM.from_pretrained(ckpt / "merged")
    want = copy.deepcopy(loaded[0]).merge_and_unload().state_dict()
    got = merged.state_dict()
    assert all(torch.allclose(got[k], want[k], atol=1e-6) for k in want)
    assert any(not torch.equal(got[k], start[k]) for k in start if "q_proj" in k)  # the adapters are in it


def test_skipping_zero_signal_rows_leaves_the_update_unchanged(tmp_path, models_dir, scripted, monkeypatch):
    """Zero-variance groups carry advantage 0: with no entropy/KL/value term their rows are skipped
    (counted in the normalisers, never run). Forcing them through must give the same weights."""
    from trainer.estimators import GroupBaseline

    plain = _spec("float64", kl_coef=0.0, entropy_coef=0.0)
    quiet = lambda m: None  # noqa: E731
    train(plain, tmp_path / "skip", models_dir=models_dir, log=quiet)
    monkeypatch.setattr(GroupBaseline, "has_loss", True)  # "another loss term" -> nothing is skipped
    train(plain, tmp_path / "full", models_dir=models_dir, log=quiet)
    rows = [json.loads(x) for x in (tmp_path / "skip" / "metrics.jsonl").read_text().splitlines()][1:]
    assert any(r["update/skipped_row_frac"] > 0 for r in rows)
    full = [json.loads(x) for x in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()][1:]
    assert all(r["update/skipped_row_frac"] == 0 for r in full)
    _assert_same_update(_weights(tmp_path / "skip"), _weights(tmp_path / "full"),
                        load_file(models_dir / "tiny-arith" / "model.safetensors"))
    assert _series(tmp_path / "skip") == pytest.approx(_series(tmp_path / "full"), rel=TOL, abs=TOL)


@pytest.mark.parametrize("shift,factor", [(0.0, 1.0), (torch.log(torch.tensor(2.0)).item(), 0.5),
                                          (-torch.log(torch.tensor(4.0)).item(), 2.0)])
def test_truncated_importance_sampling_reweights_the_policy_loss(tmp_path, models_dir, monkeypatch, shift, factor):
    """An engine whose log-probs are the trainer's + s makes every TIS weight exp(-s), capped at
    tis_cap: the first step's loss (ratio 1, token-mean) is the plain loss times that weight."""
    from trainer.batch import forward

    class ShiftedEngine(scripted_engine.ScriptedEngine):
        def __init__(self, model, tokenizer):
            super().__init__(model, tokenizer)
            self.model = model

        def generate(self, prompts, n, params):
            ro = super().generate(prompts, n, params)
            with torch.no_grad():
                ro.logprobs = (forward(self.model, ro, params.temperature).logp + shift) * ro.completion_mask
            return ro

    monkeypatch.setitem(engines.ENGINES, "hf", ShiftedEngine)
    quiet = lambda m: None  # noqa: E731
    spec = _spec(kl_coef=0.0, entropy_coef=0.0)
    train(spec, tmp_path / "plain", models_dir=models_dir, log=quiet)
    tis = _spec(kl_coef=0.0, entropy_coef=0.0, tis_cap=2.0)
    train(tis, tmp_path / "tis", models_dir=models_dir, log=quiet)
    first = [[json.loads(x) for x in (tmp_path / r / "metrics.jsonl").read_text().splitlines()][1]
             for r in ("plain", "tis")]
    assert first[0]["loss"] != 0
    assert first[1]["loss"] == pytest.approx(factor * first[0]["loss"], rel=1e-3, abs=1e-7)
    assert first[1]["tis/weight_mean"] == pytest.approx(factor, rel=1e-3)
    assert first[1]["tis/capped_frac"] == (1.0 if factor == 2.0 else 0.0)
    assert "tis/weight_mean" not in first[0]


def test_gradient_checkpointing_gives_the_same_update(tmp_path, models_dir, scripted):
    """Recomputing activations in the backward pass changes memory, not the gradients (float64)."""
    quiet = lambda m: None  # noqa: E731
    train(_spec("float64"), tmp_path / "plain", models_dir=models_dir, log=quiet)
    spec = _spec("float64")
    spec.train.gradient_checkpointing = True
    train(spec, tmp_path / "gc", models_dir=models_dir, log=quiet)
    _assert_same_update(_weights(tmp_path / "plain"), _weights(tmp_path / "gc"),
                        load_file(models_dir / "tiny-arith" / "model.safetensors"))
    assert _series(tmp_path / "gc") == pytest.approx(_series(tmp_path / "plain"), rel=TOL, abs=TOL)


def test_lora_reference_is_the_base_with_adapters_off(tmp_path, models_dir, scripted, monkeypatch):
    """With LoRA the KL reference is the policy's own base weights under disable_adapter(), not a second
    full model: its log-probs are the starting model's, and it holds no weights of its own."""
    pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM

    from trainer import loop
    from trainer.batch import forward

    runs = []
    real_setup = loop.setup
    monkeypatch.setattr(loop, "setup", lambda *a: runs.append(real_setup(*a)) or runs[-1])
    spec = JobSpec.model_validate({**_spec().model_dump(), "model": {"path": "builtin:tiny-arith",
                                                                     "lora": {"r": 4, "alpha": 8}}})
    assert spec.algo.kl_coef > 0
    train(spec, tmp_path / "lora", models_dir=models_dir, log=lambda m: None)
    ctx = runs[0].ctx
    assert isinstance(ctx.ref, loop.AdapterOff) and ctx.ref.policy is ctx.policy
    ro = scripted_engine.ScriptedEngine(None, ctx.tok).generate(["3+4", "20-7"], 2, None)
    base = AutoModelForCausalLM.from_pretrained(models_dir / "tiny-arith").eval()
    with torch.no_grad():
        want = forward(base, ro, 1.0).logp
        got = forward(ctx.ref, ro, 1.0).logp
        trained = forward(ctx.policy, ro, 1.0).logp
    m = ro.completion_mask.bool()
    assert torch.allclose(got[m], want[m], atol=1e-5)  # float32: the same weights, other batch layouts
    assert (trained[m] - want[m]).abs().max() > 1e-4  # while the adapted policy has moved


@pytest.mark.parametrize("disable", [True, False])
def test_dropout_is_off_in_the_trained_policy_unless_asked(tmp_path, models_dir, disable):
    """A GPT-2-style model with dropout 0.1 everywhere (and LoRA dropout 0.1): with model.disable_dropout (the
    default) two forwards in train mode give the same log-probs — no noise in ratios, KL or weights."""
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    from trainer.batch import encode, forward
    from trainer.distributed import Dist
    from trainer.models.load import load_models

    tok = AutoTokenizer.from_pretrained(models_dir / "tiny-arith")
    model_dir = tmp_path / "gpt2-dropout"
    GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_positions=64, n_embd=32, n_layer=2, n_head=2,
                               resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1)).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    spec = JobSpec.model_validate({"model": {"path": str(model_dir), "disable_dropout": disable,
                                             "lora": {"r": 4, "dropout": 0.1, "target_modules": ["c_attn"]}}})
    policy, _, _ = load_models(spec, model_dir, None, Dist(), reference=False)
    policy.train()
    ro = encode(tok, ["1+2", "3+4"], ["\\boxed{3}", "\\boxed{7}"])
    torch.manual_seed(0)
    a, b = forward(policy, ro, 1.0).logp, forward(policy, ro, 1.0).logp
    assert torch.equal(a, b) == disable
