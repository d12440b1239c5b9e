"""Do a constraints file's exact pins resolve, and pin the whole install? (`make check-gpu-pins`)

    python -m tests.pins constraints-gpu.txt postgres,monitoring,vllm

Asks pip to resolve ``torch==<pin>`` plus the project with those extras under the file (``--dry-run``,
nothing installed; ``fast-deps`` reads each wheel's metadata with HTTP range requests instead of
downloading vLLM's and CUDA's wheels, several GB), then compares the install pip reports with the pins:
every package it would install must be pinned at that version, and every pin must be in it. Exits
non-zero saying which, so a pin file that no longer resolves, or drifted, fails CI, not a GPU host's
image build. Needs PyPI; about a minute.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, sep, ver = line.partition("==")
            if not sep:
                raise SystemExit(f"{path.name}: not an exact pin: {line!r}")
            out[canon(name)] = ver
    return out


def resolve(path: Path, extras: str) -> dict[str, str]:
    want = pins(path)
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
               "--use-feature=fast-deps", "--report", str(report), "-c", str(path),
               f"torch=={want['torch']}", f".[{extras}]"]
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1800)
        if proc.returncode != 0:
            why = "\n".join(x for x in proc.stderr.splitlines() if not x.startswith("WARNING: Location"))
            raise SystemExit(f"{path.name} does not resolve:\n{why[-4000:]}")
        installed = json.loads(report.read_text())["install"]
    return {canon(i["metadata"]["name"]): i["metadata"]["version"] for i in installed
            if canon(i["metadata"]["name"]) != "rlvr"}


def main(path: str, extras: str) -> int:
    file = REPO / path
    want, got = pins(file), resolve(file, extras)
    unpinned = sorted(f"{n}=={v}" for n, v in got.items() if n not in want)
    moved = sorted(f"{n}: pinned {want[n]}, resolved {v}" for n, v in got.items() if n in want and want[n] != v)
    stale = sorted(n for n in want if n not in got)
    for what, items in (("not pinned", unpinned), ("resolved otherwise", moved), ("pinned but not installed", stale)):
        if items:
            print(f"{path}: {what}: {', '.join(items)}", file=sys.stderr)
    if unpinned or moved or stale:
        return 1
    print(f"{path}: {len(got)} packages resolve at their pins (torch {want['torch']}, extras {extras})")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
