"""A deterministic stand-in for a rollout engine, for tests that compare runs sample-for-sample.

Completion j of prompt "a+b" is `\\boxed{a+b}` (right) or a wrong number, decided by a hash of
(prompt, j) alone — so a prompt's group is the same whichever process or batch samples it, which
is what a data-parallel vs single-process comparison needs. Token layout comes from
trainer.batch.encode (the trainer's own layout for fixed completions).

Run as a module it is one rank of a training job, or of several in turn: ``python -m tests.scripted_engine SPEC
RUN [SPEC RUN ...] MODELS`` (under torchrun), with this engine installed in place of the HF one.
"""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path


class ScriptedEngine:
    def __init__(self, model, tokenizer):
        self.tok = tokenizer

    def generate(self, prompts, n, params):
        from trainer.batch import encode

        texts, flat = [], []
        for p in prompts:
            a, op, b = _split(p)
            truth = a + b if op == "+" else a - b
            for j in range(n):
                h = int(hashlib.sha1(f"{p}|{j}".encode()).hexdigest(), 16)
                answer = truth if h % 3 == 0 else truth + 1 + h % 7
                texts.append(f"\\boxed{{{answer}}}" + " " * (h % 3))  # varied lengths: padding differs
                flat.append(p)
        return encode(self.tok, flat, texts)


def _split(p: str) -> tuple[int, str, int]:
    op = "+" if "+" in p else "-"
    a, b = p.split(op)
    return int(a), op, int(b)


class SkewedEngine(ScriptedEngine):
    """Rank 0's groups all right (zero variance: resampled under ``zero_variance: resample``), rank 1's
    half right: ranks that resample and ranks that do not (tests/test_distributed.py)."""

    def generate(self, prompts, n, params):
        import torch

        from trainer.batch import encode

        rank0 = torch.distributed.is_initialized() and torch.distributed.get_rank() == 0
        rows = [p for p in prompts for _ in range(n)]
        right = [rank0 or j % 2 == 0 for _ in prompts for j in range(n)]
        texts = [f"\\boxed{{{_truth(p) + (0 if ok else 1)}}}" for p, ok in zip(rows, right)]
        return encode(self.tok, rows, texts)


def _truth(p: str) -> int:
    a, op, b = _split(p)
    return a + b if op == "+" else a - b


def install() -> None:
    import os

    from trainer import engines

    engines.ENGINES["hf"] = SkewedEngine if os.environ.get("RLVR_TEST_ENGINE") == "skewed" else ScriptedEngine


def train_each(runs: list[tuple[str, str]], models_dir: str) -> None:
    """Each (SPEC, RUN) in turn in this process: one interpreter start for several runs (tests/test_distributed.py
    launches each layout's runs at once). Under torchrun each run's group meets at a store of its own: the
    agent's store keeps a destroyed group's keys, and the next default group, named alike, would read its
    peers' old addresses (a rank that came late found its peer's last port closed)."""
    import os
    import socket
    import time
    from datetime import timedelta

    import torch.distributed

    from trainer.config import JobSpec
    from trainer.loop import train

    agent = None
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        agent = torch.distributed.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                                           is_master=False, timeout=timedelta(seconds=120))
    late = os.environ.get("RLVR_TEST_LATE_RANK")  # this rank starts each run after the first 6 s late
    for i, (spec_file, run_dir) in enumerate(runs):
        if i and late == os.environ.get("RANK", "0"):
            time.sleep(6)
        if agent is not None:
            if os.environ["RANK"] == "0":
                with socket.socket() as s:
                    s.bind(("127.0.0.1", 0))
                    agent.set(f"scripted-run-{i}-port", str(s.getsockname()[1]))
            os.environ["MASTER_PORT"] = agent.get(f"scripted-run-{i}-port").decode()
            os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "False"  # rank 0 serves this run's store
        spec = JobSpec.model_validate(json.loads(Path(spec_file).read_text()))
        train(spec, run_dir, models_dir=models_dir, log=lambda m: None)


if __name__ == "__main__":
    install()
    from tests import exact

    exact.install()  # float64 specs stay float64 through RMSNorm and RoPE (tests/exact.py)
    *args, models = sys.argv[1:]  # SPEC RUN [SPEC RUN ...] MODELS
    train_each(list(zip(args[::2], args[1::2], strict=True)), models)


class ShiftedEngine(ScriptedEngine):
    """Scripted completions whose reported (behaviour) log-probs are the sampling model's own plus
    ``SHIFT``: importance weights against them have a known value (tests/test_async.py)."""

    def __init__(self, model, tokenizer):
        super().__init__(model, tokenizer)
        self.model = model

    def generate(self, prompts, n, params):
        import torch

        from trainer.batch import forward

        ro = super().generate(prompts, n, params)
        with torch.no_grad():
            ro.logprobs = (forward(self.model, ro, params.temperature).logp + shift()) * ro.completion_mask
        return ro


def shift() -> float:
    import os

    return float(os.environ.get("RLVR_TEST_LOGP_SHIFT", "0"))


def install_shifted() -> None:
    from trainer import engines

    engines.ENGINES["hf"] = ShiftedEngine


def install_exact() -> None:
    """What ``python -m tests.scripted_engine`` installs, for ranks started elsewhere (Ray actors: a prelude)."""
    install()
    from tests import exact

    exact.install()


def install_exact_slow() -> None:
    """``install_exact``, each generation half a second slower: a job that a stop request must reach before it
    ends (tests/test_ray.py's pause; at full speed its last 11 steps took less than the stop's ~1-2 s path)."""
    install_exact()
    from trainer import engines

    base = engines.ENGINES["hf"]

    class SlowEngine(base):
        def generate(self, prompts, n, params):
            import time

            time.sleep(0.5)
            return super().generate(prompts, n, params)

    engines.ENGINES["hf"] = SlowEngine


class HangingEngine(ScriptedEngine):
    """Scripted completions until call ``RLVR_TEST_HANG_AFTER`` on rank ``RLVR_TEST_HANG_RANK``, which never
    returns: a hung generation (tests/test_ray.py stops such a group)."""

    calls = 0

    def generate(self, prompts, n, params):
        import os
        import time

        HangingEngine.calls += 1
        if (os.environ.get("RANK", "0") == os.environ.get("RLVR_TEST_HANG_RANK", "1")
                and HangingEngine.calls > int(os.environ.get("RLVR_TEST_HANG_AFTER", "2"))):
            while True:
                time.sleep(1)
        return super().generate(prompts, n, params)


def install_hanging() -> None:
    from trainer import engines

    engines.ENGINES["hf"] = HangingEngine
