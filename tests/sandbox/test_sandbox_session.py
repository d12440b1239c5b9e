"""A stateful Python session (sandbox/session.py): an episode's tool. State lives across calls, every call is
one ordinary jail run with the session's limits, and nothing of one session reaches another."""
from __future__ import annotations

import pytest

from sandbox import Limits, Status
from sandbox.session import PythonSession, run_sessions


@pytest.fixture
def session(backend):
    return PythonSession(Limits(wall_s=4.0, memory_mb=256), seed=7)


def test_state_lives_across_calls(session):
    assert session.call("x = 12 * 34\ndef f(y):\n    return y + x").ok
    assert session.call("import math").ok
    r = session.call("print(f(1), math.sqrt(16))")
    assert r.ok and r.stdout == b"409 4.0\n"


def test_a_last_expression_echoes_its_value_as_a_notebook_does(session):
    assert session.call("a = [1, 2]\na + [3]").stdout == b"[1, 2, 3]\n"
    assert session.call("None").stdout == b""
    assert session.call("a").stdout == b"[1, 2]\n"  # the echo's state is the cell's state


def test_a_failed_cell_is_not_replayed_and_the_model_sees_its_traceback(session):
    assert session.call("n = 1").ok
    r = session.call("n = 2\nraise ValueError('boom')")
    assert r.status is Status.runtime_error
    err = r.stderr.decode()
    assert "ValueError: boom" in err and "raise ValueError('boom')" in err  # the cell's own line
    assert "json.loads" not in err and "run(req" not in err  # the harness's frames are not shown
    assert session.call("print(n)").stdout == b"1\n"  # the state of the last completed cell


def test_a_cell_that_runs_past_its_limit_is_a_timeout_and_the_session_goes_on(session):
    assert session.call("k = 5").ok
    r = session.call("while True: pass")
    assert r.status is Status.timeout
    assert session.call("print(k)").stdout == b"5\n"


def test_random_repeats_within_a_session_and_differs_between_seeds(backend):
    a, b = PythonSession(seed=1), PythonSession(seed=2)
    for s in (a, b):
        s.call("import random\nfirst = random.random()")
    ra, rb = a.call("print(first)").stdout, b.call("print(first)").stdout
    assert ra == a.call("print(first)").stdout  # the replay draws the same numbers
    assert ra != rb


def test_sessions_do_not_see_each_other(backend):
    one, two = PythonSession(), PythonSession()
    one.call("secret = 42")
    r = two.call("print(secret)")
    assert r.status is Status.runtime_error and b"NameError" in r.stderr


def test_many_sessions_run_at_once_over_the_pool(backend):
    sessions = [PythonSession(seed=i) for i in range(6)]
    out = run_sessions([(s, f"v = {i} * {i}") for i, s in enumerate(sessions)], Limits(wall_s=4.0))
    assert all(r.ok for r in out)
    out = run_sessions([(s, "v") for s in sessions], Limits(wall_s=4.0))
    assert [r.stdout for r in out] == [f"{i * i}\n".encode() for i in range(6)]


def test_a_session_is_as_jailed_as_any_program(session):
    r = session.call("import socket\nsocket.create_connection(('127.0.0.1', 6379), timeout=1)")
    assert r.status is Status.runtime_error
    r = session.call("open('/etc/shadow').read()")
    assert r.status is Status.runtime_error
