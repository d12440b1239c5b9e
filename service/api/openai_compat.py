"""OpenAI-compatible reinforcement fine-tuning: /v1/fine_tuning/jobs and /v1/fine_tuning/alpha/graders.

Scripts written for OpenAI's RFT API work against rlvr unchanged (``OpenAI(base_url=…/v1)``): the
request is mapped onto an rlvr job spec (service.openai_map), the job runs like any other, and
responses come back in OpenAI's shapes. Unsupported fields are a 400 naming the parameter.
"""
from __future__ import annotations

import json
import time
from typing import Any

from fastapi import APIRouter, HTTPException, Query
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from trainer.config import JobSpec

from ..deps import PrincipalDep, SettingsDep, StoreDep
from ..files import FileNotFound, get_file, save_file
from ..openai_map import Unsupported, convert_rows, grader_to_verifier, hyperparameters, job_object
from ..store import IllegalTransition, JobNotFound

router = APIRouter(prefix="/v1/fine_tuning", tags=["openai-compatible"])
ALLOWED = {"model", "training_file", "validation_file", "hyperparameters", "method", "seed", "suffix", "metadata",
           "integrations"}


def _error(status: int, message: str, param: str | None = None, code: str = "invalid_request_error"):
    return JSONResponse({"error": {"message": message, "type": code, "param": param, "code": None}}, status)


def _tenant(p) -> str | None:
    return None if p.tenant == "admin" else p.tenant


def _model_path(model: str, settings) -> str:
    if model.startswith("builtin:"):
        return model
    pulled = settings.models_dir / model
    if (pulled / "config.json").is_file():  # e.g. `rlvr models pull smollm2-135m`
        return str(pulled)
    return model  # a checkpoint directory; check_spec validates it


def _load_rows(store, file_id: str, tenant: str, param: str) -> list[dict]:
    try:
        f = get_file(store, file_id, None if tenant == "admin" else tenant)
    except FileNotFound:
        raise Unsupported(param, f"file {file_id!r} not found") from None
    with open(f.path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


@router.post("/jobs")
def create(body: dict[str, Any], store: StoreDep, settings: SettingsDep, principal: PrincipalDep):
    from .jobs import _enqueue_or_fail, check_spec

    try:
        extra = set(body) - ALLOWED
        if extra:
            raise Unsupported(sorted(extra)[0], "unsupported parameter")
        if body.get("integrations"):
            raise Unsupported("integrations", "integrations are not supported")
        for key in ("model", "training_file"):
            if not isinstance(body.get(key), str) or not body[key]:
                raise Unsupported(key, f"'{key}' is required")
        method = body.get("method") or {}
        if method.get("type") != "reinforcement":
            raise Unsupported("method.type", "only method.type = 'reinforcement' is supported")
        rl = method.get("reinforcement") or {}
        verifier, field = grader_to_verifier(rl.get("grader"))
        rows = convert_rows(_load_rows(store, body["training_file"], principal.tenant, "training_file"), field)
        patch, echo = hyperparameters(rl.get("hyperparameters") or {}, len(rows))
        paths = {}
        for key, data in (("training_file", rows), ("validation_file", None)):
            if key == "validation_file":
                if not body.get(key):
                    continue
                data = convert_rows(_load_rows(store, body[key], principal.tenant, key), field)
            blob = "".join(json.dumps(r) + "\n" for r in data).encode()
            paths[key] = save_file(store, settings.home_dir / "files", principal.tenant, f"{body[key]}-rlvr.jsonl",
                                   "dataset", blob, len(data)).id
        name = f"ft-{body.get('suffix') or 'openai'}"[:200]
        spec = {"name": name, "model": {"path": _model_path(body["model"], settings)},
                "data": {"dataset": paths["training_file"], **({"eval_dataset": paths["validation_file"]}
                                                                if "validation_file" in paths else {})},
                "verifiers": [verifier], **patch,
                "metadata": {str(k): str(v) for k, v in (body.get("metadata") or {}).items()}}
        spec["train"]["seed"] = int(body["seed"]) if body.get("seed") is not None else 0
        parsed = JobSpec.model_validate(spec)
    except Unsupported as e:
        return _error(400, str(e), e.param)
    except ValidationError as e:
        err = e.errors()[0]
        return _error(400, f"{'.'.join(map(str, err['loc']))}: {err['msg']}", "method.reinforcement")
    pinned = check_spec(parsed, settings, store, principal.tenant)  # 422 naming the field if still wrong
    origin = {"api": "openai", "model": body["model"], "training_file": body["training_file"],
              "validation_file": body.get("validation_file"), "hyperparameters": echo, "method": method}
    job = store.create_job(pinned.model_dump(mode="json"), tenant=principal.tenant, origin=origin)
    _enqueue_or_fail(store, settings, job.id)
    return job_object(store.get_job(job.id), origin)


def _get(store, job_id, principal):
    try:
        return store.get_job(job_id, _tenant(principal))
    except JobNotFound:
        raise HTTPException(404, f"fine-tuning job {job_id!r} not found") from None


@router.get("/jobs")
def list_jobs(store: StoreDep, principal: PrincipalDep, after: str | None = Query(None, max_length=128),
              limit: int = Query(20, ge=1, le=100)):
    before = None
    if after:
        j = _get(store, after, principal)
        before = (j.created_at, j.id)
    jobs = store.list_jobs(_tenant(principal), limit=limit + 1, before=before)
    return {"object": "list", "data": [job_object(j, j.origin or {}) for j in jobs[:limit]],
            "has_more": len(jobs) > limit}


@router.get("/jobs/{job_id}")
def retrieve(job_id: str, store: StoreDep, principal: PrincipalDep):
    j = _get(store, job_id, principal)
    return job_object(j, j.origin or {})


@router.get("/jobs/{job_id}/events")
def events(job_id: str, store: StoreDep, principal: PrincipalDep, after: str | None = Query(None, max_length=64),
           limit: int = Query(20, ge=1, le=1000)):
    """Newest first, like OpenAI's; ``after`` is the id of the last event already seen."""
    _get(store, job_id, principal)
    rows = store.get_events(job_id, 0, 100_000)[::-1]
    if after:
        rows = [e for e in rows if str(e.id).isdigit() and e.id < int(after)] if after.isdigit() else []
    page = rows[:limit]
    data = [{"object": "fine_tuning.job.event", "id": str(e.id), "created_at": int(e.created_at.timestamp()),
             "level": {"warning": "warn"}.get(e.level, e.level), "message": e.message,
             "type": "metrics" if e.type == "metrics" else "message", "data": e.data or {}} for e in page]
    return {"object": "list", "data": data, "has_more": len(rows) > limit}


@router.get("/jobs/{job_id}/checkpoints")
def checkpoints(job_id: str, store: StoreDep, principal: PrincipalDep, after: str | None = Query(None, max_length=64),
                limit: int = Query(10, ge=1, le=100)):
    _get(store, job_id, principal)
    rows = store.get_checkpoints(job_id)[::-1]
    if after:
        rows = [c for c in rows if c.step < _step_of(after)]
    page = rows[:limit]
    data = [{"object": "fine_tuning.job.checkpoint", "id": f"ftckpt-{job_id}-{c.step}",
             "created_at": int(c.created_at.timestamp()), "fine_tuned_model_checkpoint": c.path,
             "step_number": c.step, "fine_tuning_job_id": job_id,
             "metrics": {k: v for k, v in (c.metrics or {}).items() if isinstance(v, (int, float))}} for c in page]
    return {"object": "list", "data": data, "has_more": len(rows) > limit,
            "first_id": data[0]["id"] if data else None, "last_id": data[-1]["id"] if data else None}


def _step_of(ckpt_id: str) -> int:
    tail = ckpt_id.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else -1


def _action(action: str, job_id: str, store, settings, principal):
    from .jobs import _enqueue_or_fail

    try:
        job, enqueue = store.request(job_id, action, _tenant(principal))
    except JobNotFound:
        return _error(404, f"fine-tuning job {job_id!r} not found")
    except IllegalTransition as e:
        return _error(400, str(e))
    if enqueue:
        _enqueue_or_fail(store, settings, job_id)
    j = store.get_job(job_id)
    return job_object(j, j.origin or {})


@router.post("/jobs/{job_id}/cancel")
def cancel(job_id: str, store: StoreDep, settings: SettingsDep, principal: PrincipalDep):
    return _action("cancel", job_id, store, settings, principal)


@router.post("/jobs/{job_id}/pause")
def pause(job_id: str, store: StoreDep, settings: SettingsDep, principal: PrincipalDep):
    return _action("pause", job_id, store, settings, principal)


@router.post("/jobs/{job_id}/resume")
def resume(job_id: str, store: StoreDep, settings: SettingsDep, principal: PrincipalDep):
    return _action("resume", job_id, store, settings, principal)


@router.post("/alpha/graders/validate")
def validate_grader(body: dict[str, Any]):
    try:
        spec, _ = grader_to_verifier(body.get("grader"), "grader")
        from verifiers import get_verifier

        get_verifier(spec["name"], spec["config"])  # the verifier's own config validation
    except Unsupported as e:
        return _error(400, str(e), e.param)
    except (ValueError, ValidationError) as e:
        return _error(400, str(e), "grader")
    return {"grader": body["grader"]}


@router.post("/alpha/graders/run")
def run_grader(body: dict[str, Any]):
    """Dry run of one grader on one sample (rlvr's verifier dry run, OpenAI's response shape)."""
    from verifiers import get_verifier

    try:
        spec, field = grader_to_verifier(body.get("grader"), "grader")
        if not isinstance(body.get("model_sample"), str):
            raise Unsupported("model_sample", "'model_sample' (a string) is required")
        item = body.get("item") or {}
        if not isinstance(item, dict):
            raise Unsupported("item", "'item' must be an object")
        if field is not None and field not in item:
            raise Unsupported("item", f"item has no field {field!r} the grader references")
        verifier = get_verifier(spec["name"], spec["config"])
    except Unsupported as e:
        return _error(400, str(e), e.param)
    except (ValueError, ValidationError) as e:
        return _error(400, str(e), "grader")
    t0 = time.perf_counter()
    verdict = verifier.verify(body["model_sample"], item[field] if field else item)
    status = verdict.status.value
    errors = {"formula_parse_error": False, "sample_parse_error": status == "unparseable",
              "truncated_observation_error": False, "unresponsive_reward_error": status == "timeout",
              "invalid_variable_error": False, "other_error": status == "error",
              "python_grader_server_error": False, "python_grader_server_error_type": None,
              "python_grader_runtime_error": status == "error" and spec["name"] == "python",
              "python_grader_runtime_error_details": verdict.reason if status == "error" else None,
              "model_grader_server_error": False, "model_grader_refusal_error": False,
              "model_grader_parse_error": False, "model_grader_server_error_details": None}
    sub = verdict.details.get("sub_scores") or {}
    return {"reward": verdict.score, "sub_rewards": sub, "model_grader_token_usage_per_model": {},
            "metadata": {"name": body["grader"].get("name", spec["name"]), "type": body["grader"]["type"],
                         "errors": errors, "execution_time": time.perf_counter() - t0, "scores": sub,
                         "token_usage": None, "sampled_model_name": None}}
