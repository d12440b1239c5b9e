"""The math verifier: the case table (tests/data/math_cases.py), its contract, and its time budget
in the places where signal-based timeouts fail (thread pools, Celery prefork children)."""
from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from verifiers import get_verifier
from verifiers.base import Status, Verdict
from verifiers.math import MathVerifier

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("math_cases", ROOT / "tests" / "data" / "math_cases.py")
cases = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cases)

SLOW_SYMPY = r"9^{9^{9^{9}}}"  # sympy grinds on this for well over 30 s: only the hard kill stops it
# The product bound: a check returns a verdict within its budget_s (1 s by default). What a check does
# after its own deadline is a poll() wake-up, handing the kill to a thread and building a Verdict
# (well under 10 ms); SLACK_S is room for a loaded CI machine to deschedule the process on top of that,
# not a measured latency. Latency itself is measured in bench/math_verifier.py.
SLACK_S = 0.25


@pytest.fixture(scope="module")
def verifier():
    v = MathVerifier({})
    v.warm_up()
    return v


def _ids():
    return [f"{c}-{i}" for i, (c, *_rest) in enumerate(cases.CASES)]


@pytest.mark.parametrize("category,gold,pred,expected", cases.CASES, ids=_ids())
def test_case_table(verifier, category, gold, pred, expected):
    verdict = verifier.verify(cases.completion_for(category, pred), gold)
    if expected == "fail":
        assert verdict.status in (Status.wrong, Status.timeout, Status.unparseable), verdict
    else:
        assert verdict.status.value == expected, verdict
    assert verdict.score == (1.0 if verdict.status is Status.correct else 0.0)


PATHOLOGICAL = [c for c in cases.CASES if c[0] == "pathological" or len(c[2]) > 10_000]


def test_pathological_rows_return_within_the_budget(verifier):
    """Huge exponents, nested radicals, long sums, deep LaTeX, 200k-character completions: each
    check returns within budget_s (parse phase and sympy phase together), one after another, so
    the workers killed by one row must be replaced in time for the next."""
    assert len(PATHOLOGICAL) >= 40
    budget = verifier.config.budget_s
    for category, gold, pred, _expected in PATHOLOGICAL:
        t0 = time.monotonic()
        verdict = verifier.verify(cases.completion_for(category, pred), gold)
        elapsed = time.monotonic() - t0
        assert elapsed <= budget + SLACK_S, (round(elapsed, 3), verdict.status, pred[:80])
        assert verdict.status is not Status.error, verdict


def test_budget_holds_for_threads_when_all_workers_are_busy():
    """More concurrent checks than workers, each one sympy would grind on for minutes: the ones that
    get a worker are killed at the deadline, the ones waiting for a worker give up at it."""
    v = MathVerifier({"timeout_s": 30, "budget_s": 1.0})
    v.warm_up()

    def timed(job):
        t0 = time.monotonic()
        verdict = v.verify(*job)
        return verdict, time.monotonic() - t0

    jobs = [(f"\\boxed{{{SLOW_SYMPY}}}", str(k)) for k in range(6)]
    with ThreadPoolExecutor(max_workers=6) as pool:
        got = list(pool.map(timed, jobs))
    for verdict, elapsed in got:
        assert verdict.status is Status.timeout, verdict
        assert elapsed <= 1.0 + SLACK_S, elapsed
    # 6 checks, 2 workers: at most 2 got a worker in time to use (most of) their budget; the others waited,
    # and the wait came off their budget: they gave up waiting, or got a freed (freshly forked) worker
    # with what was left of it — never a budget of their own again
    reasons = [verdict.reason for verdict, _ in got]

    def sympy_time(reason: str) -> float:  # "sympy check exceeded 0.98s" → 0.98; never got a worker → 0
        return float(reason.split()[-1].rstrip("s")) if reason.startswith("sympy check exceeded") else 0.0

    assert 1 <= sum(sympy_time(r) > 0.5 for r in reasons) <= v.config.workers == 2, reasons
    assert v.verify("\\boxed{2\\sqrt{2}}", "\\sqrt{8}").status is Status.correct  # replacements are ready


def test_a_check_whose_wait_used_the_whole_budget_leaves_the_worker_alive():
    """A check that gets a worker only as its budget runs out gives up without sending the work: sending
    it would time out at once and kill (and re-fork) a healthy worker."""
    from verifiers.math.worker import get_pool

    v = MathVerifier({"budget_s": 1.0})
    v.warm_up()
    pool = get_pool(v.config.workers)
    before = {w.pid for w in pool._idle}
    status, reason = pool.check("2", "2", None, deadline=time.monotonic() - 0.001, timeout_s=30, startup_timeout_s=30)
    assert (status, reason) == ("timeout", "no math worker free within the check's time budget")
    assert {w.pid for w in pool._idle} == before  # the same workers, none killed
    assert v.verify("\\boxed{4}", "4").status is Status.correct


def test_budget_covers_the_parse_phase():
    """Time spent extracting and parsing comes off the sympy deadline: the whole check is bounded."""
    v = MathVerifier({"timeout_s": 30, "budget_s": 0.6})
    v.warm_up()
    long_completion = "Let us think. " * 3000 + f"So the answer is $\\boxed{{{SLOW_SYMPY}}}$."
    t0 = time.monotonic()
    verdict = v.verify(long_completion, "2")
    assert verdict.status is Status.timeout
    assert time.monotonic() - t0 <= 0.6 + SLACK_S


def test_table_is_broad_and_balanced():
    by_expected = {}
    for category, _g, _p, expected in cases.CASES:
        by_expected.setdefault(expected, set()).add(category)
    assert len(cases.CASES) >= 300
    assert len(by_expected["correct"]) >= 8 and len(by_expected["wrong"]) >= 8  # near misses in every category


def test_trainer_contract_boxed_integer():
    assert MathVerifier({}).verify("... \\boxed{19}", "19") == Verdict(
        score=1.0, status=Status.correct, reason="", details={"answer": "19", "found_by": "boxed"})
    assert MathVerifier({}).verify("... \\boxed{18}", "19").status is Status.wrong
    assert MathVerifier({}).verify("no box here and no ending", "19").status is Status.unparseable


def test_registry_builds_it_with_config():
    v = get_verifier("math", {"timeout_s": 0.5})
    assert isinstance(v, MathVerifier) and v.config.timeout_s == 0.5
    with pytest.raises(ValueError):
        MathVerifier({"timeout": 3})  # unknown keys are an error, not ignored


def test_import_verifiers_and_ordinary_checks_do_not_import_sympy():
    code = ("import sys, verifiers; from verifiers.math import MathVerifier; "
            "v = MathVerifier(); assert v.verify('so \\\\boxed{0.75}', '\\\\frac{3}{4}').score == 1.0; "
            "print('sympy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_verify_batch_matches_verify(verifier):
    rows = [c for c in cases.CASES if c[0] in ("symbolic", "intervals", "extract")]
    completions = [cases.completion_for(c[0], c[2]) for c in rows] + [f"\\boxed{{{SLOW_SYMPY}}}"]
    references = [c[1] for c in rows] + ["2"]
    batch = verifier.verify_batch(completions, references)  # the symbolic ones run on both workers
    assert batch[:-1] == [verifier.verify(c, r) for c, r in zip(completions[:-1], references[:-1])]
    assert batch[-1].status is Status.timeout
    with pytest.raises(ValueError):
        verifier.verify_batch(["a"], [])


def test_a_repeated_pair_is_checked_once_and_gets_its_own_verdict(verifier, monkeypatch):
    """A GRPO group repeats answers: each distinct (completion, reference) pair is checked once, every
    row still gets the verdict verify() gives it, and rows never share a details dict."""
    calls = {"prepare": 0, "symbolic": 0}
    for name in calls:
        fn = getattr(MathVerifier, f"_{name}")
        monkeypatch.setattr(MathVerifier, f"_{name}",
                            lambda self, *a, _fn=fn, _n=name: (calls.__setitem__(_n, calls[_n] + 1), _fn(self, *a))[1])
    sym = "\\boxed{\\sqrt{2}\\cdot\\sqrt{8}}"  # needs sympy
    ref_dict = {"answer": "4", "source": "gsm"}
    completions = [sym, "\\boxed{4}", sym, "\\boxed{5}", "\\boxed{4}", "\\boxed{4}", sym]
    references = ["4", "4", "4", "4", ref_dict, dict(ref_dict), "5"]
    batch = verifier.verify_batch(completions, references)
    # distinct pairs: (sym,4) (b4,4) (b5,4) (b4,dict) (sym,5); the dict reference equal by value is shared
    assert calls == {"prepare": 5, "symbolic": 2}
    assert [v.status for v in batch] == [Status.correct, Status.correct, Status.correct, Status.wrong,
                                         Status.correct, Status.correct, Status.wrong]
    assert batch == [verifier.verify(c, r) for c, r in zip(completions, references)]
    assert batch[0] is not batch[2] and batch[0].details is not batch[2].details


def test_gold_is_parsed_once():
    from verifiers.math.verifier import _parse_gold

    v = MathVerifier()
    v.verify("\\boxed{7}", "\\frac{14}{2} ")
    hits = _parse_gold.cache_info().hits
    for _ in range(5):
        v.verify("\\boxed{7}", "\\frac{14}{2} ")
    assert _parse_gold.cache_info().hits == hits + 5


def test_timeout_is_hard_and_worker_recovers():
    v = MathVerifier({"timeout_s": 0.3})
    v.warm_up()
    t0 = time.monotonic()
    verdict = v.verify(f"\\boxed{{{SLOW_SYMPY}}}", "2")
    assert verdict.status is Status.timeout and verdict.score == 0.0
    assert time.monotonic() - t0 < 10.0  # generous for loaded CI; without the kill it runs far longer
    assert v.verify("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{1}{2}\\sqrt{3}").status is Status.correct


def test_workers_killed_while_idle_are_replaced():
    from verifiers.math.worker import get_pool

    v = MathVerifier()
    v.warm_up()
    assert v.verify("\\boxed{\\sqrt2}", "\\sqrt{2}").status is Status.correct
    for w in list(get_pool(v.config.workers)._idle):
        os.kill(w.pid, signal.SIGKILL)  # what the OOM killer would do
    assert v.verify("\\boxed{\\sqrt2}", "\\sqrt{2}").status is Status.correct


def _children(ppid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[1]) == ppid:
            found.append(int(stat.parent.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc")
def test_busy_worker_exits_when_its_parent_dies():
    code = textwrap.dedent(f"""
        import threading, time
        from verifiers.math import MathVerifier
        from verifiers.math.worker import get_pool
        v = MathVerifier({{"timeout_s": 60, "workers": 1}})
        v.warm_up()
        get_pool(1)._idle[0].wait_ready(time.monotonic() + 60)
        threading.Thread(target=v.verify, args=(r"\\boxed{{{SLOW_SYMPY}}}", "2"), daemon=True).start()
        time.sleep(0.5)  # the request is sent: the worker is grinding on the power tower, not reading stdin
        print(get_pool(1)._live, flush=True)
        time.sleep(60)
    """)
    parent = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout.readline().strip() == "1"
        children = _children(parent.pid)  # the fork server, and the busy worker it forked
        children += [g for c in children for g in _children(c)]
        assert len(children) >= 2 and all(_alive(pid) for pid in children)
    finally:
        parent.kill()
        parent.wait(timeout=10)
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(_alive(pid) for pid in children)


def test_time_budget_holds_in_a_thread_pool():
    v = MathVerifier({"timeout_s": 0.3, "workers": 2})
    v.warm_up()
    jobs = [(f"\\boxed{{{SLOW_SYMPY}}}", "2"), ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}"), ("\\boxed{x+1}", "1+x"),
            (f"\\boxed{{{SLOW_SYMPY}}}", "3"), ("\\boxed{0.5}", "\\frac12"), ("\\boxed{(1,2]}", "(1,2]")]

    def timed(job):
        t0 = time.monotonic()
        verdict = v.verify(*job)
        return verdict.status, time.monotonic() - t0

    with ThreadPoolExecutor(max_workers=4) as pool:
        got = list(pool.map(timed, jobs))
    # the ordinary checks wait at most for a 0.3 s kill and a fork: they still fit in the 1 s budget
    assert [status for status, _ in got] == [Status.timeout, Status.correct, Status.correct,
                                             Status.timeout, Status.correct, Status.correct]
    assert max(elapsed for _, elapsed in got) <= v.config.budget_s + SLACK_S


CELERY_APP = textwrap.dedent("""
    import os
    from celery import Celery
    from verifiers.math import MathVerifier

    base = os.environ["MATH_CELERY_DIR"]
    app = Celery("mathcheck", broker="filesystem://", backend="file://" + base + "/results")
    app.conf.broker_transport_options = {
        "data_folder_in": base + "/q", "data_folder_out": base + "/q", "processed_folder": base + "/done"}
    app.conf.worker_hijack_root_logger = False
    verifier = MathVerifier({"timeout_s": 0.5})

    from celery.signals import worker_process_init

    @worker_process_init.connect
    def _warm(**_kwargs):  # each prefork child has its own pool: start it before the first task
        verifier.warm_up()

    @app.task
    def check(completion, reference):
        import time
        t0 = time.monotonic()
        verdict = verifier.verify(completion, reference)
        return verdict.status.value, time.monotonic() - t0
""")


def test_time_budget_holds_in_celery_prefork_child(tmp_path):
    for sub in ("q", "done", "results"):
        (tmp_path / sub).mkdir()
    (tmp_path / "mathcheck.py").write_text(CELERY_APP)
    env = dict(os.environ, MATH_CELERY_DIR=str(tmp_path),
               PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT), os.environ.get("PYTHONPATH", "")]))
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "mathcheck", "worker", "-P", "prefork", "-c", "1",
         "--loglevel", "WARNING", "--without-heartbeat", "--without-gossip", "--without-mingle"],
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        sys.path.insert(0, str(tmp_path))
        os.environ["MATH_CELERY_DIR"] = str(tmp_path)
        import mathcheck

        slow = mathcheck.check.delay(f"\\boxed{{{SLOW_SYMPY}}}", "2")
        fine = mathcheck.check.delay("\\boxed{\\frac{\\sqrt{2}}{2}}", "\\frac{1}{\\sqrt{2}}")
        status, seconds = slow.get(timeout=60)
        assert status == "timeout" and seconds <= 1.0 + SLACK_S, (status, seconds)
        assert fine.get(timeout=60)[0] == "correct"
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        try:
            worker.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(timeout=10)
        sys.path.remove(str(tmp_path))
        sys.modules.pop("mathcheck", None)
        os.environ.pop("MATH_CELERY_DIR", None)


def test_a_list_past_the_item_limit_is_refused_on_either_side():
    """The matching is quadratic: a list of more than MAX_ITEMS values is not an answer, gold or prediction,
    whatever the other side is (a short list, a single value)."""
    from verifiers.math.exact import ExactEq
    from verifiers.math.structure import MAX_ITEMS, compare

    small = ("seq", "set", (("num", "1"), ("num", "2")))
    repeats = ("seq", "set", tuple(("num", str(1 + i % 2)) for i in range(MAX_ITEMS + 1)))  # 1, 2, 1, 2, ...
    assert compare(small, ("seq", "set", repeats[2][:MAX_ITEMS]), ExactEq())[0]  # repeated values count once
    assert compare(small, repeats, ExactEq()) == (False, "different answer")
    assert compare(repeats, small, ExactEq()) == (False, "different answer")
