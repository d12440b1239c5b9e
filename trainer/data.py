"""Datasets: the built-in arithmetic task, JSONL files, and a resumable prompt stream.

A sample is ``{"id": str, "prompt": str | list[chat message], "reference": Any}``. The train stream
is a pure function of (seed, position): epoch e visits every train sample once in an order drawn
from (seed, e), so a run resumed at position p sees exactly the prompts an uninterrupted run would.
"""
from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path
from typing import Any

Sample = dict[str, Any]

ARITH_MAX = 50  # operands in [0, ARITH_MAX]; + and - (non-negative results)
_SPLIT_SEED = 1234  # + data.seed: the held-out split must not move when a job changes its train.seed


class DatasetError(ValueError):
    """A dataset file is missing or malformed (message names the file and line)."""


def arithmetic_problems() -> list[Sample]:
    out = []
    for a in range(ARITH_MAX + 1):
        for b in range(ARITH_MAX + 1):
            out.append({"id": f"{a}+{b}", "prompt": f"{a}+{b}", "reference": str(a + b)})
            if a >= b:
                out.append({"id": f"{a}-{b}", "prompt": f"{a}-{b}", "reference": str(a - b)})
    return out


def arithmetic_split(eval_size: int, seed: int = 0) -> tuple[list[Sample], list[Sample]]:
    """(train, held-out): a fixed shuffle (``seed`` = the job's ``data.seed`` picks another), the first
    ``eval_pool`` problems are never trained on."""
    probs = arithmetic_problems()
    random.Random(_SPLIT_SEED + seed).shuffle(probs)
    eval_pool = max(eval_size, len(probs) // 10)
    return probs[eval_pool:], probs[:eval_size]


def load_jsonl(path: str | Path, validate=None, kind: str = "dataset") -> list[Sample]:
    """Rows of a JSONL file, each checked by ``validate(row, "file:line")`` (default: a sample)."""
    validate = validate or validate_row
    p = Path(path)
    if not p.is_file():
        raise DatasetError(f"{kind} file not found: {p}")
    rows: list[Sample] = []
    with p.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DatasetError(f"{p}:{lineno}: invalid JSON ({e.msg})") from None
            rows.append(validate(row, f"{p}:{lineno}"))
    if not rows:
        raise DatasetError(f"{p}: no rows")
    return rows


def validate_pair(row: Any, where: str) -> dict[str, Any]:
    """One preference pair: a sample's prompt plus string ``chosen`` and ``rejected`` completions.
    The same check runs on upload (service/jobs/files.py) and when a DPO job loads the file."""
    if not isinstance(row, dict):
        raise DatasetError(f"{where}: expected a JSON object")
    base = validate_row({**row, "reference": None}, where)
    if not all(isinstance(row.get(k), str) for k in ("chosen", "rejected")):
        raise DatasetError(f"{where}: 'chosen' and 'rejected' must be strings "
                           "(preference pairs hold prompt, chosen, rejected)")
    return {**base, "chosen": row["chosen"], "rejected": row["rejected"]}


def validate_row(row: Any, where: str) -> Sample:
    """One sample. OpenAI RFT lines work too: ``messages`` is the prompt (assistant turns dropped)
    and, without a ``reference``, the other fields of the line are the reference item."""
    if not isinstance(row, dict):
        raise DatasetError(f"{where}: expected a JSON object")
    prompt = row.get("prompt")
    if prompt is None and isinstance(row.get("messages"), list):
        prompt = [m for m in row["messages"] if not (isinstance(m, dict) and m.get("role") == "assistant")]
    if isinstance(prompt, list):
        ok = all(isinstance(m, dict) and isinstance(m.get("content"), str) and m.get("role") for m in prompt)
        if not ok or not prompt:
            raise DatasetError(f"{where}: 'prompt' messages need 'role' and string 'content'")
    elif not isinstance(prompt, str) or not prompt:
        raise DatasetError(f"{where}: 'prompt' must be a non-empty string or a list of messages")
    if "reference" in row or "answer" in row:
        ref = row.get("reference", row.get("answer"))
    elif "messages" in row and "prompt" not in row:
        ref = {k: v for k, v in row.items() if k != "messages"}
    else:
        raise DatasetError(f"{where}: missing 'reference'")
    sid = str(row.get("id") or hashlib.sha1(json.dumps(prompt).encode()).hexdigest()[:12])
    return {"id": sid, "prompt": prompt, "reference": ref}


def _stable_key(sample: Sample) -> str:
    return hashlib.sha1(json.dumps(sample["prompt"], sort_keys=True).encode()).hexdigest()


class PromptStream:
    """Deterministic, resumable order over the train samples."""

    def __init__(self, samples: list[Sample], seed: int, position: int = 0):
        self.samples = samples
        self.seed = seed
        self.position = position
        self._epoch_cache: tuple[int, list[int]] | None = None

    def _order(self, epoch: int) -> list[int]:
        if self._epoch_cache is None or self._epoch_cache[0] != epoch:
            idx = list(range(len(self.samples)))
            random.Random(f"{self.seed}:{epoch}").shuffle(idx)
            self._epoch_cache = (epoch, idx)
        return self._epoch_cache[1]

    def next_batch(self, n: int) -> list[Sample]:
        out = []
        for _ in range(n):
            epoch, i = divmod(self.position, len(self.samples))
            out.append(self.samples[self._order(epoch)[i]])
            self.position += 1
        return out
