"""Rewards are attack surface: an echoed question earns nothing from a task's own judge. The held-out eval
reports a strict accuracy beside the reward's own, a job that loosens its task's judge is warned, and every
problem's outcome and completion is kept (paired comparisons, audits after the fact)."""
from __future__ import annotations

import json

import pytest

from trainer.config import JobSpec
from trainer.evaluation import loosened, strict_verifiers
from trainer.scoring import Scorer
from verifiers.spec import VerifierSpec

ECHOES = ["\\boxed{15 - 43}", "15 - 43", "The answer is 15-43."]


@pytest.mark.parametrize("task", ["chain_sum", "basic_arithmetic"])
def test_an_echoed_question_scores_under_the_lenient_reward_and_not_under_the_tasks_judge(task):
    ref = {"answer": "-28"}
    lenient = Scorer([VerifierSpec(name="math")])(ECHOES + ["\\boxed{-28}"], [ref] * 4)
    assert lenient.correct == [True, True, True, True]  # what the old real-math recipe rewarded
    spec = JobSpec.model_validate({"data": {"dataset": f"builtin:{task}"}, "verifiers": [{"name": "math"}]})
    strict = Scorer(strict_verifiers(spec))(ECHOES + ["\\boxed{-28}"], [ref] * 4)
    assert strict.correct == [False, False, False, True]


def test_a_job_loosening_its_tasks_judge_is_warned_and_the_recipes_are_strict():
    from service.cli.recipes import recipe

    lenient = JobSpec.model_validate({"data": {"dataset": "builtin:chain_sum"}, "verifiers": [{"name": "math"}]})
    (w,) = loosened(lenient)
    assert "allow_unevaluated: true" in w and "builtin:chain_sum" in w and "eval/strict_accuracy" in w
    strict = JobSpec.model_validate({"data": {"dataset": "builtin:chain_sum"},
                                     "verifiers": [{"name": "math", "config": {"allow_unevaluated": False}}]})
    assert loosened(strict) == []
    for name in ("demo-math", "demo-code", "real-math", "real-code", "demo-math-multipass"):
        assert loosened(JobSpec.model_validate(recipe(name))) == [], name


def test_a_dataset_file_is_judged_by_the_jobs_first_verifier_with_arithmetic_stated(tmp_path):
    f = tmp_path / "d.jsonl"
    f.write_text(json.dumps({"prompt": "2+2", "reference": "4"}) + "\n")
    spec = JobSpec.model_validate({"data": {"dataset": str(f)},
                                   "verifiers": [{"name": "math", "weight": 0.5}, {"name": "format"}]})
    (v,) = strict_verifiers(spec)
    assert v.name == "math" and v.config["allow_unevaluated"] is False and v.weight == 1.0


def test_each_eval_keeps_every_problems_outcome_and_completion(tmp_path, models_dir):
    from trainer.loop import train

    seen = {}
    spec = JobSpec.model_validate({"data": {"eval_size": 12}, "rollout": {"group_size": 4, "max_new_tokens": 12},
                                   "verifiers": [{"name": "math", "config": {"allow_unevaluated": False}}],
                                   "train": {"steps": 2, "prompts_per_step": 2, "eval_every": 1, "threads": 1}})
    train(spec, tmp_path, models_dir=models_dir, log=lambda m: None, on_eval=lambda s, recs: seen.setdefault(s, recs))
    assert sorted(seen) == [0, 1, 2]
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    for row in rows:
        recs = seen[row["step"]]
        stored = [json.loads(x)
                  for x in (tmp_path / "evals" / f"step-{row['step']:07d}.jsonl").read_text().splitlines()]
        assert stored == recs and len(recs) == 12 and [r["index"] for r in recs] == list(range(12))
        assert row["eval/accuracy"] == sum(r["correct"] for r in recs) / 12
        assert row["eval/strict_accuracy"] == sum(r["strict_correct"] for r in recs) / 12
        assert all(isinstance(r["completion"], str) and r["id"] for r in recs)
    assert "eval/drift_kl_from_start" in rows[-1] and rows[0]["eval/drift_kl_from_start"] == pytest.approx(0, abs=1e-6)


def test_the_tasks_judge_keeps_the_jobs_own_limits():
    spec = JobSpec.model_validate({"data": {"dataset": "builtin:chain_sum"},
                                   "verifiers": [{"name": "math", "config": {"budget_s": 3.0}}]})
    (v,) = strict_verifiers(spec)
    assert v.config == {"budget_s": 3.0, "allow_unevaluated": False}
