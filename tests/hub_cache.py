"""A Hugging Face cache laid out exactly as huggingface_hub lays it out, built from a local model folder, so
Hub ids are tested offline: ``models--org--name/blobs/<hash>`` (git blob sha1 for small files, sha256 for LFS
ones), ``snapshots/<commit>/<file>`` as relative symlinks to the blobs, ``refs/main`` holding the commit."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

LFS = (".safetensors", ".bin", ".pt")


def _blob_id(path: Path) -> str:
    data = path.read_bytes()
    if path.suffix in LFS:
        return hashlib.sha256(data).hexdigest()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def add_to_cache(hub_cache: Path, repo_id: str, source: Path, files: list[str] | None = None) -> Path:
    """Put ``source``'s files into ``hub_cache`` as the snapshot of ``repo_id`` at refs/main; returns the snapshot."""
    repo = hub_cache / ("models--" + repo_id.replace("/", "--"))
    names = sorted(files or [p.name for p in source.iterdir() if p.is_file()])
    commit = hashlib.sha1("".join(_blob_id(source / n) for n in names).encode()).hexdigest()
    snapshot = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True, exist_ok=True)
    for name in names:
        blob = repo / "blobs" / _blob_id(source / name)
        if not blob.exists():
            blob.write_bytes((source / name).read_bytes())
        link = snapshot / name
        if not link.is_symlink():
            os.symlink(os.path.relpath(blob, snapshot), link)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit)  # no newline: as the library writes it
    return snapshot


def use_cache(monkeypatch, hf_home: Path, offline: bool = True) -> Path:
    """Point this process (env for subprocesses; huggingface_hub's constants, read at its import, for this one)
    at ``hf_home``; returns its hub cache."""
    from huggingface_hub import constants

    cache = hf_home / "hub"
    cache.mkdir(parents=True, exist_ok=True)
    monkeypatch.setenv("HF_HOME", str(hf_home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1" if offline else "0")
    monkeypatch.setattr(constants, "HF_HOME", str(hf_home))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", offline)
    return cache
