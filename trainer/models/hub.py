"""Hugging Face Hub model ids (``Qwen/Qwen2.5-0.5B-Instruct``) as model references, through huggingface_hub.

Everything goes through the library, so its own settings hold: ``HF_HOME`` / ``HF_HUB_CACHE`` say where the
cache is, ``HF_HUB_OFFLINE=1`` forbids the network, ``HF_TOKEN`` opens gated and private repos. A cached
snapshot is used as it is (the revision ``refs/main`` points at): a job does not re-resolve the Hub on every
start, and ``rlvr models pull ID --force`` refreshes it. Messages name the id, never the cache's location
(they reach tenants).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Callable

# The Hub's own rule for repo ids: namespace/name, letters, digits, - _ . (no "--" or ".."), at most 96 each
HUB_ID = re.compile(r"^(?!.*(--|\.\.))[A-Za-z0-9](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?/"
                    r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?$")
# what a checkpoint folder needs to load; other formats in a repo (ONNX, GGUF, TF, Flax, originals) are skipped
WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
SKIP = ["*.gguf", "*.onnx", "*.onnx_data", "*.h5", "*.msgpack", "*.ot", "*.tflite", "*.mlmodel", "onnx/*",
        "original/*", "openvino/*", "coreml/*", "*.pth"]


class HubError(ValueError):
    """A hub id that cannot be had here (message says why, without server paths)."""


def is_hub_id(ref: str) -> bool:
    return bool(HUB_ID.fullmatch(ref))


def offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def complete(folder: Path) -> bool:
    """A snapshot a model loads from: its config and its weights (a config-only download is not)."""
    return (folder / "config.json").is_file() and any((folder / w).is_file() for w in WEIGHTS)


def cached(repo_id: str) -> Path | None:
    """The cached snapshot of ``repo_id`` (the revision refs/main names), or None; never touches the network."""
    from huggingface_hub import snapshot_download

    try:
        folder = Path(snapshot_download(repo_id, local_files_only=True, ignore_patterns=SKIP))
    except Exception:  # LocalEntryNotFoundError, IncompleteSnapshotError, a damaged cache: not cached
        return None
    return folder if complete(folder) else None


def error(repo_id: str) -> str | None:
    """Why ``repo_id`` cannot be had (None: cached, or the Hub has it). Asks the Hub only when it is not cached
    and the network is allowed."""
    if cached(repo_id) is not None:
        return None
    if offline():
        return (f"model {repo_id!r} is not in this server's Hugging Face cache and HF_HUB_OFFLINE is set "
                f"(pull it first: rlvr models pull {repo_id})")
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    try:
        HfApi().model_info(repo_id, timeout=10)
    except GatedRepoError:
        return f"model {repo_id!r} is gated on the Hugging Face Hub: accept its terms and give the server an HF_TOKEN"
    except RepositoryNotFoundError:
        return f"model {repo_id!r} not found on the Hugging Face Hub (or private without an HF_TOKEN)"
    except Exception as e:  # network down, Hub down: the worker could not download it either
        return f"model {repo_id!r} is not cached here and the Hugging Face Hub cannot be reached ({type(e).__name__})"
    return None


def snapshot(repo_id: str, log: Callable[[str], None] = print, force: bool = False) -> Path:
    """The folder ``repo_id`` loads from: the cached snapshot, else downloaded (unless offline)."""
    folder = None if force else cached(repo_id)
    if folder is not None:
        return folder
    if offline():
        raise HubError(error(repo_id) or f"model {repo_id!r} is not cached")
    from huggingface_hub import snapshot_download

    log(f"downloading {repo_id} from the Hugging Face Hub")
    try:
        folder = Path(snapshot_download(repo_id, ignore_patterns=SKIP, force_download=force))
    except Exception as e:
        raise HubError(error(repo_id) or f"model {repo_id!r}: download failed ({type(e).__name__})") from None
    if not complete(folder):
        raise HubError(f"model {repo_id!r} has no config.json and weights (safetensors or bin) to load")
    return folder


def list_cached() -> list[tuple[str, Path]]:
    """(repo id, snapshot folder) for every complete model snapshot in the Hugging Face cache."""
    from huggingface_hub import constants, scan_cache_dir

    try:  # the cache snapshot_download reads (scan_cache_dir's default is bound when the library is imported)
        info = scan_cache_dir(constants.HF_HUB_CACHE)
    except Exception:  # no cache yet (CacheNotFound) or an unreadable one: nothing cached
        return []
    out = []
    for repo in info.repos:
        if repo.repo_type == "model" and is_hub_id(repo.repo_id):
            folder = cached(repo.repo_id)
            if folder is not None:
                out.append((repo.repo_id, folder))
    return sorted(out)
