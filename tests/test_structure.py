"""The code's shape holds: imports follow the data (service → trainer → verifiers → sandbox, never back),
no import circles inside a package, and the long-lived loop files keep their functions short.

Every import counts, lazy ones inside functions and TYPE_CHECKING ones included: a circle hidden in a
function body is still a circle a reader has to hold in their head.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import REPO

PACKAGES = ["service", "trainer", "verifiers", "sandbox"]
LAYER = {p: i for i, p in enumerate(PACKAGES)}  # a package may import only packages after it


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for f in (REPO / pkg).rglob("*.py"):
            if "migrations" in f.parts:
                continue
            parts = list(f.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = f
    return out


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Our modules that ``name`` imports (absolute and relative, at any depth of the file)."""
    is_pkg = path.name == "__init__.py"
    base = name.split(".") if is_pkg else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                root = base[: len(base) - node.level + 1]
                mod = ".".join(root + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            subs = [f"{mod}.{a.name}" for a in node.names]
            # `from . import x` names the submodule x; the package itself only for names that are not modules
            targets = subs + ([mod] if any(t not in known for t in subs) else [])
        else:
            continue
        for t in targets:
            while t and t not in known:  # `from .x import name` -> the module x
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {m: _imports(m, p, set(mods)) for m, p in mods.items()}


def test_imports_follow_the_data():
    bad = [(m, t) for m, deps in _graph().items() for t in deps
           if LAYER[t.split(".")[0]] < LAYER[m.split(".")[0]]]
    assert bad == [], f"imports against the flow service → trainer → verifiers → sandbox: {bad}"


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_circles(package):
    g = {m: {t for t in deps if t.split(".")[0] == package and t != package}
         for m, deps in _graph().items() if m.split(".")[0] == package}
    cycles, state = [], {}

    def visit(m, stack):
        state[m] = 1
        stack.append(m)
        for t in sorted(g.get(m, ())):
            if t == package:
                continue
            if state.get(t) == 1:
                cycles.append(stack[stack.index(t):] + [t])
            elif t not in state:
                visit(t, stack)
        stack.pop()
        state[m] = 2

    for m in sorted(g):
        if m not in state:
            visit(m, [])
    assert cycles == [], f"import circles: {cycles}"


@pytest.mark.parametrize("path", ["trainer/loop.py", "trainer/online.py", "service/runner.py"])
def test_loop_functions_stay_short(path):
    tree = ast.parse((REPO / path).read_text())
    long = [(n.name, n.end_lineno - n.lineno + 1) for n in ast.walk(tree)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > 60]
    assert long == [], f"functions over 60 lines in {path}: {long}"
