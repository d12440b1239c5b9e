"""/api/v1: the training primitives in the Tinker SDK's protocol, so ``tinker.ServiceClient(base_url=…)``
and loops written for it run against rlvr unchanged (service/tinker has the sessions, the queue and the
worker; this router only checks requests, queues them and hands back results).

Every call that does work returns a future (``{request_id}``); ``retrieve_future`` waits for its result
up to ``RLVR_TINKER_LONG_POLL_S`` and otherwise answers ``try_again`` (the SDK polls again). Auth: the
SDK sends its key as ``X-API-Key`` (service/access/gate.py accepts it); scope comes from the key like every
other route, and another tenant's session, model, checkpoint or future reads as not found.
"""
from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from fastapi import HTTPException, Request, status
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response

from trainer.config import MAX_STOP_CHARS, MAX_STOP_STRINGS
from trainer.datum_losses import datum_loss_errors

from ..access.keys import KEY_RECHECK_S, Scope, still_valid
from ..deps import PrincipalDep, ScopeDep, SettingsDep, StoreDep
from ..http.guard import api_router
from ..settings import Settings
from . import codec, ids
from .bell import Bell, ring
from .models import base_model_error, model_limits, served_models
from .schemas import (
    AdamIn,
    ClientConfigIn,
    CreateModelIn,
    CreateSamplerIn,
    CreateSessionIn,
    FinishIn,
    LoadWeightsIn,
    ModelIdIn,
    OptimStepIn,
    RetrieveIn,
    SampleIn,
    SaveForSamplerIn,
    SaveWeightsIn,
    SessionIn,
)
from .sessions import Busy, Gone, NotFound, Sessions, new_model, new_sampler

router = api_router(prefix="/api/v1", tags=["training primitives (Tinker-compatible)"])
PROTO = "application/x-protobuf"


def _sessions(store) -> Sessions:
    return Sessions(store)


def _invalid(loc: tuple, msg: str) -> RequestValidationError:
    return RequestValidationError([{"loc": ["body", *loc], "type": "value_error", "msg": msg}])


def _enqueue(settings: Settings, session_id: str) -> None:
    from ..worker.tasks import enqueue_session

    try:
        enqueue_session(session_id, settings)
    except Exception:  # broker down: the reaper re-sends sessions still waiting for a worker
        pass


def _session(ss: Sessions, session_id: str, scope: Scope):
    return ss.active(session_id, scope)  # NotFound 404, Gone 410 (app handlers)


def _model(ss: Sessions, model_id: str, scope: Scope):
    m = ss.model(model_id, scope)
    if m.status in ("lost", "failed"):
        raise Gone(f"model {model_id} is {m.status}: {m.error}")  # 410 (the app's handler)
    return m, _session(ss, m.session_id, scope)


def _submit(ss: Sessions, settings: Settings, sess, target: str, seq: int, kind: str, payload: bytes,
            adds: tuple = ()) -> str:
    """Queue a request (and the rows it creates, ``adds``): every route that queues one comes here, and the
    queue checks the per-session and per-tenant limits (workers are shared by every tenant, and by jobs)."""
    try:
        rid, enqueue = ss.submit(sess, target, seq, kind, payload, settings.tinker_max_pending,
                                 settings.tinker_sessions_per_tenant, adds)
    except Busy as e:
        raise HTTPException(status.HTTP_429_TOO_MANY_REQUESTS, str(e),
                            headers={"Retry-After": str(e.retry_after_s)}) from None
    if enqueue:
        _enqueue(settings, sess.id)
    ring(ss.store.url, f"session:{sess.id}")  # wake the session's worker (it polls anyway, more slowly)
    return rid


# ---------------------------------------------------------------------------------------- service
@router.post("/client/config")
def client_config(body: ClientConfigIn, scope: ScopeDep) -> dict[str, Any]:
    """Feature flags the SDK asks for once: plain API keys, no request compression, fwd/bwd chunks sent
    in order (so gradient accumulation order, and a resumed run, are the same every time)."""
    return {"pjwt_auth_enabled": False, "credential_default_source": "api_key", "parallel_fwdbwd_chunks": False,
            "proto_compress_fwdbwd": False, "use_pyqwest_transport": False, "sample_use_retrieve_futures": False,
            "custom_loss_server_side": False, "sample_join_sampling_session": False, "sample_no_retries": False}


@router.post("/client/dynamic_config")
def client_dynamic_config(body: ClientConfigIn, scope: ScopeDep) -> dict[str, Any]:
    return {"refresh_interval_sec": 300, "sample_cancel_enabled": False}


@router.get("/healthz")
def healthz(scope: ScopeDep) -> dict[str, str]:
    return {"status": "ok"}


@router.get("/get_server_capabilities")
def capabilities(store: StoreDep, settings: SettingsDep, scope: ScopeDep) -> dict[str, Any]:
    """The base models this caller can train and sample: built-in, pulled into the model cache, and its
    own fine-tuned weights (tinker:// paths)."""
    names = served_models(settings, _sessions(store), scope)
    return {"supported_models": [{"model_name": n, "trainable": True, "sampleable": True} for n in names]}


@router.post("/telemetry")
def telemetry(scope: ScopeDep) -> dict[str, str]:
    """The SDK's diagnostics: accepted and dropped (nothing about a client is kept)."""
    return {"status": "accepted"}


@router.post("/create_session")
def create_session(body: CreateSessionIn, store: StoreDep, scope: ScopeDep) -> dict[str, Any]:
    meta = {"tags": body.tags[:64], "user_metadata": body.user_metadata or {}}
    sid = _sessions(store).create(scope.tenant, body.sdk_version, body.display_name, meta)
    return {"type": "create_session", "session_id": sid}


@router.post("/session_heartbeat")
def session_heartbeat(body: SessionIn, store: StoreDep, scope: ScopeDep) -> dict[str, str]:
    ss = _sessions(store)
    ss.heartbeat(body.session_id, scope)
    return {"type": "session_heartbeat"}


@router.post("/sessions/{session_id}/finish")
def finish_session(session_id: str, body: FinishIn, store: StoreDep, scope: ScopeDep) -> Response:
    _sessions(store).finish(session_id, scope, f"{body.reason.get('type', '')}: {body.detail or ''}".strip(": "))
    return Response("null", media_type="application/json")


# ---------------------------------------------------------------------------------------- models
@router.post("/create_model")
def create_model(body: CreateModelIn, store: StoreDep, settings: SettingsDep, scope: ScopeDep) -> dict[str, Any]:
    ss = _sessions(store)
    sess = _session(ss, body.session_id, scope)
    if body.optimizer_config.type != "adamw":
        raise _invalid(("optimizer_config", "type"), "only adamw is served here")
    why = base_model_error(body.base_model, settings, ss, scope)
    if why:
        raise _invalid(("base_model",), why)
    lora = body.lora_config.model_dump() if body.lora_config and body.lora_config.rank > 0 else None
    model_id = ids.model_id(sess.id, body.model_seq_id)
    row = new_model(sess.id, model_id, sess.tenant, body.base_model, lora["rank"] if lora else 0, {"lora": lora})
    payload = json.dumps({"base_model": body.base_model, "lora": lora}).encode()
    rid = _submit(ss, settings, sess, model_id, 0, "create_model", payload, (row,))
    return {"request_id": rid, "model_id": model_id}


@router.post("/get_info")
def get_info(body: ModelIdIn, store: StoreDep, scope: ScopeDep) -> dict[str, Any]:
    m = _sessions(store).model(body.model_id, scope)
    return {"type": "get_info", "model_id": m.id, "model_name": m.base_model, "is_lora": m.lora_rank > 0,
            "lora_rank": m.lora_rank or None, "model_data": {"model_name": m.base_model, "tokenizer_id": None}}


@router.post("/forward_backward")
async def forward_backward(request: Request, store: StoreDep, settings: SettingsDep, scope: ScopeDep) -> dict[str, Any]:
    """A protobuf body (the SDK's ForwardBackwardRequest): checked here, run by the session's worker."""
    if request.headers.get("content-encoding"):
        raise HTTPException(status.HTTP_415_UNSUPPORTED_MEDIA_TYPE, "send forward_backward uncompressed")
    body = await request.body()
    ss = _sessions(store)

    def check():
        found = {}

        def limits_of(model_id: str) -> tuple[int, int]:  # the model is looked up once, before its datums are read
            found["m"], found["sess"] = _model(ss, model_id, scope)
            lim = model_limits(found["m"].base_model, settings, ss)
            return lim.vocab, lim.context

        try:
            fb = codec.decode_forward_backward(body, limits_of)
        except codec.WireError as e:
            raise RequestValidationError(e.errors()) from None
        wrong = datum_loss_errors(fb.loss_fn, fb.config, [set(d.inputs) for d in fb.data])
        if wrong:  # a typo is a 422 here, not a 200 and a failed future after a worker restored the session
            raise RequestValidationError([{"loc": ["body", *loc], "type": "value_error", "msg": msg}
                                          for loc, msg in wrong])
        m, sess = found["m"], found["sess"]
        kind = "forward" if fb.forward_only else "forward_backward"
        return {"request_id": _submit(ss, settings, sess, m.id, fb.seq_id, kind, body), "model_id": m.id}

    return await run_in_threadpool(check)


@router.post("/optim_step")
def optim_step(body: OptimStepIn, store: StoreDep, settings: SettingsDep, scope: ScopeDep) -> dict[str, Any]:
    ss = _sessions(store)
    m, sess = _model(ss, body.model_id, scope)
    given = [p for p in (body.adam_params, body.optimizer_params, body.optim_params) if p is not None]
    params: AdamIn = given[0] if given else AdamIn()
    hp = {"lr": params.learning_rate, "beta1": params.beta1, "beta2": params.beta2, "eps": params.eps,
          "weight_decay": params.weight_decay, "grad_clip_norm": params.grad_clip_norm}
    rid = _submit(ss, settings, sess, m.id, body.seq_id, "optim_step", json.dumps(hp).encode())
    return {"request_id": rid, "model_id": m.id}


@router.post("/save_weights")
def save_weights(body: SaveWeightsIn, store: StoreDep, settings: SettingsDep, scope: ScopeDep) -> dict[str, Any]:
    ss = _sessions(store)
    m, sess = _model(ss, body.model_id, scope)
    name = body.path or f"state-{body.seq_id:07d}"
    path = ids.weights_path(m.id, "weights", name)
    _no_overwrite(ss, path, body.overwrite, scope)
    payload = json.dumps({"name": name, "tinker_path": path}).encode()
    return {"request_id": _submit(ss, settings, sess, m.id, body.seq_id, "save_weights", payload), "model_id": m.id}


def _no_overwrite(ss: Sessions, path: str, overwrite: bool, scope: Scope) -> None:
    if overwrite:
        return
    try:
        ss.checkpoint(path, scope)
    except NotFound:
        return
    raise _invalid(("path",), f"{path} exists; pass overwrite=True to replace it")


@router.post("/save_weights_for_sampler")
def save_weights_for_sampler(body: SaveForSamplerIn, store: StoreDep, settings: SettingsDep,
                             scope: ScopeDep) -> dict[str, Any]:
    ss = _sessions(store)
    m, sess = _model(ss, body.model_id, scope)
    adds: tuple = ()
    if body.path is not None:
        path = ids.weights_path(m.id, "sampler_weights", body.path)
        _no_overwrite(ss, path, True, scope)
        payload = {"name": body.path, "tinker_path": path}
    elif body.sampling_session_seq_id is not None:
        sampler_id = ids.sampler_id(sess.id, body.sampling_session_seq_id)
        adds = (new_sampler(sampler_id, sess.id, sess.tenant, m.base_model, model_id=m.id),)
        payload = {"sampler_id": sampler_id}
    else:
        raise _invalid(("path",), "give a name (path) or a sampling_session_seq_id")
    rid = _submit(ss, settings, sess, m.id, body.seq_id, "save_weights_for_sampler", json.dumps(payload).encode(),
                  adds)
    return {"request_id": rid, "model_id": m.id}


@router.post("/load_weights")
def load_weights(body: LoadWeightsIn, store: StoreDep, settings: SettingsDep, scope: ScopeDep) -> dict[str, Any]:
    ss = _sessions(store)
    if body.weights_access_token:
        raise _invalid(("weights_access_token",), "not supported: checkpoints are shared by tenant, not by token")
    if body.optimizer_config is not None and body.optimizer_config.type != "adamw":
        raise _invalid(("optimizer_config", "type"), "only adamw is served here")
    try:
        ck = ss.checkpoint(body.path, scope)
    except NotFound:
        raise _invalid(("path",), f"checkpoint {body.path!r} not found") from None
    if body.session_id is not None and body.model_seq_id is not None:  # a new model, created from the checkpoint
        sess = _session(ss, body.session_id, scope)
        if body.base_model and body.base_model != ck.base_model:
            raise _invalid(("base_model",), f"the checkpoint's base model is {ck.base_model}")
        model_id = ids.model_id(sess.id, body.model_seq_id)
        src = ss.model(ck.model_id, None)
        lora = src.spec.get("lora") if ck.kind == "training" else None
        adds: tuple = (new_model(sess.id, model_id, sess.tenant, ck.base_model, ck.lora_rank if lora else 0,
                                 {"lora": lora}),)
        seq = 0
    elif body.model_id is not None and body.seq_id is not None:
        m, sess = _model(ss, body.model_id, scope)
        model_id, seq, adds = m.id, body.seq_id, ()
    else:
        raise _invalid(("session_id",), "give session_id and model_seq_id (a new model) or model_id and seq_id")
    payload = json.dumps({"checkpoint_id": ck.id, "optimizer": body.optimizer}).encode()
    rid = _submit(ss, settings, sess, model_id, seq, "load_weights", payload, adds)
    return {"request_id": rid, "model_id": model_id}


@router.get("/training_runs/{model_id}/checkpoints")
def list_checkpoints(model_id: str, store: StoreDep, scope: ScopeDep) -> dict[str, Any]:
    ss = _sessions(store)
    ss.model(model_id, scope)
    rows = ss.checkpoints(scope, model_id)
    return {"checkpoints": [{"checkpoint_id": f"{'weights' if c.kind == 'training' else 'sampler_weights'}/{c.name}",
                             "checkpoint_type": c.kind, "time": c.created_at.isoformat(), "tinker_path": c.tinker_path}
                            for c in rows], "cursor": None}


# ---------------------------------------------------------------------------------------- sampling
@router.post("/create_sampling_session")
def create_sampling_session(body: CreateSamplerIn, store: StoreDep, settings: SettingsDep,
                            scope: ScopeDep) -> dict[str, Any]:
    ss = _sessions(store)
    sess = _session(ss, body.session_id, scope)
    ck = None
    if body.model_path:
        why = base_model_error(body.model_path, settings, ss, scope)
        if why:
            raise _invalid(("model_path",), why)
        ck = ss.checkpoint(body.model_path, scope)
        base = ck.base_model
    elif body.base_model:
        why = base_model_error(body.base_model, settings, ss, scope)
        if why:
            raise _invalid(("base_model",), why)
        base = body.base_model
    else:
        raise _invalid(("base_model",), "give base_model or model_path")
    sampler_id = ids.sampler_id(sess.id, body.sampling_session_seq_id)
    ss.add_sampler(sampler_id, sess.id, sess.tenant, base, checkpoint_id=ck.id if ck else None)
    return {"type": "create_sampling_session", "sampling_session_id": sampler_id}


@router.get("/samplers/{sampler_id}")
def get_sampler(sampler_id: str, store: StoreDep, scope: ScopeDep) -> dict[str, Any]:
    ss = _sessions(store)
    sp = ss.sampler(sampler_id, scope)
    path = ss.checkpoint_by_id(sp.checkpoint_id).tinker_path if sp.checkpoint_id else None
    return {"sampler_id": sp.id, "base_model": sp.base_model, "model_path": path}


@router.post("/asample")
def asample(body: SampleIn, store: StoreDep, settings: SettingsDep, scope: ScopeDep) -> dict[str, Any]:
    ss = _sessions(store)
    if not body.sampling_session_id:
        raise _invalid(("sampling_session_id",), "required (create a sampling client first)")
    for name in ("target_prompt_logprobs", "prompt_logprobs_last_n"):
        if getattr(body, name) is not None:
            raise _invalid((name,), "not served here")
    sp_params = body.sampling_params
    if sp_params.top_k != -1:
        raise _invalid(("sampling_params", "top_k"), "only -1 (no top-k cut) is served here")
    sp = ss.sampler(body.sampling_session_id, scope)
    sess = _session(ss, sp.session_id, scope)
    prompt = [t for c in body.prompt.chunks for t in c.tokens]
    if not prompt:
        raise _invalid(("prompt",), "empty")
    lim = model_limits(sp.base_model, settings, ss)  # checked here, at the door, not by the worker
    if len(prompt) >= lim.context:
        raise _invalid(("prompt",), f"{len(prompt)} tokens: the model's context is {lim.context}, with room for at "
                       "least one sampled token")
    max_tokens = sp_params.max_tokens or min(256, lim.context - len(prompt))
    if body.num_samples * max_tokens > settings.tinker_max_sample_tokens:
        raise _invalid(("num_samples",), f"num_samples × max_tokens = {body.num_samples * max_tokens} exceeds "
                       f"{settings.tinker_max_sample_tokens} (RLVR_TINKER_MAX_SAMPLE_TOKENS)")
    if len(prompt) + max_tokens > lim.context:
        raise _invalid(("sampling_params", "max_tokens"), f"the prompt's {len(prompt)} tokens + max_tokens "
                       f"{max_tokens} pass the model's context ({lim.context}): at most {lim.context - len(prompt)}")
    if min(prompt) < 0 or max(prompt) >= lim.vocab:
        raise _invalid(("prompt",), f"token ids must be in [0, {lim.vocab}) (the model's vocabulary)")
    stop = sp_params.stop
    stop_strings = [stop] if isinstance(stop, str) else [s for s in (stop or []) if isinstance(s, str)]
    stop_ids = None if stop is None or isinstance(stop, str) else [s for s in stop if isinstance(s, int)]
    if len(stop_strings) > MAX_STOP_STRINGS or any(not 0 < len(s) <= MAX_STOP_CHARS for s in stop_strings):
        raise _invalid(("sampling_params", "stop"), f"at most {MAX_STOP_STRINGS} stop strings of 1 to "
                       f"{MAX_STOP_CHARS} characters (each is matched against every sampled row at every step)")
    payload = {"prompt": prompt, "num_samples": body.num_samples, "max_tokens": max_tokens,
               "temperature": sp_params.temperature, "top_p": sp_params.top_p, "seed": sp_params.seed,
               "stop_ids": stop_ids, "stop_strings": stop_strings, "prompt_logprobs": bool(body.prompt_logprobs)}
    rid = _submit(ss, settings, sess, sp.id, body.seq_id, "sample", json.dumps(payload).encode())
    return {"request_id": rid, "sample_sequence_ids": [f"{rid}:{i}" for i in range(body.num_samples)]}


# ---------------------------------------------------------------------------------------- futures
@router.post("/retrieve_future")
async def retrieve_future(body: RetrieveIn, request: Request, store: StoreDep, settings: SettingsDep,
                          scope: ScopeDep, principal: PrincipalDep) -> Response:
    """The result once the worker has it: JSON, or protobuf for forward_backward and sample results;
    ``{error, category}`` for a failed request; ``try_again`` after the long-poll window. The key is checked
    again every second of the wait: a key revoked meanwhile gets a 401, not the result."""
    ss = _sessions(store)
    deadline, delay = time.monotonic() + settings.tinker_long_poll_s, settings.tinker_poll_min_s
    checked = time.monotonic()
    with Bell(store.url, f"request:{body.request_id}") as bell:  # bound before the first look: no ring is lost
        while True:
            if time.monotonic() - checked >= KEY_RECHECK_S:
                if not await run_in_threadpool(still_valid, store, principal):
                    raise HTTPException(status.HTTP_401_UNAUTHORIZED, "API key revoked",
                                        headers={"WWW-Authenticate": "Bearer"})
                checked = time.monotonic()
            row = await run_in_threadpool(ss.finished_request, body.request_id, scope)
            if row is not None:
                break
            if time.monotonic() > deadline or await request.is_disconnected():
                return JSONResponse({"type": "try_again", "request_id": body.request_id, "queue_state": "active"})
            if bell.sock is not None:  # the worker rings when it is done: look again then, or now and then
                await bell.wait_async(settings.tinker_poll_max_s)
                continue
            await asyncio.sleep(delay)
            if time.monotonic() > deadline - settings.tinker_long_poll_s + settings.tinker_hot_s:
                delay = min(delay * 1.5, settings.tinker_poll_max_s)
    if row.status == "failed":
        return JSONResponse({"error": row.error or "failed", "category": row.category or "unknown"})
    if row.result_proto:
        return Response(row.result, media_type=PROTO)
    return Response(row.result, media_type="application/json")


@router.post("/cancel_future")
def cancel_future(body: RetrieveIn, scope: ScopeDep) -> Response:
    """Accepted; a running request finishes (its result is simply not fetched)."""
    return Response("null", media_type="application/json")
