"""Uploaded JSONL datasets: validated line by line on upload, stored under $RLVR_HOME/files."""
from __future__ import annotations

import json
from pathlib import Path

from trainer.data import DatasetError, validate_pair, validate_row

from .db import File
from .store import Store


class FileNotFound(KeyError):
    pass


def validate_jsonl(data: bytes, max_errors: int = 20, purpose: str = "fine-tune") -> tuple[int, list[str]]:
    """Return (number of samples, errors as 'line N: why'); every line must be a sample
    (or, for purpose "preference", a {prompt, chosen, rejected} pair)."""
    check = validate_pair if purpose == "preference" else validate_row
    errors: list[str] = []
    n = 0
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        return 0, [f"byte {e.start}: not UTF-8"]
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            check(json.loads(line), f"line {lineno}")
            n += 1
        except json.JSONDecodeError as e:
            errors.append(f"line {lineno}: invalid JSON ({e.msg} at column {e.colno})")
        except DatasetError as e:
            errors.append(str(e))
        if len(errors) >= max_errors:
            errors.append("… (stopped after the first errors)")
            break
    if n == 0 and not errors:
        errors.append("the file holds no samples")
    return n, errors


def save_file(store: Store, root: Path, tenant: str, filename: str, purpose: str, data: bytes, lines: int) -> File:
    root.mkdir(parents=True, exist_ok=True)
    with store.Session.begin() as s:
        f = File(tenant=tenant, filename=filename, purpose=purpose, bytes=len(data), lines=lines, path="")
        s.add(f)
        s.flush()
        path = root / f"{f.id}.jsonl"
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(data)
        tmp.rename(path)
        f.path = str(path)
    return f


def get_file(store: Store, file_id: str, tenant: str | None) -> File:
    with store.Session() as s:
        f = s.get(File, file_id)
        if f is None or (tenant is not None and f.tenant != tenant):
            raise FileNotFound(file_id)
        return f


def resolve_file(store: Store, file_id: str, tenant: str | None) -> str:
    try:
        return get_file(store, file_id, tenant).path
    except FileNotFound:
        raise DatasetError(f"file {file_id!r} not found") from None
