"""Which base models a session may train or sample, and where they load from.

Names a tenant may use (``get_server_capabilities`` lists them): the built-in models (``builtin:…``),
models pulled or converted into the server's model cache (their folder name), and the tenant's own
fine-tuned weights by ``tinker://`` path — sampler weights, or the training state of a fully fine-tuned
model (a LoRA training state holds only an adapter). Never a server path: the one answer for anything
else is "not found", whether or not such a folder exists.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trainer.models.resolve import MODELS, PREFIX, builtin_name, in_model_cache, model_error, resolve_model

from ..access.keys import Scope
from ..settings import Settings
from .ids import TINKER
from .sessions import NotFound, Sessions


def _cache_names(settings: Settings) -> list[str]:
    root = settings.models_dir
    try:
        dirs = sorted(p.name for p in root.iterdir() if (p / "config.json").is_file())
    except OSError:
        return []
    return [d for d in dirs if d not in MODELS]  # a built-in's folder is listed under its builtin: name


def served_models(settings: Settings, sessions: Sessions, scope: Scope) -> list[str]:
    own = [c.tinker_path for c in sessions.checkpoints(scope, limit=200) if _full_model(c)]
    return [PREFIX + k for k in sorted(MODELS)] + _cache_names(settings) + own


def _full_model(ck) -> bool:
    return ck.kind == "sampler" or ck.lora_rank == 0


def base_model_error(ref: str, settings: Settings, sessions: Sessions, scope: Scope) -> str | None:
    """Why ``ref`` is not a model this caller may train or sample (None: it is)."""
    if ref.startswith(TINKER):
        try:
            ck = sessions.checkpoint(ref, scope)
        except NotFound:
            return f"checkpoint {ref!r} not found"
        return None if _full_model(ck) else (f"{ref} is a LoRA training state (an adapter only): load it with "
                                             "create_training_client_from_state, or save_weights_for_sampler")
    if builtin_name(ref) is not None or (in_model_cache(ref, settings.models_dir) and "/" not in ref.strip("/")):
        return model_error(ref, settings.models_dir)
    # not echoed: one answer for every name that is not served, paths included (no file oracle)
    return "model not found; served here: builtin:… names, model-cache names and your tinker:// weights"


def model_dir(ref: str, settings: Settings, sessions: Sessions) -> Path:
    """Where an (already checked) reference loads from, in the worker."""
    if ref.startswith(TINKER):
        return Path(sessions.checkpoint(ref, None).path)
    return resolve_model(ref, settings.models_dir, log=lambda m: None)


@dataclass(frozen=True)
class Limits:
    vocab: int    # token ids are in [0, vocab)
    context: int  # positions the model has: a datum, or a prompt plus what is sampled after it, fits in it


_LIMITS: dict[tuple[str, str], Limits] = {}
# the names config.json files give the context length (Llama/Qwen/Mistral, GPT-2, others)
_CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx")


def model_limits(ref: str, settings: Settings, sessions: Sessions) -> Limits:
    """The model's vocabulary and context, from its config.json: what bounds token ids and lengths at the
    door. Cached per process: resolving a built-in checks its files (~0.1 s), far too slow for every
    forward_backward."""
    import json

    key = (ref, str(settings.models_dir))
    if key not in _LIMITS:
        _LIMITS[key] = limits_of_config(json.loads((model_dir(ref, settings, sessions) / "config.json").read_text()))
    return _LIMITS[key]


def limits_of_config(cfg: dict) -> Limits:
    """A model's limits from its config (config.json, or a loaded model's ``config.to_dict()``)."""
    text = cfg.get("text_config") or cfg
    context = next((int(v) for k in _CONTEXT_KEYS for v in (text.get(k), cfg.get(k)) if isinstance(v, int)), None)
    return Limits(int(text.get("vocab_size") or cfg["vocab_size"]), context or MAX_CONTEXT)


MAX_CONTEXT = 65_536  # a config that names no context length: the most any request may send anyway


# ---------------------------------------------------------------- jobs that start from a session's weights
def is_session_weights(ref: str) -> bool:
    return ref.startswith(TINKER)


def job_model_error(ref: str, store, tenant: str) -> str | None:
    """Why a job spec's ``model.path`` naming session weights (``tinker://…``) cannot be used by ``tenant``."""
    try:
        ck = Sessions(store).checkpoint(ref, Scope(tenant))
    except NotFound:
        return f"checkpoint {ref!r} not found"
    return None if _full_model(ck) else (f"{ref} is a LoRA training state (an adapter only); a job starts from full "
                                         "weights: save_weights_for_sampler gives them")


def job_model_dir(ref: str, store, tenant: str) -> str:
    """In the worker: the folder a job loads session weights from (an ordinary HF checkpoint folder)."""
    return Sessions(store).checkpoint(ref, Scope(tenant)).path
