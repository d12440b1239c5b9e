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


@pytest.mark.parametrize("path", ["trainer/loop.py", "trainer/online.py", "service/jobs/runner.py"])
def test_loop_functions_stay_short(path):
    tree = ast.parse((REPO / path).read_text())
    long = [(n.name, n.end_lineno - n.lineno + 1) for n in ast.walk(tree)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > 60]
    assert long == [], f"functions over 60 lines in {path}: {long}"


# Inside service/: the request path is http → access → a front door → jobs / tinker → store, worker.
FRONT_DOORS = ("service.api", "service.openai_compat", "service.tinker")
INNER = ("service.http", "service.access", "service.store", "service.jobs", "service.worker")
OUTER = ("service.app", "service.cli")  # build the app / the command: nothing below imports them


def _under(mod: str, prefixes) -> bool:
    prefixes = (prefixes,) if isinstance(prefixes, str) else prefixes
    return any(mod == p or mod.startswith(p + ".") for p in prefixes)


def _routers(g) -> set[str]:
    """A router is a module that defines an HTTP ``router``: each resource of /v1, and each other door's routes."""
    return {m for m in g if _under(m, FRONT_DOORS) and "router = " in (REPO / _modules()[m].relative_to(REPO))
            .read_text()}


def test_routers_are_the_front_doors_modules_we_expect():
    assert _routers(_graph()) == {
        *(f"service.api.{r}"
          for r in ("dashboard", "datasets", "evals", "files", "health", "jobs", "keys", "models", "prom",
                                        "sessions", "verifiers")),
        "service.openai_compat.routes", "service.tinker.routes"}


def test_no_router_imports_another_router():
    g = _graph()
    routers = _routers(g)
    bad = [(m, t) for m in routers for t in g[m] if t in routers]
    assert bad == [], f"a router imports another router (share through service.jobs instead): {bad}"


def test_the_store_imports_nothing_of_the_service_but_settings():
    """The store is the service's bottom layer (the packages below the service, trainer's constants, it may use)."""
    g = _graph()
    bad = [(m, t) for m, deps in g.items() if _under(m, "service.store") for t in deps
           if _under(t, "service") and not _under(t, ("service.store", "service.settings"))]
    assert bad == [], f"service.store is the bottom layer: {bad}"


def test_inner_layers_never_import_a_router_the_app_or_the_cli():
    g = _graph()
    routers = _routers(g)
    bad = [(m, t) for m, deps in g.items() if _under(m, INNER) or _under(m, FRONT_DOORS)
           for t in deps if _under(t, OUTER) or (t in routers and not _under(m, FRONT_DOORS))]
    assert bad == [], f"imports against http → access → front door → jobs/tinker → store, worker: {bad}"


def test_front_doors_import_only_the_layers_below_them():
    """A door imports jobs, store, access, http, worker, the Tinker sessions behind door 3 (/v1/sessions shows
    them too), its own modules, and OpenAI's error shape (/v1/files and /v1/models answer OpenAI clients)."""
    g = _graph()
    routers = _routers(g)
    allowed = (*INNER, "service.settings", "service.deps", "service.openai_compat.errors")
    bad = [(m, t) for m, deps in g.items() if _under(m, FRONT_DOORS) for t in deps
           if _under(t, "service") and t != "service" and not _under(t, allowed)
           and not (_under(t, "service.tinker") and t not in routers)
           and t.split(".")[:2] != m.split(".")[:2]]  # its own door's modules
    assert bad == [], f"a front door imports another door or the app: {bad}"


def test_the_worker_never_imports_a_front_door():
    g = _graph()
    routers = _routers(g)
    bad = [(m, t) for m, deps in g.items() if _under(m, "service.worker") for t in deps
           if t in routers or _under(t, OUTER)]
    assert bad == [], f"service.worker imports a front door: {bad}"


def _readme_tree() -> set[str]:
    """The paths the README's architecture tree names (one line per module, nested with ├── / └──)."""
    text = (REPO / "README.md").read_text()
    block = text[text.index("## Architecture"):]
    block = block[block.index("```\nservice/"):]
    block = block[4: block.index("```", 4)]
    paths, stack = set(), []
    for line in block.splitlines():
        marks = [i for i in (line.find("├── "), line.find("└── ")) if i >= 0]
        depth = (marks[0] // 4 + 1) if marks else 0
        name = (line[marks[0] + 4:] if marks else line).split()[0]
        stack[depth:] = [name.rstrip("/")]
        paths.add("/".join(stack))
    return paths


def test_the_readme_tree_names_every_module_and_nothing_else():
    tree = _readme_tree()
    modules = {str(f.relative_to(REPO)) for pkg in PACKAGES for f in (REPO / pkg).rglob("*.py")
               if f.name != "__init__.py" and "migrations" not in f.parts}
    assert sorted(modules - tree) == [], "modules missing from README's Architecture tree"
    stale = sorted(p for p in tree if p.endswith(".py") and p not in modules)
    assert stale == [], "README's Architecture tree names modules that do not exist"
