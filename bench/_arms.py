"""Paired differences between arms of bench/learning.py runs (one JSON per arm and seed, ``--algo`` arms).

    .venv/bin/python bench/_arms.py grpo=bench/results/losses-smollm2-grpo{,-seed1,-seed2}.json \\
        cispo=bench/results/losses-smollm2-cispo{,-seed1,-seed2}.json ...

The first arm is the baseline. Per mark: each seed's strict held-out accuracy, the mean, and each other arm's
difference to the baseline with its s.e. (trainer.stats.seeds_diff: the seeds' scatter plus the problems'
paired noise; every run scored on the same held-out problems). Task: the first in each JSON (``--task``).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from trainer.stats import seeds_diff  # noqa: E402


def runs(paths: list[str], task: str | None) -> list[dict]:
    out = []
    for p in paths:
        d = json.loads(Path(p).read_text())
        t = task or next(k for k in d if not k.startswith("_"))
        out += d[t]["runs"]["ours"]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("arms", nargs="+", metavar="NAME=JSON[,JSON...]")
    ap.add_argument("--task", default=None)
    a = ap.parse_args()
    arms: dict[str, list[str]] = {}
    for spec in a.arms:
        name, _, files = spec.partition("=")
        arms.setdefault(name, []).extend(f for f in files.split(",") if f)
    table = {name: runs(files, a.task) for name, files in arms.items()}
    base_name, base = next(iter(table.items()))
    marks = [k for k in base[0]["evals"] if k.startswith("t")]
    for name, rs in table.items():
        print(f"{name}: seeds {[r['seed'] for r in rs]} steps {[r['steps'] for r in rs]}")
        for k in marks:
            accs = [r["evals"][k]["strict"] for r in rs]
            line = f"  {k}: {' / '.join(f'{x:.3f}' for x in accs)} mean {statistics.mean(accs):.3f}"
            if name != base_name:
                d = seeds_diff([[c == "1" for c in r["evals"][k]["outcomes"]] for r in rs],
                               [[c == "1" for c in r["evals"][k]["outcomes"]] for r in base])
                line += f"  {name} - {base_name} {d['diff']:+.3f} +- {d['se']:.3f}"
            print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
