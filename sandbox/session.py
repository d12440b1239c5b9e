"""A Python session whose state lives across calls — the tool of a multi-turn episode (trainer/episodes.py).

``PythonSession(limits, seed).call(code) -> Result``: variables, functions and imports a cell defined exist
in every later cell of the session, and a cell that is a bare expression at its end prints its value (as a
notebook does). Each call is ONE ordinary jail run with the session's limits — a warm jail of the pool, the
same isolation as any program — that first re-executes the session's earlier completed cells with their
output discarded, then runs the new one. Why replay instead of a long-lived jailed interpreter: nothing
lives in a jail between calls, so no session can leave a process behind, see another session's state or
hold a jail while the model thinks; the price is that earlier cells run again (their time counts against
the call's limits; the cells of an episode are small) and that the state must be rebuildable: ``random`` is
seeded per session before the replay, so its draws repeat, while time, files written in /tmp (wiped after
every run — but rewritten by the replay) and anything the environment changes between calls may differ.
A cell that failed (raised, timed out, ran out of memory) is not replayed: the next cell starts from the
state of the last completed one.
"""
from __future__ import annotations

import json

from .types import Harness, Limits, Result

MAX_CELLS = 64  # an episode's calls are bounded far below this by its own max_tool_calls

REPL = Harness(source=r'''
import ast, contextlib, io, json, linecache, random, sys, traceback

req = json.loads(sys.stdin.read())
ns = {"__name__": "__main__", "__builtins__": __builtins__}


def run(src, echo):
    tree = ast.parse(src, "<cell>", "exec")
    last = tree.body.pop() if echo and tree.body and isinstance(tree.body[-1], ast.Expr) else None
    exec(compile(tree, "<cell>", "exec"), ns)
    if last is not None:
        value = eval(compile(ast.Expression(last.value), "<cell>", "eval"), ns)
        if value is not None:
            print(repr(value))


random.seed(req["seed"])
for cell in req["replay"]:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            run(cell, True)
        except BaseException:  # it completed before; a cell of its own that now fails is the model's
            pass
linecache.cache["<cell>"] = (len(req["cell"]), None, req["cell"].splitlines(True), "<cell>")  # lines in tracebacks
try:
    run(req["cell"], True)
except SystemExit:
    raise
except BaseException as e:
    tb = traceback.extract_tb(e.__traceback__)
    keep = [f for f in tb if f.filename == "<cell>"]  # the harness's frames are not the model's business
    sys.stderr.write("Traceback (most recent call last):\n" + "".join(traceback.format_list(keep))
                     + "".join(traceback.format_exception_only(type(e), e)))
    sys.stderr.flush()
    sys.exit(1)
''')


class PythonSession:
    """One episode's Python state. Not thread-safe: an episode calls its tool one call at a time."""

    def __init__(self, limits: Limits | None = None, seed: int = 0, backend: str = "local") -> None:
        self.limits, self.seed, self.backend = limits or Limits(wall_s=4.0), seed, backend
        self.cells: list[str] = []

    def request(self, code: str) -> bytes:
        """What :meth:`call` sends the jail (for callers that batch many sessions' calls in one run_many)."""
        return json.dumps({"seed": self.seed, "replay": self.cells, "cell": code}).encode()

    def record(self, code: str, result: Result) -> Result:
        """Keep ``code`` in the session if it completed (the next call replays it)."""
        if result.ok and len(self.cells) < MAX_CELLS:
            self.cells.append(code)
        return result

    def call(self, code: str) -> Result:
        from . import run

        return self.record(code, run(REPL, self.request(code), self.limits, backend=self.backend))


def run_sessions(calls: list[tuple[PythonSession, str]], limits: Limits) -> list[Result]:
    """Many sessions' next cells at once over the pool (one jail run each, the caller's lane and budget)."""
    from . import run_many

    results = run_many([(REPL, s.request(code)) for s, code in calls], limits)
    return [s.record(code, r) for (s, code), r in zip(calls, results)]
