"""Every model a job can start from, as ids: built-ins, pulled (the model cache), cached (the Hugging Face
cache) and fine-tuned (a tenant's finished jobs) — for ``GET /v1/models``, ``rlvr models list`` and the spec
checks (service/jobs/specs.py), which accept each id this lists.

A finished job's model is ``ft:<base>:<job id>`` (``ft:builtin:tiny-arith:job-…``; an OpenAI job's
``suffix`` goes before the job id, as OpenAI's own ids carry it). It names the job's final checkpoint: a
new job's ``model.path`` takes it (resolved here for the job's own tenant only; another tenant's reads as a
missing model), and ``download_url`` fetches it. An id never carries a server path.
"""
from __future__ import annotations

import datetime as dt
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath

from trainer.models import hub
from trainer.models.resolve import MODELS, PREFIX, in_model_cache

from ..access.keys import Scope
from ..settings import Settings
from ..store.jobs import JobNotFound, Store
from ..store.tables import Job

FT = "ft:"
MAX_FINE_TUNED = 1000  # the newest this many finished jobs of a scope are listed (every one still resolves)


@dataclass(frozen=True)
class ModelEntry:
    """OpenAI's model object (id, object, created, owned_by) plus where the model comes from."""

    id: str
    created: int
    owned_by: str
    source: str  # builtin | pulled | cached | fine-tuned
    object: str = "model"
    parent: str | None = None  # fine-tuned: the model it started from
    fine_tuning_job: str | None = None
    download_url: str | None = None

    def public(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}


def _ts(t: dt.datetime | None) -> int:
    if t is None:
        return 0
    return int((t if t.tzinfo else t.replace(tzinfo=dt.timezone.utc)).timestamp())


def _mtime(path: Path) -> int:
    try:
        return int(path.stat().st_mtime)
    except OSError:
        return 0


def base_name(ref: str) -> str:
    """What an id says a model started from: its reference, or a directory's name (never its path)."""
    if ref.startswith(("/", "~", ".")) or "\\" in ref:
        return PurePosixPath(ref.replace("\\", "/")).name or "model"
    return ref


def fine_tuned_id(job: Job) -> str | None:
    """The model id of a succeeded job's final checkpoint, or None (not finished, no checkpoint)."""
    result = job.result if isinstance(job.result, dict) else {}
    if job.status != "succeeded" or not isinstance(result.get("checkpoint"), str) or not result["checkpoint"]:
        return None
    origin = job.origin if isinstance(job.origin, dict) else {}
    spec = job.spec if isinstance(job.spec, dict) else {}
    base = origin.get("model") or (spec.get("model") or {}).get("path") or "model"
    suffix = origin.get("suffix")
    return f"{FT}{base_name(str(base))}:{f'{suffix}:' if suffix else ''}{job.id}"


def download_url(job: Job) -> str:
    return f"/v1/jobs/{job.id}/checkpoints/{PurePosixPath(job.result['checkpoint']).name}/download"


def _fine_tuned_job(store: Store, model_id: str, tenant: str | None) -> Job | None:
    """The job behind a fine-tuned id, if ``tenant`` (None: any) may use it; the id must be the job's own."""
    if not model_id.startswith(FT) or ":" not in model_id[len(FT):]:
        return None
    job_id = model_id.rsplit(":", 1)[1]
    try:
        job = store.get_job(job_id, tenant)
    except JobNotFound:
        return None
    return job if fine_tuned_id(job) == model_id else None


def fine_tuned_path(store: Store, model_id: str, tenant: str | None) -> Path | None:
    """The checkpoint folder a fine-tuned id loads from (for the worker; never shown), or None."""
    job = _fine_tuned_job(store, model_id, tenant)
    if job is None:
        return None
    name = PurePosixPath(job.result["checkpoint"]).name
    ckpt = next((c for c in store.get_checkpoints(job.id) if c.name == name), None)
    if ckpt is None or not (Path(ckpt.path) / "config.json").is_file():
        return None  # its files are gone (the job was deleted meanwhile): as missing as no job
    return Path(ckpt.path)


def _fine_tuned_entry(job: Job) -> ModelEntry:
    model_id = fine_tuned_id(job)
    assert model_id is not None
    spec = job.spec if isinstance(job.spec, dict) else {}
    parent = (job.origin or {}).get("model") or (spec.get("model") or {}).get("path")
    return ModelEntry(id=model_id, created=_ts(job.finished_at), owned_by=job.tenant, source="fine-tuned",
                      parent=base_name(str(parent)) if parent else None, fine_tuning_job=job.id,
                      download_url=download_url(job))


def _pulled(models_dir: Path) -> list[ModelEntry]:
    """Model folders in the model cache, by the name a spec uses (``smollm2-135m``, ``org/name``)."""
    out = []
    try:
        candidates = [p for p in models_dir.iterdir() if p.is_dir() and not p.name.startswith(".")]
    except OSError:
        return []
    for top in sorted(candidates):
        inner = [top] if (top / "config.json").is_file() else \
            sorted(p for p in top.iterdir() if p.is_dir() and not p.name.startswith("."))
        for folder in inner:
            name = folder.relative_to(models_dir).as_posix()
            if in_model_cache(name, models_dir):
                out.append(ModelEntry(id=name, created=_mtime(folder / "config.json"), owned_by="rlvr",
                                      source="pulled"))
    return out


def catalog(settings: Settings, store: Store, scope: Scope) -> list[ModelEntry]:
    """Every model ``scope`` may start a job from (fine-tuned: its own tenant's; an admin's: every tenant's)."""
    jobs = store.list_jobs(scope.only, "succeeded", limit=MAX_FINE_TUNED)
    return _unique(_server_models(settings) + [_fine_tuned_entry(j) for j in jobs if fine_tuned_id(j)])


def _server_models(settings: Settings) -> list[ModelEntry]:
    """Built-in, pulled and cached models: the same for every tenant."""
    out = [ModelEntry(id=PREFIX + name, created=0, owned_by="rlvr", source="builtin") for name in sorted(MODELS)]
    out += _pulled(settings.models_dir)
    out += [ModelEntry(id=repo_id, created=_mtime(folder / "config.json"), owned_by=repo_id.split("/", 1)[0],
                       source="cached") for repo_id, folder in hub.list_cached()]
    return out


def _unique(out: list[ModelEntry]) -> list[ModelEntry]:
    seen, unique = set(), []
    for entry in out:  # a cached name may read like a Hub id: the first (what a spec resolves to) wins
        if entry.id not in seen:
            seen.add(entry.id)
            unique.append(entry)
    return unique


def find(settings: Settings, store: Store, scope: Scope, model_id: str) -> ModelEntry | None:
    """One model by id, or None (another tenant's fine-tuned model too)."""
    if model_id.startswith(FT):
        job = _fine_tuned_job(store, model_id, scope.only)
        return _fine_tuned_entry(job) if job is not None else None
    return next((m for m in _unique(_server_models(settings)) if m.id == model_id), None)
