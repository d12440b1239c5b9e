"""On-policy distillation (spec.distill): the student samples, the teacher scores the student's own tokens,
each token's advantage is log pi_teacher - log pi_student (minus the reverse KL's sample), alone or with
the verifiers' group advantage; the teacher must share the student's vocabulary."""
from __future__ import annotations

import json

import pytest
import torch

from trainer import algos
from trainer.config import JobSpec
from trainer.loop import train

pytestmark = pytest.mark.slow


def test_distillation_advantage_hand_computed():
    logp = torch.log(torch.tensor([[0.5, 0.25, 0.9], [0.1, 0.2, 0.3]]))
    teacher = torch.log(torch.tensor([[0.25, 0.25, 0.1], [0.1, 0.4, 0.3]]))
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    adv = torch.tensor([1.0, -1.0])
    alone = algos.adv_distill(adv, logp, teacher, mask, 2.0, 0.0)
    assert torch.allclose(alone, 2 * (teacher - logp) * mask)
    both = algos.adv_distill(adv, logp, teacher, mask, 1.0, 0.5)
    assert torch.allclose(both, ((teacher - logp) + 0.5 * adv.unsqueeze(-1)) * mask)
    # the policy gradient of -A_t log pi with A_t = log pi_T - log pi (as data) descends KL(pi || pi_T): the
    # same expected step as differentiating the reverse KL itself (checked exactly on a categorical)
    theta = torch.randn(5, dtype=torch.float64, requires_grad=True)
    t = torch.log_softmax(torch.randn(5, dtype=torch.float64), 0)
    lp = torch.log_softmax(theta, 0)
    pi = lp.exp().detach()
    pg = sum(pi[x] * torch.autograd.grad(-(t[x] - lp[x]).detach() * lp[x], theta, retain_graph=True)[0]
             for x in range(5))
    (kl,) = torch.autograd.grad((lp.exp() * (lp - t)).sum(), theta)
    assert torch.allclose(pg, kl, atol=1e-12)


def _spec(teacher: str, steps: int, **distill) -> JobSpec:
    return JobSpec.model_validate({
        "data": {"eval_size": 8}, "rollout": {"group_size": 4, "max_new_tokens": 10},
        "verifiers": [{"name": "math", "config": {"allow_unevaluated": False}}],
        "distill": {"teacher": teacher, **distill}, "optim": {"lr": 1e-3},
        "train": {"steps": steps, "prompts_per_step": 4, "eval_every": 0, "threads": 1, "seed": 2}})


def _rows(run):
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()][1:]


def test_distilling_from_itself_is_a_fixed_point(tmp_path, models_dir):
    train(_spec("builtin:tiny-arith", 2), tmp_path, models_dir=models_dir, log=lambda m: None)
    rows = _rows(tmp_path)
    assert all(r["distill/reverse_kl"] == 0.0 and r["adv/max_abs"] == 0.0 for r in rows)


def _reverse_kl(student, teacher, tok, seed: int) -> float:
    """KL(student || teacher) per token on 64 prompts x 4 of the student's own samples (a fixed sampling seed)."""
    from trainer.batch import forward
    from trainer.data import arithmetic_split
    from trainer.engines import HFEngine
    from trainer.rollout import SamplingParams

    torch.manual_seed(seed)
    prompts = [s["prompt"] for s in arithmetic_split(64)[1]]
    ro = HFEngine(student, tok).generate(prompts, 4, SamplingParams(10))
    with torch.no_grad():
        d = forward(student, ro, 1.0).logp - forward(teacher, ro, 1.0).logp
    return float(d[ro.completion_mask.bool()].mean())


def test_a_perturbed_student_is_pulled_back_to_its_teacher(tmp_path, models_dir):
    """The bundled model with noise on every weight (0.5 of each tensor's std), distilled from the bundled model
    itself for 12 steps: its reverse KL to the teacher, on 256 of its own samples, falls by more than half (measured
    here: 0.13-0.14 -> 0.03-0.04 over two training seeds and two sampling seeds)."""
    import shutil

    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    student = tmp_path / "noisy"
    shutil.copytree(models_dir / "tiny-arith", student)
    w, g = load_file(student / "model.safetensors"), torch.Generator().manual_seed(0)
    save_file({k: v + 0.5 * v.std() * torch.randn(v.shape, generator=g) for k, v in w.items()},
              student / "model.safetensors")
    spec = _spec("builtin:tiny-arith", 12).model_dump()
    spec["model"]["path"], spec["optim"]["lr"], spec["train"]["prompts_per_step"] = str(student), 1e-4, 8
    spec["train"]["checkpoint_every"] = 12
    train(JobSpec.model_validate(spec), tmp_path / "run", models_dir=models_dir, log=lambda m: None)
    tok = AutoTokenizer.from_pretrained(models_dir / "tiny-arith")
    teacher = AutoModelForCausalLM.from_pretrained(models_dir / "tiny-arith").eval()
    before = _reverse_kl(AutoModelForCausalLM.from_pretrained(student).eval(), teacher, tok, 1)
    after = _reverse_kl(AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "checkpoints" / "step-0000012").eval(),
                        teacher, tok, 1)
    assert before > 0.05 and after < 0.5 * before, (before, after)


def test_a_teacher_with_another_vocabulary_is_a_422_naming_the_field(tmp_path, models_dir):
    from fastapi.testclient import TestClient
    from transformers import LlamaConfig, LlamaForCausalLM

    from service.app import create_app
    from service.settings import Settings

    LlamaForCausalLM(LlamaConfig(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                 num_attention_heads=2,
                                 num_key_value_heads=2)).save_pretrained(models_dir / "other-vocab")
    try:
        app = create_app(Settings(home=tmp_path / "home", models=models_dir), reaper=False)
        with TestClient(app) as c:
            r = c.post("/v1/jobs", json={"train": {"steps": 1}, "distill": {"teacher": "other-vocab"}})
            assert r.status_code == 422, r.text
            d = r.json()["detail"][0]
            assert d["loc"] == ["body", "distill", "teacher"] and "vocabulary of 50 tokens" in d["msg"]
            r = c.post("/v1/jobs", json={"train": {"steps": 1}, "distill": {"teacher": "builtin:tiny-code"}})
            assert r.status_code == 201, r.text
            r = c.post("/v1/jobs", json={"algorithm": "ppo", "train": {"steps": 1}, "ppo": {"critic": "other-vocab"}})
            assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "ppo", "critic"]
    finally:
        import shutil

        shutil.rmtree(models_dir / "other-vocab")
