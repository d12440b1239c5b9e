"""Procedural function-synthesis problems (the trainer/tasks/code_synth package): deterministic, distinct, graded,
hidden tests that stay hidden and separate behaviours, and the real ``code`` verifier (sandbox) accepting
each solution and rejecting plausible wrong ones.

Host-side checks exec our own ``solution`` sources (trusted code written in the module, never model
output); candidate programs are judged only through the verifier, in the sandbox."""
from __future__ import annotations

import ast
import contextlib
import hashlib
import io
import json
import os
import re
import subprocess
import sys
from collections import Counter, defaultdict

import pytest

from trainer.tasks.code_synth import catalogue, function_problems, stdio_problems
from verifiers import Status, get_verifier
from verifiers.code.verifier import FunctionReference, StdioReference, parse_reference

EXAMPLE = re.compile(r"For example, `(.+)` returns `(.+)`\.$", re.S)
STDIO_EXAMPLE = re.compile(r"Example input:\n```\n(.*?)```\nExample output:\n```\n(.*?)```$", re.S)


@pytest.fixture(scope="module")
def fn() -> list[dict]:
    return function_problems(0)


@pytest.fixture(scope="module")
def io_() -> list[dict]:
    return stdio_problems(0)


@pytest.fixture(scope="module")
def v():
    from sandbox import local
    from sandbox.types import SandboxUnavailable

    try:
        local.probe()
    except SandboxUnavailable as e:
        pytest.skip(f"local sandbox unavailable on this machine: {e}")
    return get_verifier("code", {"timeout_s": 5.0})


# -- helpers: our trusted solutions, run here ------------------------------------------------------------
def load(problem: dict):
    ns: dict = {}
    exec(problem["solution"], ns)
    return ns[problem["reference"]["entry_point"]]


def asserts(problem: dict) -> list[tuple[tuple, object, str, list[str]]]:
    """(args, expected, expected's source, args' sources) of each hidden assert."""
    src = problem["reference"]["test"]
    out = []
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.Assert):
            call, want = node.test.left, node.test.comparators[0]
            out.append((tuple(ast.literal_eval(a) for a in call.args), ast.literal_eval(want),
                        ast.get_source_segment(src, want), [ast.get_source_segment(src, a) for a in call.args]))
    return out


def passes(problem: dict, candidate) -> bool:
    ns: dict = {}
    exec(problem["reference"]["test"], ns)
    try:
        ns["check"](candidate)
    except Exception:  # an assertion, or the candidate raising: either way it fails
        return False
    return True


def run_program(src: str, stdin: str) -> str:
    out, old = io.StringIO(), sys.stdin
    sys.stdin = io.StringIO(stdin)
    try:
        with contextlib.redirect_stdout(out):
            exec(src, {"__name__": "__main__"})
    finally:
        sys.stdin = old
    return out.getvalue()


def signature(problem: dict) -> str:
    return problem["solution"].split("(", 1)[1].split(":\n", 1)[0]


def refs() -> dict[str, object]:
    """The module's trusted reference of each problem (safe outside a problem's domain, unlike a solution:
    collatz_sequence's loop never ends at 0)."""
    return {s.name: s.ref for s in catalogue()}


def neighbours() -> dict[str, list[str]]:
    """Each spec's neighbours in its family with the same signature (add_2 and add_4 for add_3)."""
    groups: dict[tuple, list[str]] = defaultdict(list)
    for s in catalogue():
        groups[(s.family, s.params, s.ret)].append(s.name)
    out = {}
    for names in groups.values():
        for i, n in enumerate(names):
            out[n] = names[max(i - 1, 0):i] + names[i + 1:i + 2]
    return out


# -- determinism, counts, distribution ------------------------------------------------------------------
def test_same_seed_same_problems_and_another_seed_other_tests(fn, io_):
    assert function_problems(0) == fn and stdio_problems(0) == io_
    other, other_io = function_problems(1), stdio_problems(1)
    assert {p["id"] for p in other} == {p["id"] for p in fn}  # the same tasks...
    by_id = {p["id"]: p for p in fn}
    assert sum(p["reference"]["test"] != by_id[p["id"]]["reference"]["test"] for p in other) > 0.9 * len(fn)
    assert sum(p["prompt"] != by_id[p["id"]]["prompt"] for p in other) > 0.5 * len(fn)  # ...other examples
    assert [p["id"] for p in other] != [p["id"] for p in fn]  # and another order
    io_by_id = {p["id"]: p for p in io_}
    assert sum(p["reference"] != io_by_id[p["id"]]["reference"] for p in other_io) > 0.9 * len(io_)


def test_same_problems_in_another_process(fn, io_):
    # String hashing differs per process; nothing may depend on it (set order, hash()).
    code = ("import hashlib, json; from trainer.tasks.code_synth import function_problems, stdio_problems; "
            "print(hashlib.sha256(json.dumps([function_problems(0), stdio_problems(0)]).encode()).hexdigest())")
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120,
                         check=True).stdout.strip()
    assert got == hashlib.sha256(json.dumps([fn, io_]).encode()).hexdigest()


def test_counts_levels_and_formats(fn, io_):
    assert len(fn) >= 1000
    assert len({p["prompt"] for p in fn}) == len(fn) == len({p["id"] for p in fn})
    assert len({p["reference"]["entry_point"] for p in fn}) == len(fn)
    levels = Counter(p["reference"]["difficulty"] for p in fn)
    assert set(levels) == {1, 2, 3} and levels[1] >= 300
    assert all(0.25 <= n / len(fn) <= 0.42 for n in levels.values()), levels
    families = Counter(p["reference"]["family"] for p in fn)
    assert len(families) >= 40 and max(families.values()) <= 0.15 * len(fn), families.most_common(3)
    for p in fn:
        ref = p["reference"]
        assert isinstance(parse_reference(ref), FunctionReference)
        assert 6 <= len(asserts(p)) <= 10
        assert f"`{ref['entry_point']}(" in p["prompt"] and p["prompt"].count("For example") == 1
        assert p["solution"].startswith(f"def {ref['entry_point']}(")
    assert len(io_) >= 300 and len({p["prompt"] for p in io_}) == len(io_)
    assert {1, 2, 3} == {p["reference"]["difficulty"] for p in io_}
    for p in io_:
        assert isinstance(parse_reference(p["reference"]), StdioReference)
        assert 4 <= len(p["reference"]["tests"]) <= 6
        assert all(t["stdin"].endswith("\n") for t in p["reference"]["tests"])  # input() never meets EOF


def test_level_one_is_one_easy_operation(fn):
    easy = {p["reference"]["entry_point"]: p for p in fn if p["reference"]["difficulty"] == 1}
    for name in ("reverse_string", "sum_list", "multiply_each_by_2", "add_1_to_each", "keep_evens"):
        assert name in easy
    one_liners = sum(p["solution"].count("\n") == 2 for p in easy.values())  # def line + one return
    assert one_liners >= 0.95 * len(easy)


# -- hidden tests stay hidden; the one example is right ---------------------------------------------------
def test_prompts_show_one_correct_example_and_no_hidden_case(fn, io_):
    checked = 0
    for p in fn:
        assert "assert" not in p["prompt"] and "check(" not in p["prompt"]
        call_src, out_src = EXAMPLE.search(p["prompt"]).groups()
        call = ast.parse(call_src, mode="eval").body
        args = tuple(ast.literal_eval(a) for a in call.args)
        assert load(p)(*args) == ast.literal_eval(out_src)
        for hidden_args, want, want_src, arg_srcs in asserts(p):
            assert hidden_args != args
            # Short forms ([], 0, 'a', True) occur in prompts by chance; longer ones would be a leak.
            for shown in arg_srcs + ([] if isinstance(want, bool) else [want_src]):
                if len(shown) >= 5:
                    checked += 1
                    assert shown not in p["prompt"], (p["id"], shown)
    for p in io_:
        stdin, stdout = STDIO_EXAMPLE.search(p["prompt"]).groups()
        assert run_program(p["solution"], stdin) == stdout
        for t in p["reference"]["tests"]:
            assert t["stdin"] != stdin
            for shown in (t["stdin"].strip(), t["stdout"].strip()):
                if len(shown) >= 5 and shown not in ("True", "False"):
                    checked += 1
                    assert shown not in p["prompt"], (p["id"], shown)
    assert checked > 5000  # the check above looked at real values


# -- the hidden tests separate behaviours (our solutions, on the host) -----------------------------------
def test_solutions_pass_and_plausible_wrong_answers_fail(fn, io_):
    ref, near = refs(), neighbours()
    for p in fn:
        name, f = p["reference"]["entry_point"], load(p)
        assert passes(p, f), p["id"]
        first = asserts(p)[0][1]
        for wrong in (lambda *a: a[0], lambda *a: None, lambda *a: first):  # echo, nothing, a constant
            assert not passes(p, wrong), p["id"]
        for other in near[name]:  # the off-by-one variants: add_2 for add_3, x >= 3 for x > 3
            assert not passes(p, ref[other]), (p["id"], other)
    for p in io_:
        tests = p["reference"]["tests"]
        assert all(run_program(p["solution"], t["stdin"]).rstrip() == t["stdout"].rstrip() for t in tests), p["id"]
        assert Counter(t["stdout"] for t in tests).most_common(1)[0][1] <= (len(tests) + 1) // 2  # no constant


def test_no_two_problems_are_the_same_function_on_their_tests(fn):
    # Distinct prompts are not enough: "keep evens" and "keep multiples of 2" would be one problem twice.
    ref, groups = refs(), defaultdict(list)
    for p in fn:
        groups[signature(p)].append((p["id"], ref[p["reference"]["entry_point"]], [a for a, *_ in asserts(p)]))
    same = []
    for group in groups.values():
        for i, (ida, fa, xa) in enumerate(group):
            for idb, fb, xb in group[i + 1:]:
                # Small inputs first: most pairs differ there, and power_of_2 of a million is slow.
                if all(_same(fa, fb, x) for x in sorted(xa + xb, key=lambda x: len(repr(x)))):
                    same.append((ida, idb))
    assert not same


def _same(fa, fb, args: tuple) -> bool:
    try:
        return fa(*args) == fb(*args)
    except Exception:  # outside one of their domains: they differ there
        return False


# -- the real verifier, in the sandbox -------------------------------------------------------------------
def _spread(problems: list[dict]) -> list[dict]:
    """Deterministic sample: the first problem (by id) of each (family, difficulty)."""
    first: dict[tuple, dict] = {}
    for p in sorted(problems, key=lambda p: p["id"]):
        first.setdefault((p["reference"]["family"], p["reference"]["difficulty"]), p)
    return list(first.values())


def near_miss(name: str, near: dict[str, list[str]]) -> str | None:
    """The same template with another parameter (add_4 for add_3, x > 4 for x > 3): the off-by-one answer."""
    same = [o for o in near[name] if re.sub(r"\d+", "k", o) == re.sub(r"\d+", "k", name)]
    return same[0] if same else None


def fenced(code: str) -> str:
    return f"```python\n{code}\n```"


def test_verifier_accepts_solutions_and_rejects_wrong_ones(v, fn, io_):
    by_name = {p["reference"]["entry_point"]: p for p in fn}
    near = neighbours()
    sample = _spread(fn)  # every family at each of its levels: about 90
    assert {p["reference"]["family"] for p in sample} == {p["reference"]["family"] for p in fn}
    wrong, off_by_one = [], 0
    for p in sample:
        name = p["reference"]["entry_point"]
        if other := near_miss(name, near):
            off_by_one += 1
            wrong.append(by_name[other]["solution"].replace(f"def {other}(", f"def {name}(", 1))
        else:  # return the first argument unchanged
            wrong.append(p["solution"].split("\n")[0] + "\n    return " + signature(p).split(":")[0] + "\n")
    refs = [p["reference"] for p in sample]
    verdicts = v.verify_batch([fenced(p["solution"]) for p in sample] + [fenced(w) for w in wrong], refs + refs)
    ok, bad = verdicts[:len(sample)], verdicts[len(sample):]
    assert [(p["id"], x.status) for p, x in zip(sample, ok) if x.status is not Status.correct] == []
    assert [(p["id"], x.status) for p, x in zip(sample, bad) if x.status is not Status.wrong] == []
    assert len(sample) >= 80 and off_by_one >= 30  # about half are the near miss, not the easy echo

    io_sample = _spread(io_)
    assert {p["reference"]["difficulty"] for p in io_sample} == {1, 2, 3} and len(io_sample) >= 80
    io_by_name = {p["id"].split("/", 1)[1]: p for p in io_}
    wrong_io = []
    for i, p in enumerate(io_sample):
        other = near_miss(p["id"].split("/", 1)[1], near)
        if other in io_by_name:  # the off-by-one program
            wrong_io.append(io_by_name[other]["solution"])
        else:  # print nothing, or echo the input
            wrong_io.append("xs = input()\n" if i % 2 else "print(input())\n")
    assert sum(w.startswith("def ") for w in wrong_io) >= 30
    refs = [p["reference"] for p in io_sample]
    verdicts = v.verify_batch([fenced(p["solution"]) for p in io_sample] + [fenced(w) for w in wrong_io],
                              refs + refs)
    ok, bad = verdicts[:len(io_sample)], verdicts[len(io_sample):]
    assert [(p["id"], x.status, x.reason) for p, x in zip(io_sample, ok) if x.status is not Status.correct] == []
    assert [(p["id"], x.status) for p, x in zip(io_sample, bad) if x.status is not Status.wrong] == []
