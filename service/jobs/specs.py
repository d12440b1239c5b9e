"""One place that checks and resolves what a job spec names — models, datasets, files, verifiers — for
every front door (native jobs, the OpenAI-compatible API) and for the worker.

At submission, :func:`check_spec` turns every reference (``JobSpec.references()``) into a 422 naming its
field when it names nothing the caller may use: a built-in model or task that does not exist (a task's
``data.params`` it refuses), a file another tenant uploaded, a server path when paths are disabled — with
one answer whether such a path exists or not, so no caller can probe the server's files. In the worker,
:func:`resolve_spec` turns the same references into what the trainer loads: uploaded file ids into their
stored paths, model names into model-cache folders (trainer.models.resolve resolves built-ins).
"""
from __future__ import annotations

import json
from pathlib import Path

from fastapi.exceptions import RequestValidationError

from trainer.config import JobSpec, Reference
from trainer.models import hub
from trainer.models.resolve import ASSETS, ModelPathError, builtin_name, in_model_cache, model_error, resolve_model

from ..access.keys import Scope
from ..settings import Settings
from ..store.jobs import Store
from ..tinker.models import is_session_weights, job_model_dir, job_model_error
from .catalog import FT, fine_tuned_path
from .files import FileNotFound, get_file, resolve_file


def _err(ref: Reference, msg: str) -> dict:
    return {"loc": ("body", *ref.loc), "type": "value_error", "msg": msg}


def _is_file(path: str) -> bool:
    """False, not an exception, for names the OS refuses (too long, NUL bytes…)."""
    try:
        return Path(path).expanduser().is_file()
    except (OSError, ValueError):
        return False


def _model(ref: Reference, settings: Settings, store: Store, owner: str) -> str | None:
    if ref.value.startswith(FT):  # a finished job's model: the tenant's own, else as missing as any other id
        return None if fine_tuned_path(store, ref.value, owner) else f"model {ref.value!r} not found"
    if (builtin_name(ref.value) is not None or in_model_cache(ref.value, settings.models_dir)
            or hub.is_hub_id(ref.value)):  # names, not server paths: checked whatever the path policy
        return model_error(ref.value, settings.models_dir, settings.local_paths_allowed)
    if not settings.local_paths_allowed:
        # One answer whether the path exists, is refused or is outside the models dir: no file oracle.
        return (f"model {ref.value!r} not found: use a builtin: model, a Hugging Face Hub id (org/name), the name "
                "of a model in the server's models directory or a fine-tuned model's id (server paths are disabled)")
    return model_error(ref.value, settings.models_dir) if settings.validate_paths else None


def _dataset(ref: Reference, spec: JobSpec, settings: Settings, store: Store, owner: str) -> str | None:
    from trainer.data import DatasetError
    from trainer.tasks import task_for

    try:
        task = task_for(ref.value)
    except DatasetError as e:
        return str(e)
    if task is not None:
        if task.eval_only and ref.loc == ("data", "dataset"):
            return f"{ref.value} is an evaluation set: name it as data.eval_dataset"
        return None
    if ref.value.startswith("file-"):
        try:
            get_file(store, ref.value, owner)  # the worker reads it as the job's tenant
        except FileNotFound:
            return f"file {ref.value!r} not found"
        return None
    if not settings.local_paths_allowed:  # the same answer for every path: no file oracle
        return "server paths are disabled: upload the file (POST /v1/files) and use its id"
    if settings.validate_paths and not _is_file(ref.value):
        what = "pairs file (or use `online`)" if ref.kind == "pairs" else "dataset file"
        return f"{what} {ref.value!r} not found"
    return None


def _params(spec: JobSpec) -> list[dict]:
    """A built-in task's ``data.params``: the generator's own knobs, checked by the task itself."""
    from trainer.tasks import tasks

    name = builtin_name(spec.data.dataset)
    task = tasks().get(name) if name else None
    if task is None:
        if spec.data.params:
            return [{"loc": ("body", "data", "params"), "type": "value_error",
                     "msg": "data.params configure a built-in task; this dataset is a file"}]
        return []
    try:
        msg = task.params_error(dict(spec.data.params))
    except ImportError as e:  # the task's package is missing on this server
        msg = str(e)
    return [{"loc": ("body", "data", "params"), "type": "value_error", "msg": msg}] if msg else []


def reference_errors(spec: JobSpec, settings: Settings, store: Store, owner: str) -> list[dict]:
    errors = []
    for ref in spec.references():
        if ref.kind == "model" and is_session_weights(ref.value):  # a training session's weights (tinker://)
            msg = job_model_error(ref.value, store, owner)
        else:
            msg = (_model(ref, settings, store, owner) if ref.kind == "model"
                   else _dataset(ref, spec, settings, store, owner))
        if msg:
            errors.append(_err(ref, msg))
    return errors + _params(spec)


def _local_folder(value: str, settings: Settings, store: Store, owner: str) -> Path | None:
    """Where a model a spec names already is on this server (nothing downloaded or built), else None."""
    try:
        if is_session_weights(value):
            return Path(job_model_dir(value, store, owner))
        if value.startswith(FT):
            return fine_tuned_path(store, value, owner)
        name = builtin_name(value)
        if name is not None:
            return ASSETS / name
        if in_model_cache(value, settings.models_dir):
            return settings.models_dir / value
        if settings.local_paths_allowed and Path(value).is_absolute():
            return Path(value)
    except Exception:  # unresolvable here: the reference check reports it, the worker checks again
        return None
    return None


def _vocabulary(folder: Path | None) -> int | None:
    try:
        cfg = json.loads((folder / "config.json").read_text()) if folder is not None else {}
    except (OSError, ValueError):
        return None
    return cfg.get("vocab_size") or (cfg.get("text_config") or {}).get("vocab_size")


def vocabulary_errors(spec: JobSpec, settings: Settings, store: Store, owner: str) -> list[dict]:
    """A critic or a teacher reads the policy's token ids: a different vocabulary is a 422 naming the field
    (checked where both models are already on the server; otherwise the worker refuses it at load)."""
    want = _vocabulary(_local_folder(spec.model.path, settings, store, owner))
    errors = []
    for ref in spec.references():
        if ref.kind != "model" or ref.loc == ("model", "path") or want is None:
            continue
        have = _vocabulary(_local_folder(ref.value, settings, store, owner))
        if have is not None and have != want:
            errors.append(_err(ref, f"{ref.value!r} has a vocabulary of {have} tokens, the policy ({spec.model.path}) "
                                    f"{want}: it reads the policy's token ids, so they must share a tokenizer"))
    return errors


def cost_errors(spec: JobSpec, settings: Settings) -> list[dict]:
    """What this server bounds beyond the spec's own limits (trainer/config.py bounds each step and evaluation)."""
    if spec.train.world_size > settings.max_world_size:
        return [{"loc": ("body", "train", "world_size"), "type": "value_error",
                 "msg": f"{spec.train.world_size} ranks: this server runs at most {settings.max_world_size} per job "
                        "(RLVR_MAX_WORLD_SIZE)"}]
    env = spec.episodes.env if spec.episodes is not None else None
    if env is not None and env.type == "http":  # checked again in the worker, at every connection
        from trainer.envs import net

        try:
            net.check(env.url, net.allowed_networks(settings.env_allow))
        except (net.Refused, ValueError) as e:
            return [{"loc": ("body", "episodes", "env", "url"), "type": "value_error",
                     "msg": f"environment URL refused: {e}"}]
    from trainer.cluster import asks_for_ray

    field = asks_for_ray(spec)
    if field and not settings.ray_address:
        return [{"loc": ("body", "train", field), "type": "value_error",
                 "msg": f"train.{field} places the job on a Ray cluster, and this server has none (RLVR_RAY_ADDRESS)"}]
    return []


def check_spec(spec: JobSpec, settings: Settings, store: Store, scope: Scope) -> JobSpec:
    """Checks pydantic cannot do alone (registries, files, models, the verifiers the scope may use, what
    this server bounds); a 422 naming each bad field, before anything is queued. Returns the spec with
    stored verifiers pinned to a version."""
    from .stored_verifiers import pin_job_spec

    pinned, errors = pin_job_spec(spec, store.engine, scope)
    errors += reference_errors(spec, settings, store, scope.tenant) + cost_errors(spec, settings)
    errors = errors or vocabulary_errors(spec, settings, store, scope.tenant)
    if errors:
        raise RequestValidationError(errors)
    return pinned


def resolve_spec(spec: JobSpec, store: Store, tenant: str, settings: Settings, log=print) -> JobSpec:
    """In the worker: uploaded file ids become their stored paths; model names, Hub ids (downloaded if needed)
    and fine-tuned ids the folders they load from, by the rules the submission was checked with. Built-ins
    are left to the trainer (it makes them available). Returns a new spec: the stored one (tenant names)
    never becomes the worker's (server paths)."""
    spec = spec.model_copy(deep=True)
    for ref in spec.references():
        value = ref.value
        if ref.kind != "model" and value.startswith("file-"):
            value = resolve_file(store, value, tenant)
        elif ref.kind == "model" and is_session_weights(value):
            value = job_model_dir(value, store, tenant)
        elif ref.kind == "model" and value.startswith(FT):
            path = fine_tuned_path(store, value, tenant)
            if path is None:
                raise ModelPathError(f"model {value!r} not found (its job was deleted?)")
            value = str(path)
        elif ref.kind == "model" and builtin_name(value) is None:
            value = str(resolve_model(value, settings.models_dir, log, local_paths=settings.local_paths_allowed))
        if value != ref.value:
            _set(spec, ref.loc, value)
    return spec


def _set(spec: JobSpec, loc: tuple[str, ...], value: str) -> None:
    obj = spec
    for part in loc[:-1]:
        obj = getattr(obj, part)
    setattr(obj, loc[-1], value)
