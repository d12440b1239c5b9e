"""``python -m sandbox run FILE [--timeout S] [--memory MB] [--stdin FILE] [--backend local|docker]``.

Prints the Result as JSON; exits 0 if the program ran (whatever its status), 2 on a sandbox_error.
"""
from __future__ import annotations

import argparse
import json
import sys

from . import BACKENDS, Limits, Status, run


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sandbox", description="Run a Python program in the sandbox.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run FILE and print the Result as JSON")
    r.add_argument("file")
    r.add_argument("--timeout", type=float, default=10.0, help="wall clock seconds (default 10)")
    r.add_argument("--memory", type=int, default=256, help="memory limit in MiB (default 256)")
    r.add_argument("--stdin", help="file to feed as stdin (default: nothing)")
    r.add_argument("--backend", choices=sorted(BACKENDS), default="local")
    a = ap.parse_args(argv)
    with open(a.file, "rb") as f:
        program = f.read()
    stdin = b""
    if a.stdin:
        with open(a.stdin, "rb") as f:
            stdin = f.read()
    res = run(program, stdin, Limits(wall_s=a.timeout, memory_mb=a.memory), backend=a.backend)
    json.dump(res.to_dict(), sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 2 if res.status is Status.sandbox_error else 0


if __name__ == "__main__":
    sys.exit(main())
