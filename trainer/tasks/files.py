"""Dataset files: JSONL through our own line-checked reader, parquet / arrow / CSV through Hugging Face
``datasets`` (``load_dataset(format, data_files=...)``, streamed: a file larger than memory is read row by
row and only ``data.train_size`` + ``data.eval_size`` rows are kept), with ``data.fields`` naming the
columns. Every row goes through the same check (trainer.data.validate_row) as an uploaded file.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Iterator

from ..data import DatasetError, Sample, load_jsonl, validate_row

FORMATS = {".parquet": "parquet", ".arrow": "arrow", ".csv": "csv", ".tsv": "csv"}
HELD_OUT_PER_MILLE = 100  # streamed files: rows whose prompt hashes below this (of 1000) are held out
DEFAULT_TRAIN_ROWS = 100_000


def streamed(ref: str) -> bool:
    return Path(ref).suffix.lower() in FORMATS


def _mapped(row: dict, fields) -> dict:
    """A row with the configured columns renamed to prompt / reference / id."""
    if fields.prompt not in row:
        raise DatasetError(f"no column {fields.prompt!r} (data.fields.prompt); columns: {', '.join(map(str, row))}")
    refs = [fields.reference] if isinstance(fields.reference, str) else list(fields.reference)
    missing = [c for c in refs if c not in row]
    if missing:
        raise DatasetError(f"no column {missing[0]!r} (data.fields.reference); columns: {', '.join(map(str, row))}")
    out = {"prompt": row[fields.prompt],
           "reference": row[refs[0]] if isinstance(fields.reference, str) else {c: row[c] for c in refs}}
    if fields.id is not None:
        out["id"] = row.get(fields.id)
    return out


def _identity(fields) -> bool:
    return fields.prompt == "prompt" and fields.reference == "reference" and fields.id is None


def iter_rows(ref: str, fields) -> Iterator[Sample]:
    """Checked samples of a parquet / arrow / CSV file, one at a time."""
    try:
        from datasets import load_dataset
    except ImportError as e:
        raise DatasetError(f"{ref}: reading {Path(ref).suffix} files needs `datasets` (pip install datasets)") from e
    p = Path(ref)
    if not p.is_file():
        raise DatasetError(f"dataset file not found: {ref}")
    kw = {"delimiter": "\t"} if p.suffix.lower() == ".tsv" else {}
    ds = load_dataset(FORMATS[p.suffix.lower()], data_files=str(p), split="train", streaming=True, **kw)
    for i, row in enumerate(ds, 1):
        yield validate_row(_mapped(row, fields), f"{ref}:row {i}")


def load_rows(ref: str, fields, limit: int | None = None) -> list[Sample]:
    if streamed(ref):
        out = []
        for s in iter_rows(ref, fields):
            out.append(s)
            if limit and len(out) >= limit:
                break
        return out
    if _identity(fields):
        rows = load_jsonl(ref)
    else:
        rows = load_jsonl(ref, validate=lambda row, where: validate_row(
            _mapped(row, fields) if isinstance(row, dict) else row, where))
    return rows[:limit] if limit else rows


def _bucket(prompt: Any) -> int:
    return int(hashlib.sha1(json.dumps(prompt, sort_keys=True).encode()).hexdigest()[:8], 16) % 1000


def hash_split(ref: str, cfg) -> tuple[list[Sample], list[Sample]]:
    """(train, held-out) of a streamed file: a row is held out when its prompt's hash falls in the first
    10% of buckets, so the split is disjoint, stable across file order, and needs no second pass."""
    want_train = cfg.train_size or DEFAULT_TRAIN_ROWS
    train: list[Sample] = []
    held: list[Sample] = []
    for s in iter_rows(ref, cfg.fields):
        if _bucket(s["prompt"]) < HELD_OUT_PER_MILLE:
            if len(held) < cfg.eval_size:
                held.append(s)
        elif len(train) < want_train:
            train.append(s)
        if len(train) >= want_train and len(held) >= cfg.eval_size:
            break
    if not train or not held:
        raise DatasetError(f"{ref}: too few rows for a train split and {cfg.eval_size} held-out")
    return train, held
