"""A caller's budget of jail-seconds (``sandbox.budget``) holds however its runs are started, and a
``sandbox.Harness`` runs exactly as its text would."""
from __future__ import annotations

import threading
import time

import sandbox
from sandbox import Harness, Limits, Status


def test_runs_in_a_budget_never_spend_more_than_it(backend):
    sleepy = "import time\ntime.sleep(0.6)\nprint('done')"
    with sandbox.budget(2.0) as b:
        t0 = time.monotonic()
        res = sandbox.run_many([sleepy] * 8, Limits(wall_s=5.0))
        took = time.monotonic() - t0
    ran = [r for r in res if r.status is Status.ok]
    cut = [r for r in res if r.status is Status.timeout]
    assert len(ran) + len(cut) == 8 and 1 <= len(ran) <= 3, res
    assert sum(r.wall_s for r in res) <= 2.0 + 0.1, [r.wall_s for r in res]  # what was actually spent
    assert any("budget" in r.reason for r in cut) and b.spent <= 2.0 + 0.1
    assert took < 8 * 0.6  # refused runs never started


def test_unused_time_is_given_back(backend):
    with sandbox.budget(1.0) as b:  # ten runs whose limits add up to 50 s fit, since each uses a few ms
        res = [sandbox.run("print(1)", limits=Limits(wall_s=5.0)) for _ in range(10)]
    assert all(r.status is Status.ok for r in res), res
    assert 0 < b.spent < 1.0


def test_a_run_is_cut_to_what_is_left(backend):
    with sandbox.budget(0.8):
        first = sandbox.run("import time\ntime.sleep(0.3)", limits=Limits(wall_s=5.0))
        second = sandbox.run("import time\ntime.sleep(5)", limits=Limits(wall_s=5.0))
    assert first.status is Status.ok
    assert second.status is Status.timeout and second.wall_s < 1.0, second


def test_concurrent_runs_share_one_budget(backend):
    results = []
    with sandbox.budget(1.5):
        def one():
            results.append(sandbox.run("import time\ntime.sleep(1.0)", limits=Limits(wall_s=3.0)))

        import contextvars
        threads = [threading.Thread(target=contextvars.copy_context().run, args=(one,)) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    assert sum(r.wall_s for r in results) <= 1.5 + 0.1, [(r.status, r.wall_s) for r in results]


def test_no_budget_means_the_runs_own_limits(backend):
    assert sandbox.run("import time\ntime.sleep(0.2)", limits=Limits(wall_s=2.0)).status is Status.ok


def test_a_harness_runs_as_its_text(backend):
    src = "import sys\ndata = sys.stdin.read()\nprint(data[::-1])\nprint(__name__)\n"
    as_text = sandbox.run(src, "abc")
    as_harness = sandbox.run(Harness(src), "abc")
    assert as_text.stdout == as_harness.stdout == b"cba\n__main__\n"
    import os
    import sys

    from sandbox.local import _compiled, jail_python
    same = jail_python().executable == os.path.realpath(sys.executable)
    assert (_compiled(src) is not None) == same  # sent compiled exactly when the jail runs our interpreter
    broken = sandbox.run(Harness("def f(:\n"))
    assert broken.status is Status.runtime_error and b"SyntaxError" in broken.stderr
    raised = sandbox.run(Harness("raise KeyError('x')"))
    assert raised.status is Status.runtime_error and b"KeyError" in raised.stderr
