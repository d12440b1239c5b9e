"""Public tests for HumanEval, so its problems can be played as code repair (``builtin:humaneval_repair``).

HumanEval has one test per problem (``check``), which must stay hidden: it judges the final answer. What a
repair episode may show the model is what the problem statement already shows — the examples in the
function's docstring (``>>> f(1, 2)`` then ``3``; ``f(1, 2) ➞ 3``; ``f(1, 2) == 3``; ``f(1, 2) should return
3``). For the few problems whose docstring states no example this way, the first assertion of ``check`` that
calls the candidate on literal arguments is the public test (the "visible test" of the repair literature);
the rest of ``check`` stays hidden. A problem with neither has no public test and is left out.

Everything here is parsed, never run: the problem texts are data (``ast.parse`` / ``ast.literal_eval`` on
bounded strings). The check this builds runs in the jail, like any reference test.
"""
from __future__ import annotations

import ast
import re

# Problems whose docstring examples contradict HumanEval's own canonical solution and check (known errata: 47's
# median example, 116's sort example, 130's recurrence read as a call): their public test comes from the check
# instead. tests/test_humaneval_repair.py runs every canonical solution against every public test in the jail,
# so a stale entry or a new contradiction fails there.
ERRATA = frozenset({"HumanEval/47", "HumanEval/116", "HumanEval/130"})
MAX_EXPR = 2000  # characters of one example's call or value (HumanEval's longest is ~200)
SEP = r"(?:==|➞|=>|->|→|should return|should be|returns?|is|=)"


def _literal(src: str) -> bool:
    if len(src) > MAX_EXPR:
        return False
    try:
        ast.literal_eval(src)
        return True
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False


def _call_on_literals(src: str, name: str) -> bool:
    """``src`` is ``name(<literals>)``: a call whose result the example states."""
    if len(src) > MAX_EXPR:
        return False
    try:
        node = ast.parse(src, mode="eval").body
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return False
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == name
            and not node.keywords and all(_literal(ast.unparse(a)) for a in node.args))


def docstring(prompt: str, entry_point: str) -> str:
    try:
        tree = ast.parse(prompt)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return ""
    fn = next((n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == entry_point), None)
    return (ast.get_docstring(fn) or "") if fn else ""


def docstring_examples(prompt: str, entry_point: str) -> list[tuple[str, str]]:
    """(call, expected value) pairs the docstring states, each a call on literals and a literal."""
    lines, out = docstring(prompt, entry_point).splitlines(), []
    arrow = re.compile(rf"^(?:>>>\s*)?(?P<call>{re.escape(entry_point)}\(.*\))\s*{SEP}\s*(?P<want>.+?)\s*\.?$")
    for i, line in enumerate(lines):
        s = line.strip()
        if s.startswith(">>>"):
            call = s[3:].strip()
            want = next((x.strip() for x in lines[i + 1:] if x.strip()), "")
            if _call_on_literals(call, entry_point) and _literal(want):
                out.append((call, want))
                continue
        m = arrow.match(s)
        if m and _call_on_literals(m["call"], entry_point) and _literal(m["want"]):
            out.append((m["call"], m["want"]))
    return list(dict.fromkeys(out))  # an example stated twice is one test


def first_check_case(test: str, entry_point: str) -> list[tuple[str, str]]:
    """The first ``assert candidate(<literals>) == <literal>`` of HumanEval's check, as (call, expected)."""
    try:
        tree = ast.parse(test)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Assert):
            continue
        t = node.test
        if (isinstance(t, ast.Compare) and len(t.ops) == 1 and isinstance(t.ops[0], ast.Eq)
                and isinstance(t.left, ast.Call) and isinstance(t.left.func, ast.Name)
                and t.left.func.id == "candidate"):
            call = entry_point + ast.unparse(t.left)[len("candidate"):]
            want = ast.unparse(t.comparators[0])
            if _call_on_literals(call, entry_point) and _literal(want):
                return [(call, want)]
    return []


def public_check(cases: list[tuple[str, str]], entry_point: str) -> str:
    """A ``check(candidate)`` over the cases whose assertion messages say the call, what came back and what
    was expected (what the repair episode shows on failure)."""
    lines = []
    for call, want in cases:
        args = call[len(entry_point):]
        lines.append(f"    got = candidate{args}\n"
                     f"    assert got == {want}, {call!r} + ' returned ' + repr(got) + ', expected ' + {want!r}\n")
    return "def check(candidate):\n" + "".join(lines)


def public_tests(problem: dict) -> tuple[str, str] | None:
    """(check source, where its cases came from: "docstring" or "check") for one HumanEval problem, or None."""
    ep = problem["entry_point"]
    stated = [] if problem.get("task_id") in ERRATA else docstring_examples(problem["prompt"], ep)
    for source, cases in (("docstring", stated),
                          ("check", first_check_case(problem["test"], ep))):
        if cases:
            return public_check(cases, ep), source
    return None
