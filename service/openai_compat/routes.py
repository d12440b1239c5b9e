"""OpenAI-compatible reinforcement fine-tuning: /v1/fine_tuning/jobs and /v1/fine_tuning/alpha/graders.

Scripts written for OpenAI's RFT API work against rlvr unchanged (``OpenAI(base_url=…/v1)``): the
request is mapped onto an rlvr job spec (service.openai_compat.mapping), the job runs like any other, and
responses come back in OpenAI's shapes. Unsupported fields are a 400 naming the parameter; every error is in
OpenAI's shape (service/openai_compat/errors.py).
"""
from __future__ import annotations

import json
import re
import time
from typing import Any

from fastapi import Query, Request
from pydantic import ValidationError

from trainer.config import JobSpec
from trainer.data import DatasetError

from ..access.fairshare import check_budget
from ..access.keys import Scope
from ..access.redact import redact_paths
from ..deps import FairShareDep, ScopeDep, SettingsDep, StoreDep
from ..http.guard import api_router, parse_int
from ..jobs.files import FileNotFound, read_rows, remove_file, save_file
from ..jobs.schemas import render_rows, result_of
from ..jobs.submit import check, submit
from ..worker.tasks import enqueue_or_warn
from .errors import OpenAIRoute, error
from .mapping import Unsupported, checkpoint_url, convert_rows, grader_to_verifier, hyperparameters, job_object
from .schema import FineTuningJobCreate, GraderRunIn, GraderValidateIn

router = api_router(prefix="/v1/fine_tuning", tags=["openai-compatible"], route_class=OpenAIRoute)


def _load_rows(store, file_id: str, owner: str, param: str) -> list:
    try:
        return read_rows(store, file_id, owner)  # the job reader (trainer.data.load_jsonl)
    except (FileNotFound, DatasetError):
        raise Unsupported(param, f"file {file_id!r} not found") from None


@router.post("/jobs")
def create(body: FineTuningJobCreate, store: StoreDep, settings: SettingsDep, scope: ScopeDep):
    rl = body.method.reinforcement
    verifier, field = grader_to_verifier(rl.grader.model_dump(exclude_none=True))
    rows = {"training_file": convert_rows(_load_rows(store, body.training_file, scope.tenant, "training_file"), field)}
    patch, echo = hyperparameters(rl.hyperparameters.model_dump(exclude_none=True) if rl.hyperparameters else {},
                                  len(rows["training_file"]))
    if body.validation_file:
        rows["validation_file"] = convert_rows(_load_rows(store, body.validation_file, scope.tenant,
                                                          "validation_file"), field)
    # Every check runs on the spec naming the uploads themselves (the caller's own files): a refused request
    # writes nothing. Only an accepted one stores the converted copies the job reads, and points at them.
    pinned = _checked_spec(body, verifier, patch, {k: getattr(body, k) for k in rows}, store, settings, scope)
    ids: dict[str, str] = {}
    try:
        for key, data in rows.items():
            blob = "".join(json.dumps(r) + "\n" for r in data).encode()
            ids[key] = save_file(store, settings.home_dir / "files", scope.tenant, f"{getattr(body, key)}-rlvr.jsonl",
                                 "dataset", blob, len(data)).id
        pinned.data.dataset = ids["training_file"]
        if "validation_file" in ids:
            pinned.data.eval_dataset = ids["validation_file"]
        origin = {"api": "openai", "model": body.model, "training_file": body.training_file,
                  "validation_file": body.validation_file, "hyperparameters": echo, "suffix": body.suffix,
                  "method": body.method.model_dump(mode="json", exclude_none=True)}
        job = submit(pinned, store, settings, scope, origin=origin)
    except BaseException:
        for file_id in ids.values():  # the job was not created: neither are its copies
            remove_file(store, file_id)
        raise
    return job_object(job, origin)


def _checked_spec(body: FineTuningJobCreate, verifier: dict, patch: dict, files: dict[str, str], store, settings,
                  scope: Scope) -> JobSpec:
    spec = {"name": f"ft-{body.suffix or 'openai'}", "model": {"path": body.model},
            "data": {"dataset": files["training_file"],
                     **({"eval_dataset": files["validation_file"]} if "validation_file" in files else {})},
            "verifiers": [verifier], **patch, "metadata": dict(body.metadata or {})}
    spec["train"]["seed"] = body.seed or 0
    try:
        parsed = JobSpec.model_validate(spec)
    except ValidationError as e:  # e.g. epochs × rows / batch_size beyond train.steps' bound
        err = e.errors(include_url=False)[0]
        raise Unsupported("method.reinforcement.hyperparameters",
                          f"maps to {'.'.join(map(str, err['loc']))}: {err['msg']}") from None
    return check(parsed, settings, store, scope)  # 400 naming the parameter if the model is unknown


def _get(store, job_id: str, scope: Scope):
    return store.get_job(job_id, scope.only)  # JobNotFound: OpenAI's 404 (service/openai_compat/errors.py)


_METADATA = re.compile(r"^metadata\[([^\[\]]{1,64})\]$")
METADATA_QUERY = {"parameters": [{
    "name": "metadata", "in": "query", "style": "deepObject", "explode": True, "required": False,
    "schema": {"type": "object", "additionalProperties": {"type": "string", "maxLength": 512}},
    "description": "Only jobs whose metadata has these values: `metadata[key]=value` (repeatable)."}]}


@router.get("/jobs", openapi_extra=METADATA_QUERY)
def list_jobs(request: Request, store: StoreDep, scope: ScopeDep, after: str | None = Query(None, max_length=128),
              limit: int = Query(20, ge=1, le=100)):
    before = None
    if after:
        j = _get(store, after, scope)
        before = (j.created_at, j.id)
    meta = {m.group(1): v for k, v in request.query_params.multi_items() if (m := _METADATA.match(k))}
    jobs = store.list_jobs(scope.only, limit=limit + 1, before=before, meta=meta or None)
    data, unreadable = render_rows(jobs[:limit], lambda j: job_object(j, j.origin or {}))
    return {"object": "list", "data": data, "has_more": len(jobs) > limit,
            **({"unreadable": unreadable} if unreadable else {})}


@router.get("/jobs/{job_id}")
def retrieve(job_id: str, store: StoreDep, scope: ScopeDep):
    j = _get(store, job_id, scope)
    return job_object(j, j.origin or {})


@router.get("/jobs/{job_id}/events")
def events(job_id: str, store: StoreDep, scope: ScopeDep, after: str | None = Query(None, max_length=64),
           limit: int = Query(20, ge=1, le=1000)):
    """Newest first, like OpenAI's; ``after`` is the id of the last event already seen."""
    _get(store, job_id, scope)
    before = parse_int(after, ("query", "after"))
    rows = store.get_events(job_id, 0, 100_000)[::-1]
    if before is not None:
        rows = [e for e in rows if e.id < before]
    page = rows[:limit]
    data = [{"object": "fine_tuning.job.event", "id": str(e.id), "created_at": int(e.created_at.timestamp()),
             "level": {"warning": "warn"}.get(e.level, e.level), "message": redact_paths(e.message),
             "type": "metrics" if e.type == "metrics" else "message", "data": e.data or {}} for e in page]
    return {"object": "list", "data": data, "has_more": len(rows) > limit}


@router.get("/jobs/{job_id}/checkpoints")
def checkpoints(job_id: str, store: StoreDep, scope: ScopeDep, after: str | None = Query(None, max_length=128),
                limit: int = Query(10, ge=1, le=100)):
    _get(store, job_id, scope)
    rows = store.get_checkpoints(job_id)[::-1]
    if after:
        # ftckpt-<job>-<step>; a cursor with nothing after its last dash ("-", "x-") is parsed whole: a 400, not
        # an empty step that parse_int reads as "no cursor" (schemathesis found after=- answering a 500)
        step = parse_int(after.rsplit("-", 1)[-1] or after, ("query", "after"))
        rows = [c for c in rows if c.step < step]
    page = rows[:limit]
    data = [{"object": "fine_tuning.job.checkpoint", "id": f"ftckpt-{job_id}-{c.step}",
             "created_at": int(c.created_at.timestamp()), "fine_tuned_model_checkpoint": checkpoint_url(job_id, c.name),
             "step_number": c.step, "fine_tuning_job_id": job_id,
             "metrics": {k: v for k, v in (c.metrics or {}).items() if isinstance(v, (int, float))}} for c in page]
    return {"object": "list", "data": data, "has_more": len(rows) > limit,
            "first_id": data[0]["id"] if data else None, "last_id": data[-1]["id"] if data else None}


def _action(action: str, job_id: str, store, settings, scope: Scope):
    job, enqueue = store.request(job_id, action, scope.only)  # JobNotFound 404, IllegalTransition 400
    if enqueue:
        enqueue_or_warn(store, settings, job_id)
    j = store.get_job(job_id)
    return job_object(j, j.origin or {})


@router.post("/jobs/{job_id}/cancel")
def cancel(job_id: str, store: StoreDep, settings: SettingsDep, scope: ScopeDep):
    return _action("cancel", job_id, store, settings, scope)


@router.post("/jobs/{job_id}/pause")
def pause(job_id: str, store: StoreDep, settings: SettingsDep, scope: ScopeDep):
    return _action("pause", job_id, store, settings, scope)


@router.post("/jobs/{job_id}/resume")
def resume(job_id: str, store: StoreDep, settings: SettingsDep, scope: ScopeDep):
    return _action("resume", job_id, store, settings, scope)


@router.post("/alpha/graders/validate")
def validate_grader(body: GraderValidateIn):
    spec, _ = grader_to_verifier(body.grader.model_dump(exclude_none=True), "grader")
    from verifiers import get_verifier

    try:
        get_verifier(spec["name"], spec["config"])  # the verifier's own config validation
    except (ValueError, RecursionError) as e:  # pydantic's ValidationError is a ValueError
        return error(400, str(e)[:2000], "grader")
    return {"grader": body.grader.model_dump(mode="json", exclude_unset=True)}


@router.post("/alpha/graders/run")
async def run_grader(body: GraderRunIn, scope: ScopeDep, fair: FairShareDep):
    """Dry run of one grader on one sample (rlvr's verifier dry run, OpenAI's response shape), within the
    tenant's fair share of the sandbox."""
    spec, field = grader_to_verifier(body.grader.model_dump(exclude_none=True), "grader")
    item = body.item or {}
    if field is not None and field not in item:
        raise Unsupported("item", f"item has no field {field!r} the grader references")
    return await fair.run(scope.tenant, _run_grader, body, spec, field, item, fair.budget_s)


def _run_grader(body: GraderRunIn, spec: dict, field: str | None, item: dict, budget_s: float) -> Any:
    from verifiers import Status, Verdict, get_verifier
    from verifiers.base import sandbox_seconds

    try:
        verifier = get_verifier(spec["name"], spec["config"])
    except (ValueError, RecursionError) as e:
        return error(400, str(e)[:2000], "grader")
    check_budget(sandbox_seconds(verifier, item[field] if field else item), budget_s, ("body", "grader"), "the grader")
    t0 = time.perf_counter()
    try:
        verdict = verifier.verify(body.model_sample, item[field] if field else item)
    except Exception as e:  # a verifier's bug is a result of the run, not a 500
        verdict = Verdict(0.0, Status.error, f"{type(e).__name__}: {e}"[:1000], {"error_kind": "runtime_error"})
    status = verdict.status.value
    errors = {"formula_parse_error": False, "sample_parse_error": status == "unparseable",
              "truncated_observation_error": False, "unresponsive_reward_error": status == "timeout",
              "invalid_variable_error": False, "other_error": status == "error",
              "python_grader_server_error": False, "python_grader_server_error_type": None,
              "python_grader_runtime_error": status == "error" and spec["name"] == "python",
              "python_grader_runtime_error_details": verdict.reason if status == "error" else None,
              "model_grader_server_error": False, "model_grader_refusal_error": False,
              "model_grader_parse_error": False, "model_grader_server_error_details": None}
    result = result_of(verdict, time.perf_counter() - t0)
    return {"reward": result.score, "sub_rewards": result.sub_scores, "model_grader_token_usage_per_model": {},
            "metadata": {"name": body.grader.name, "type": body.grader.type, "errors": errors,
                         "execution_time": result.elapsed_s, "scores": result.sub_scores,
                         "token_usage": None, "sampled_model_name": None}}
