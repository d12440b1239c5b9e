"""Entry-point plugins: the example package really installed (pip, into a temp target), then discovered.

Discovery runs in a fresh interpreter with the target on PYTHONPATH, so the registry starts empty of
plugins and this process's registry is never touched.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "rlvr-plugin-example"


def pip_install(target: Path, package: Path) -> None:
    # --no-build-isolation: build with the venv's setuptools, no index needed; --no-deps: rlvr is the host.
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                        "--no-index", "--target", str(target), str(package)],
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]


def in_fresh_python(code: str, *targets: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*map(str, targets), str(REPO)])}
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                       timeout=120, env=env, cwd=REPO)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    target = tmp_path_factory.mktemp("site")
    src = tmp_path_factory.mktemp("src") / EXAMPLE.name  # a copy: setuptools leaves build/ where it builds
    shutil.copytree(EXAMPLE, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    pip_install(target, src)
    assert list(target.glob("rlvr_plugin_example-0.1.0.dist-info/entry_points.txt"))
    return target


def test_example_plugin_is_discovered_and_scores(installed):
    out = in_fresh_python("""
        import json
        from verifiers import available, get_verifier
        from verifiers.registry import describe
        v = get_verifier("keywords", {"all_required": False})
        d = describe("keywords")
        score = v.verify("Paris is in France.", ["paris", "france", "rome"]).score
        print(json.dumps({"available": available(), "score": score,
                          "cls": type(v).__module__, "version": d["version"], "origin": d["origin"],
                          "schema": sorted(d["config_schema"]["properties"])}))
    """, installed)
    assert "keywords" in out["available"]
    assert out["cls"] == "rlvr_plugin_example"
    assert out["score"] == pytest.approx(2 / 3)
    assert out["version"] == "0.1.0"
    assert "rlvr-plugin-example" in out["origin"]
    assert out["schema"] == ["all_required", "ignore_case"]


def test_plugin_listed_by_the_api(installed, tmp_path):
    out = in_fresh_python(f"""
        import json
        from fastapi.testclient import TestClient
        from service.app import create_app
        from service.settings import Settings
        from service.store.jobs import Store
        s = Settings(home={str(tmp_path / 'home')!r})
        with TestClient(create_app(s, Store(s.db_url), reaper=False)) as c:
            listing = c.get("/v1/verifiers").json()
            run = c.post("/v1/verifiers/keywords/run",
                         json={{"items": [{{"completion": "a b", "reference": ["a", "b"]}}]}}).json()
        print(json.dumps({{"listing": listing, "run": run}}))
    """, installed)
    entry = next(d for d in out["listing"]["data"] if d["name"] == "keywords")
    assert entry["kind"] == "plugin" and entry["version"] == "0.1.0" and entry["description"]
    assert out["run"]["results"][0]["score"] == 1.0 and out["run"]["results"][0]["status"] == "correct"


def test_duplicate_plugin_name_is_refused_and_keeps_the_first(installed, tmp_path):
    """A second installed package claiming `math` and `keywords` gets neither; the others still load."""
    pkg = tmp_path / "evil"
    (pkg / "rlvr_evil_plugin").mkdir(parents=True)
    (pkg / "rlvr_evil_plugin" / "__init__.py").write_text(
        "from verifiers import BaseVerifier, Status, Verdict\n"
        "class Always(BaseVerifier):\n"
        "    name, version, description = 'always', '1', 'always 1'\n"
        "    def verify(self, completion, reference):\n"
        "        return Verdict(1.0, Status.correct, 'hijacked')\n")
    (pkg / "pyproject.toml").write_text(textwrap.dedent("""
        [build-system]
        requires = ["setuptools>=61"]
        build-backend = "setuptools.build_meta"
        [project]
        name = "rlvr-evil-plugin"
        version = "1.0"
        [project.entry-points."rlvr.verifiers"]
        math = "rlvr_evil_plugin:Always"
        keywords = "rlvr_evil_plugin:Always"
        always = "rlvr_evil_plugin:Always"
        [tool.setuptools]
        packages = ["rlvr_evil_plugin"]
    """))
    later = tmp_path / "site2"  # after the example on sys.path: discovery meets the example first
    pip_install(later, pkg)
    out = in_fresh_python("""
        import json
        from verifiers import available, get_verifier
        from verifiers.registry import refused, register, DuplicateVerifierError
        try:
            register("format", "x:y")
            direct = "accepted"
        except DuplicateVerifierError as e:
            direct = str(e)
        print(json.dumps({"math": type(get_verifier("math")).__module__,
                          "keywords": type(get_verifier("keywords")).__module__,
                          "always": "always" in available(), "refused": refused(), "direct": direct}))
    """, installed, later)
    assert out["math"].startswith("verifiers.math")
    assert out["keywords"] == "rlvr_plugin_example"
    assert out["always"] is True
    assert {r["name"] for r in out["refused"]} == {"math", "keywords"}
    assert all("already registered" in r["reason"] for r in out["refused"])
    assert "already registered" in out["direct"] and "Known:" in out["direct"]
