"""Uploaded JSONL datasets: checked on upload by the reader jobs use, stored under $RLVR_HOME/files.

An upload is accepted only if :func:`trainer.data.load_jsonl` — the very function a job reads its
dataset with — reads every line of it; a file that passes the check is a file the job can read (no
second line splitter that, say, treats ``\\x1c`` as a line break where the reader does not). Each row
must also pass :func:`service.http.guard.json_problems` (depth, 64-bit integers, finite numbers, text),
so nothing stored from an upload can break a later reply.
"""
from __future__ import annotations

import uuid
from pathlib import Path

from trainer.data import DatasetError, load_jsonl, validate_pair, validate_row

from ..http.guard import MAX_JSON_DEPTH, json_problems
from ..store.jobs import Store
from ..store.tables import File


class FileNotFound(KeyError):
    pass


class _Enough(Exception):
    pass


def check_jsonl(path: Path, purpose: str = "fine-tune", max_errors: int = 20) -> tuple[int, list[str]]:
    """Return (number of samples, errors as 'line N: why') for the JSONL file at ``path``; every line
    must be a sample (or, for purpose "preference", a {prompt, chosen, rejected} pair)."""
    check = validate_pair if purpose == "preference" else validate_row
    prefix = f"{path}:"
    errors: list[str] = []
    n = last = 0

    def collect(row, where: str):
        nonlocal n, last
        last = int(where.rpartition(":")[2])
        problems = json_problems(row, loc=())
        if problems:
            p = problems[0]
            errors.append(f"line {last}: {'.'.join(map(str, p['loc'])) + ': ' if p['loc'] else ''}{p['msg']}")
        else:
            try:
                check(row, f"line {last}")
                n += 1
            except DatasetError as e:
                errors.append(str(e))
        if len(errors) >= max_errors:
            raise _Enough
        return None  # the rows themselves are not needed here

    try:
        load_jsonl(path, validate=collect)
    except _Enough:
        errors.append("… (stopped after the first errors)")
    except DatasetError as e:  # the reader stops at the first line that is not JSON, or found no rows
        msg = str(e)
        errors.append("the file holds no samples" if msg == f"{path}: no rows" else msg.replace(prefix, "line ", 1))
    except RecursionError:
        errors.append(f"after line {last}: JSON nested deeper than {MAX_JSON_DEPTH} levels (the limit)")
    except ValueError:  # json.loads refuses integer literals over 4300 digits
        errors.append(f"after line {last}: integer literal too long (integers must fit in 64 bits)")
    return n, errors


def store_upload(store: Store, root: Path, tenant: str, filename: str, purpose: str,
                 data: bytes) -> tuple[File | None, list[str]]:
    """Check an upload with the job reader and keep it: (the file, []) or (None, errors)."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        return None, [f"byte {e.start}: not UTF-8"]
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f"upload-{uuid.uuid4().hex}.tmp"
    tmp.write_bytes(data)
    try:
        n, errors = check_jsonl(tmp, purpose)
        if errors:
            return None, errors
        return _keep(store, tmp, tenant, filename, purpose, len(data), n), []
    finally:
        tmp.unlink(missing_ok=True)


def _keep(store: Store, tmp: Path, tenant: str, filename: str, purpose: str, size: int, lines: int) -> File:
    with store.Session.begin() as s:
        f = File(tenant=tenant, filename=filename, purpose=purpose, bytes=size, lines=lines, path="")
        s.add(f)
        s.flush()
        path = tmp.parent / f"{f.id}.jsonl"
        tmp.rename(path)
        f.path = str(path)
    return f


def save_file(store: Store, root: Path, tenant: str, filename: str, purpose: str, data: bytes, lines: int) -> File:
    """Keep bytes this server produced itself (e.g. rows converted from an already checked upload)."""
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f"upload-{uuid.uuid4().hex}.tmp"
    tmp.write_bytes(data)
    try:
        return _keep(store, tmp, tenant, filename, purpose, len(data), lines)
    finally:
        tmp.unlink(missing_ok=True)


def remove_file(store: Store, file_id: str) -> None:
    """Forget a file: its row, then its bytes."""
    with store.Session.begin() as s:
        row = s.get(File, file_id)
        path = row.path if row is not None else None
        if row is not None:
            s.delete(row)
    if path:
        Path(path).unlink(missing_ok=True)


def read_rows(store: Store, file_id: str, tenant: str | None) -> list:
    """An uploaded file's rows as JSON values, read by the job reader (raw: not converted to samples)."""
    return load_jsonl(get_file(store, file_id, tenant).path, validate=lambda row, where: row)


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
