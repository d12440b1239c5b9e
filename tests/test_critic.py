"""PPO's separate critic network (`ppo.critic`): it learns values, only it learns from the value
loss, it must share the policy's vocabulary, and its weights resume with the run."""
from __future__ import annotations

import pytest
import torch

from trainer.batch import forward
from trainer.config import JobSpec
from trainer.context import Counts
from trainer.distributed import Dist
from trainer.engines import ENGINES
from trainer.estimators import ModelCritic, make_estimator
from trainer.loop import ModelPathError, train
from trainer.rollout import SamplingParams


def _spec(**ppo) -> JobSpec:
    return JobSpec.model_validate({
        "algorithm": "ppo", "ppo": {"critic": "builtin:tiny-arith", **ppo},
        "data": {"eval_size": 8}, "rollout": {"group_size": 4, "max_new_tokens": 10},
        "optim": {"lr": 1e-4}, "train": {"steps": 3, "prompts_per_step": 4, "eval_every": 0, "threads": 1},
    })


@pytest.fixture(scope="module")
def tiny(models_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = models_dir / "tiny-arith"
    return path, AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)


def test_value_loss_trains_the_critic_only(tiny):
    from transformers import AutoModelForCausalLM

    path, policy, tok = tiny
    critic = make_estimator(_spec(), 128, lambda p: AutoModelForCausalLM.from_pretrained(path).train())
    assert isinstance(critic, ModelCritic) and not critic.needs_hidden and critic.has_loss
    torch.manual_seed(0)
    ro = ENGINES["hf"](policy, tok).generate(["3+4", "20-7"], 4, SamplingParams(10))
    mask = ro.completion_mask.float()
    rewards = torch.tensor([1.0, 0, 0, 1, 0, 0, 0, 1])
    adv = critic.prepare(ro, rewards, slice(0, 8), mask, None, None, Dist())
    # the head starts at V = 0 and gamma = lam = 1: every completion token's advantage is its row's reward,
    # whitened over the masked tokens — known exactly
    tok = rewards.unsqueeze(1).expand_as(mask)[mask.bool()]
    want = (rewards.unsqueeze(1) - tok.mean()) / (tok.var(unbiased=False) + 1e-8).sqrt() * mask
    assert torch.allclose(adv, want, atol=1e-5)
    assert critic.explained_var == pytest.approx(0.0, abs=1e-6)  # V = 0 explains none of the returns' variance
    torch.nn.init.normal_(critic.head.proj.weight, std=0.1)  # as after its first update (it starts at V = 0)
    policy.zero_grad(set_to_none=True)
    fwd = forward(policy, ro, 1.0)
    loss, stats = critic.loss(fwd, ro, torch.arange(8), mask, Counts(int(mask.sum()), 8, mask.shape[1]))
    loss.backward()
    assert loss.item() > 0 and "value/loss" in stats
    assert all(p.grad is None for p in policy.parameters())  # the value loss never reaches the policy
    assert all(p.grad is not None for p in critic.parameters())
    assert any(p.grad.abs().sum() > 0 for p in critic.net.parameters())  # the backbone learns, not just the head


def test_critic_learns_values_and_its_weights_are_checkpointed(tmp_path, models_dir, tiny):
    from safetensors.torch import load_file

    run = tmp_path / "run"
    res = train(_spec(value_clip=None), run, models_dir=models_dir, log=lambda m: None)
    assert res.status == "succeeded"
    state = torch.load(run / "checkpoints" / "step-0000003" / "trainer_state.pt", weights_only=False)
    start = load_file(tiny[0] / "model.safetensors")
    critic = state["estimator"]["critic"]
    assert max((critic[k] - start[k]).abs().max().item() for k in start) > 1e-5  # the critic trained
    assert "value_head" in state["estimator"]


def test_critic_with_another_vocabulary_is_refused(tmp_path, models_dir):
    from transformers import LlamaConfig, LlamaForCausalLM

    other = tmp_path / "other-vocab"
    LlamaForCausalLM(LlamaConfig(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                 num_attention_heads=2, num_key_value_heads=2)).save_pretrained(other)
    with pytest.raises(ModelPathError, match="vocabulary of 50 tokens"):
        train(_spec(critic=str(other)), tmp_path / "run", models_dir=models_dir, log=lambda m: None)


def test_critic_resumes_with_the_run(tmp_path, models_dir):
    """Paused after step 1 and resumed, the critic (backbone and head) ends bit-for-bit where an
    uninterrupted run's ends: its weights come back from the checkpoint, not from its starting model."""
    quiet = lambda m: None  # noqa: E731
    spec = _spec()
    train(spec, tmp_path / "full", models_dir=models_dir, log=quiet)
    calls = {"n": 0}

    def pause_once():
        calls["n"] += 1
        return "pause" if calls["n"] == 1 else None

    first = train(spec, tmp_path / "split", models_dir=models_dir, log=quiet, should_stop=pause_once)
    assert (first.status, first.step) == ("paused", 1)
    train(spec, tmp_path / "split", models_dir=models_dir, log=quiet)
    a, b = (torch.load(tmp_path / r / "checkpoints" / "step-0000003" / "trainer_state.pt", weights_only=False)
            ["estimator"] for r in ("full", "split"))
    assert set(a["critic"]) == set(b["critic"])
    assert all(torch.equal(a["critic"][k], b["critic"][k]) for k in a["critic"])
    assert all(torch.equal(a["value_head"][k], b["value_head"][k]) for k in a["value_head"])


def test_explained_variance_hand_computed():
    from trainer.estimators import _explained_variance

    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    returns = torch.tensor([[1.0, 2.0, 9.0], [3.0, 4.0, 5.0]])  # masked: 1, 2, 3, 4, 5 (var 2)
    assert _explained_variance(returns.clone(), returns, mask, Dist()) == pytest.approx(1.0)  # exact critic
    assert _explained_variance(torch.full_like(returns, 3.0), returns, mask, Dist()) == pytest.approx(0.0)  # the mean
    noisy = returns + torch.tensor([[1.0, -1.0, 0.0], [1.0, -1.0, 1.0]])  # residuals var 0.96
    assert _explained_variance(noisy, returns, mask, Dist()) == pytest.approx(1 - 0.96 / 2)


def test_ppo_reports_explained_variance_and_the_value_clip_fraction(tmp_path, models_dir):
    import json

    spec = _spec(value_clip=0.01, value_lr=1e-2).model_dump()
    spec["algo"]["ppo_epochs"] = 2  # the second pass moves the values past the clip
    train(JobSpec.model_validate(spec), tmp_path, models_dir=models_dir, log=lambda m: None)
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()][1:]
    assert all(r["value/explained_var"] <= 1 and 0 <= r["value/clip_frac"] <= 1 for r in rows)
    assert any(r["value/clip_frac"] > 0 for r in rows)
    assert rows[0]["value/explained_var"] == pytest.approx(0.0, abs=1e-6)  # the head starts at V = 0
