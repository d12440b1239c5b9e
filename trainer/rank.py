"""Entry point of one training rank: ``python -m trainer.rank JOB.json RUN_DIR MODELS_DIR``.

Started by ``torchrun`` (every rank) or by trainer.distributed.group for ranks 1..W-1 of a job whose
spec asks for ``train.world_size: W`` (rank 0 is the worker process that called trainer.loop.train).
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    from .config import JobSpec
    from .loop import train

    spec_file, run_dir, models_dir = argv
    spec = JobSpec.model_validate(json.loads(Path(spec_file).read_text(encoding="utf-8")))
    rank = int(os.environ.get("RANK", "0"))
    train(spec, run_dir, models_dir=models_dir, log=lambda m: print(f"[rank {rank}] {m}", flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
