"""What a job spec can name without a path: built-in models and datasets, and models pulled by name.

The one registry every front door checks names against (service/jobs/specs.py: native jobs, the
OpenAI-compatible API, training sessions) and the one resolver the trainer loads them with, so a name
that passes at submission is the name the worker loads.

- ``builtin:<model>`` — ``MODELS``: a function ``(models_dir, log) -> folder`` that makes it available;
- a bare name — a model pulled or converted into the model cache (``rlvr models pull smollm2-135m``);
- an HF checkpoint directory — where server paths are allowed (``local_paths``: the service decides);
- a Hugging Face Hub id (``Qwen/Qwen2.5-0.5B-Instruct``) — its snapshot in the HF cache, downloaded if
  needed and allowed (trainer.models.hub: ``HF_HOME``, ``HF_HUB_OFFLINE``).
In that order, for the check at submission and the resolution in the worker alike: a name in the model cache
or a directory wins over a Hub id that reads the same.
Datasets: ``builtin:<task>`` — trainer.tasks (what a task generates, asks and how it is judged);
otherwise a file (trainer.tasks.files).
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from . import hub

PREFIX = "builtin:"


class ModelPathError(ValueError):
    """A model reference that names nothing loadable (message says which and why)."""


def _tiny_arith(models_dir: Path, log) -> Path:
    from .tiny_arith import ensure_tiny_model

    return ensure_tiny_model(models_dir, log=log)


def _tiny_code(models_dir: Path, log) -> Path:
    from .tiny_code import ensure_tiny_code

    return ensure_tiny_code(models_dir, log=log)


def _tiny_tool(models_dir: Path, log) -> Path:
    from .tiny_tool import ensure_tiny_tool

    return ensure_tiny_tool(models_dir, log=log)


MODELS: dict[str, Callable[[Path, Callable[[str], None]], Path]] = {"tiny-arith": _tiny_arith,
                                                                     "tiny-code": _tiny_code,
                                                                     "tiny-tool": _tiny_tool}
ASSETS = Path(__file__).resolve().parent / "assets"  # the built-ins' committed folders (MODELS copies them)


def known(kind: dict) -> str:
    return ", ".join(PREFIX + k for k in sorted(kind))


def builtin_name(ref: str) -> str | None:
    return ref[len(PREFIX):] if ref.startswith(PREFIX) else None


def model_error(ref: str, models_dir: Path, local_paths: bool = True) -> str | None:
    """Why ``ref`` cannot be loaded, or None if it can (without building, downloading or loading anything)."""
    name = builtin_name(ref)
    if name is not None:
        return None if name in MODELS else f"unknown built-in model {ref!r}; known: {known(MODELS)}"
    if in_model_cache(ref, models_dir) or (local_paths and _is_model_dir(Path(ref).expanduser())):
        return None
    if hub.is_hub_id(ref):
        return hub.error(ref)
    return (f"{ref!r} is neither a built-in model, a model in the model cache, a Hugging Face Hub id (org/name)"
            + (" nor an HF checkpoint directory (no config.json)" if local_paths else ""))


def in_model_cache(ref: str, models_dir: Path) -> bool:
    """``ref`` names a model inside the model cache (pulled, converted or fine-tuned here): a name a
    tenant may use even where server paths are refused."""
    rel = Path(ref)
    return not rel.is_absolute() and ".." not in rel.parts and _is_model_dir(models_dir / rel)


def resolve_model(ref: str, models_dir: str | Path, log: Callable[[str], None] = print,
                  local_paths: bool = True) -> Path:
    """The folder ``ref`` loads from: a built-in (made available first), a cached name, a directory, or a Hub
    id's snapshot (downloaded unless cached or offline)."""
    models_dir = Path(models_dir)
    name = builtin_name(ref)
    if name is not None:
        if name not in MODELS:
            raise ModelPathError(f"unknown built-in model {ref!r}; known: {known(MODELS)}")
        return MODELS[name](models_dir, log)
    if in_model_cache(ref, models_dir):
        return models_dir / ref
    if local_paths and _is_model_dir(Path(ref).expanduser()):
        return Path(ref).expanduser()
    if hub.is_hub_id(ref):
        try:
            return hub.snapshot(ref, log)
        except hub.HubError as e:
            raise ModelPathError(str(e)) from None
    raise ModelPathError(model_error(ref, models_dir, local_paths) or f"model {ref!r} cannot be loaded")


def _is_model_dir(p: Path) -> bool:
    try:
        return (p / "config.json").is_file()
    except (OSError, ValueError):  # names the OS refuses (too long, NUL bytes): not a model
        return False
