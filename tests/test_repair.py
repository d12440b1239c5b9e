"""Code repair from test feedback (episodes.env code_repair, trainer/envs/repair.py): a failing public test's
message is the next observation (loss 0), the model revises, and the reward is the hidden tests on the final
answer alone, judged in the jail — a program that prints "PASS" or breaks test collection earns nothing.
Scripted attempts on real builtin:code_repair problems, the real sandbox; then the tiny code model end to end."""
from __future__ import annotations

import json

import pytest
import torch

from trainer import episodes
from trainer.config import DataConfig, EpisodesConfig, JobSpec, VerifierSpec
from trainer.loop import train
from trainer.rollout import Rollout, SamplingParams, left_pad, left_pad_mask
from trainer.scoring import Scorer
from trainer.tasks import task_for

PRINTS_PASS = "```python\nprint('PASS')\nprint('8/8 tests passed')\nraise SystemExit(0)\n```"
# breaks collection: the module ends the process while it loads, and shadows what a naive harness would call
BREAKS_COLLECTION = ("```python\nimport os, sys\ndef check(candidate):\n    return True\nAssertionError = Exception\n"
                     "print('ok')\nos._exit(0)\n```")


class ScriptedRepair:
    """Plays a list of attempts per prompt: attempt k is the reply after k failed public-test rounds."""

    def __init__(self, tok, script: dict[str, list[str]]):
        self.tok, self.script, self.prompts = tok, script, []

    def generate_ids(self, ids, n, params):
        rows = []
        for p in ids:
            text = self.tok.decode(p, skip_special_tokens=False)
            key = next(k for k in self.script if k in text)
            attempt = self.script[key][min(text.count("The tests failed"), len(self.script[key]) - 1)]
            rows.append(self.tok(attempt, add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id])
            self.prompts.append(text)
        T = max(map(len, rows))
        comp = torch.tensor([r + [0] * (T - len(r)) for r in rows])
        mask = torch.tensor([[1] * len(r) + [0] * (T - len(r)) for r in rows])
        return Rollout(left_pad(ids, 0), left_pad_mask(ids, 0), comp, mask, [""] * len(rows),
                       torch.zeros(len(rows), dtype=torch.bool), torch.full(comp.shape, -0.5) * mask)


@pytest.fixture(scope="module")
def problems():
    _, held = task_for("builtin:code_repair").load(DataConfig(dataset="builtin:code_repair", eval_size=4,
                                                              params={"difficulty": 1}))
    return held


def _fence(code: str) -> str:
    return "```python\n" + code.strip() + "\n```"


def _wrong(p) -> str:
    name = p["reference"]["entry_point"]
    return _fence(f"def {name}(*args):\n    return 12345")


def test_feedback_turns_and_the_reward_of_the_final_answer(problems, tiny_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    fixed, first_right, cheat, broken = problems
    script = {fixed["prompt"]: [_wrong(fixed), _fence(fixed["solution"])],   # fails, then fixed
              first_right["prompt"]: [_fence(first_right["solution"])],      # right at once: one turn
              cheat["prompt"]: [_wrong(cheat), PRINTS_PASS],                 # ends printing "PASS"
              broken["prompt"]: [_wrong(broken), BREAKS_COLLECTION]}         # ends breaking collection
    cfg = EpisodesConfig(env={"type": "code_repair"}, max_turns=3, max_episode_tokens=4000,
                         max_observation_tokens=400)
    eng = ScriptedRepair(tok, script)
    eps, _ = episodes.run(eng, tok, [p["prompt"] for p in problems], 1, SamplingParams(600), cfg,
                          episodes.Tools.from_spec(cfg, 0), references=[p["reference"] for p in problems])
    turns = [[t["kind"] for t in e.turns] for e in eps]
    assert turns[0] == ["model", "observation", "model"]        # fixed after one feedback round
    assert turns[1] == ["model"]                                 # public tests passed: the episode ended
    assert turns[2] == turns[3] == ["model", "observation", "model", "observation", "model"]  # max_turns
    assert [t.get("public") for t in eps[0].turns if t["kind"] == "model"] == [False, True]
    # the feedback names the failing call, what came back and what was expected
    obs = eps[0].turns[1]["text"]
    assert "The tests failed" in obs and "returned 12345, expected" in obs
    for e in eps:  # observations carry no loss; every model token does
        s = e.sample
        for t in e.turns:
            _, a, b = t["span"]
            assert set(s.loss[a:b]) == ({1} if t["kind"] == "model" else {0})
    # judged: the final answer alone, by the hidden tests in the jail
    assert [e.model_text() for e in eps] == [e.turns[-1]["text"] for e in eps]
    sc = Scorer([VerifierSpec(name="code")])([e.model_text() for e in eps], [p["reference"] for p in problems])
    assert sc.rewards == [1.0, 1.0, 0.0, 0.0]
    assert [e.finish for e in eps] == ["answer"] * 4  # the last turn answered too: judged as it stands
    m = episodes.metrics(eps, {})
    assert m["episodes/public_first_pass"] == 0.25 and m["episodes/public_fixed"] == 0.25


def test_cheats_as_a_first_answer_score_zero_too(problems):
    """The same two programs as a whole episode's only answer: the public tests reject them (the judge, not
    their prints, decides), and the hidden tests score them 0."""
    refs = [problems[0]["reference"]] * 2
    sc = Scorer([VerifierSpec(name="code")])([PRINTS_PASS, BREAKS_COLLECTION], refs)
    assert sc.rewards == [0.0, 0.0]
    pub = Scorer([VerifierSpec(name="code")])([PRINTS_PASS, BREAKS_COLLECTION], [r["public"] for r in refs])
    assert pub.rewards == [0.0, 0.0]


def test_public_tests_are_not_hidden_ones(problems):
    for p in problems:
        hidden = {line.split("==")[0].strip() for line in p["reference"]["test"].splitlines() if "assert" in line}
        public = {"assert " + line.split("=", 1)[1].strip().replace("candidate", "candidate", 1)
                  for line in p["reference"]["public"]["test"].splitlines() if "got = " in line}
        assert public and not {h.replace("assert ", "") for h in hidden} & {x.replace("assert ", "") for x in public}
        assert "For example" in p["prompt"]


def test_the_task_needs_repair_episodes():
    with pytest.raises(ValueError, match="episodes.env.type: code_repair"):
        JobSpec.model_validate({"data": {"dataset": "builtin:code_repair"}, "verifiers": [{"name": "code"}]})


def test_repair_trains_the_tiny_code_model_end_to_end(tmp_path, models_dir):
    """builtin:tiny-code on builtin:code_repair_tiny: a few real steps; the eval records first and final
    attempts and the fix rate."""
    spec = JobSpec.model_validate({
        "model": {"path": "builtin:tiny-code"},
        "data": {"dataset": "builtin:code_repair_tiny", "eval_size": 8},
        "verifiers": [{"name": "code"}],
        "rollout": {"group_size": 4, "max_new_tokens": 16, "temperature": 1.0},
        "episodes": {"env": {"type": "code_repair"}, "max_turns": 2, "max_episode_tokens": 160,
                     "max_observation_tokens": 120, "eval_tools_off": False},
        "optim": {"lr": 1e-4},
        "train": {"steps": 2, "prompts_per_step": 4, "eval_every": 0, "threads": 1}})
    result = train(spec, tmp_path / "run", models_dir=models_dir, log=lambda m: None)
    assert result.status == "succeeded"
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "episodes/turns" in r]
    assert len(steps) == 2 and all(1 <= r["episodes/turns"] <= 2 for r in steps)
    assert all(0 <= r["episodes/public_first_pass"] <= 1 for r in steps)
    ev = [r for r in rows if "eval/fix_rate" in r]
    assert ev and all(0 <= r["eval/first_accuracy"] <= 1 and 0 <= r["eval/fix_rate"] <= 1 for r in ev)
    records = [json.loads(x)
               for x in (tmp_path / "run" / "evals").glob("step-*.jsonl").__next__().read_text().splitlines()]
    assert all("first_completion" in r and "first_correct" in r for r in records)
    # a problem whose first attempt failed shows the feedback between its attempts
    retried = [r for r in records if len(r["turns"]) == 3]
    assert retried and all(r["turns"][1]["kind"] == "observation" and "The tests failed" in r["turns"][1]["text"]
                           for r in retried)
