"""The session worker: one process holds one session's models and samplers and runs its queued
requests in order, until the session ends or stays idle past ``RLVR_TINKER_RELEASE_IDLE_S``.

Started by the thin Celery task ``rlvr.run_session`` (service.worker.tasks) on the train queue, so sessions and
jobs share the same workers (one per GPU). The worker claims the session's lease and renews it from a
thread that is also the watchdog: a request running longer than ``RLVR_TINKER_REQUEST_TIMEOUT_S`` is
failed and, in a Celery worker, the process exits so the hung work cannot hold the device (Celery
replaces it). Before releasing an idle session, every model changed since its last save is saved, so
the next worker resumes it exactly; a model with accumulated, unapplied gradients cannot be, and is
marked lost with the reason.
"""
from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import traceback
import uuid
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch

from trainer import primitives as prim
from trainer.checkpoint import save_to

from ..access.redact import redact_paths
from ..settings import Settings, get_settings
from ..store.jobs import LeaseLost, Store
from . import codec, ids
from .bell import Bell, ring
from .models import limits_of_config, model_dir
from .sessions import Sessions

log = logging.getLogger("rlvr.tinker")
MAX_SNAPSHOTS = 4  # in-memory sampler snapshots per session (the newest are kept)
MAX_BATCH = 64     # sample requests run as one generation


class UserError(ValueError):
    """A request that cannot be served as asked (reported to the client as a user error)."""


class _Lease(threading.Thread):
    def __init__(self, sessions: Sessions, session_id: str, owner: str, settings: Settings, hard_exit: bool):
        super().__init__(daemon=True, name=f"lease-{session_id}")
        self.sessions, self.session_id, self.owner, self.settings = sessions, session_id, owner, settings
        self.hard_exit, self.lost, self.active = hard_exit, False, True
        self.stopped = threading.Event()
        self.current: tuple[Any, float] | None = None  # (request, start)

    def run(self) -> None:
        s = self.settings
        while not self.stopped.wait(min(s.lease_s / 4, s.tinker_request_timeout_s / 4)):
            cur = self.current
            if cur is not None and time.monotonic() - cur[1] > s.tinker_request_timeout_s:
                msg = (f"the request did not finish within {s.tinker_request_timeout_s:g} s "
                       "(RLVR_TINKER_REQUEST_TIMEOUT_S)")
                try:
                    self.sessions.finish_request(cur[0], self.owner, error=msg, category="server",
                                                 model={"status": "lost", "error": msg})
                except Exception as e:
                    log.warning("could not record the timeout: %s", e)
                if self.hard_exit:
                    os._exit(70)
            try:
                self.active = self.sessions.renew(self.session_id, self.owner, s.lease_s).status == "active"
            except LeaseLost:
                self.lost = True
                return
            except Exception as e:  # DB blip: the lease covers a few missed renewals
                log.warning("lease renewal for %s failed: %s", self.session_id, e)


class Holder:
    """The session's models (TrainState by model id) and samplers (an LRU of frozen models)."""

    def __init__(self, settings: Settings, sessions: Sessions, session_id: str):
        self.settings, self.sessions, self.session_id = settings, sessions, session_id
        self.dtype = getattr(torch, settings.tinker_dtype)
        self.models: dict[str, prim.TrainState] = {}
        self.grads: set[str] = set()                 # models with gradients not yet applied
        self.step_loss: dict[str, float] = {}        # loss of the forward_backward calls of the coming step
        self.samplers: OrderedDict[str, tuple[Any, Any]] = OrderedDict()

    # ------------------------------------------------------------------ loading
    def _dir(self, ref: str) -> Path:
        return model_dir(ref, self.settings, self.sessions)

    def _new_state(self, base: str, lora: dict | None) -> prim.TrainState:
        spec = prim.LoraSpec(**lora) if lora else None
        model, tok = prim.load_model(self._dir(base), self.dtype, spec)
        return prim.TrainState(model, tok)

    def restore(self) -> None:
        """Models a previous worker held: rebuilt from their spec and last saved state (they are clean)."""
        for m in self.sessions.models_of(self.session_id):
            if m.status != "ready":
                continue
            st = self._new_state(m.base_model, m.spec.get("lora"))
            if m.last_state is not None:
                ck = self.sessions.checkpoint_by_id(m.last_state)
                st.load(Path(ck.path), optimizer=ck.has_optimizer)
            self.models[m.id] = st
            log.info("session %s: restored %s", self.session_id, m.id)

    def _model(self, model_id: str) -> prim.TrainState:
        st = self.models.get(model_id)
        if st is None:
            row = self.sessions.model(model_id, None)
            raise UserError(row.error or f"model {model_id} is not loaded ({row.status})")
        return st

    # ------------------------------------------------------------------ requests
    def run(self, req) -> dict[str, Any]:
        """Execute one request; returns the keyword arguments of Sessions.finish_request."""
        fn = getattr(self, "_" + req.kind)
        return fn(req)

    def _create_model(self, req) -> dict[str, Any]:
        p = json.loads(req.payload)
        self.models[req.target] = self._new_state(p["base_model"], p.get("lora"))
        return {"result": _json({"model_id": req.target, "type": "create_model"}), "model": {"status": "ready"}}

    def _load_weights(self, req) -> dict[str, Any]:
        p = json.loads(req.payload)
        ck = self.sessions.checkpoint_by_id(p["checkpoint_id"])
        if req.target not in self.models:  # create-via-load: the checkpoint says what the model is
            meta = _meta(Path(ck.path))
            self.models[req.target] = self._new_state(meta.get("base_model", ck.base_model), meta.get("lora"))
        st = self._model(req.target)
        try:
            st.load(Path(ck.path), optimizer=p["optimizer"])
        except Exception as e:
            raise UserError(f"cannot load {ck.tinker_path} into {req.target}: {e}") from None
        self.grads.discard(req.target)
        exact = p["optimizer"] and ck.has_optimizer
        model = {"status": "ready", "dirty": not exact, "steps": st.steps}
        if exact:
            model["last_state"] = ck.id
        return {"result": _json({"path": ck.tinker_path, "model_id": req.target, "type": "load_weights"}),
                "model": model}

    def _forward_backward(self, req, backward: bool = True) -> dict[str, Any]:
        st = self._model(req.target)
        lim = limits_of_config(st.model.config.to_dict())  # what the door checked, again for the loaded model
        fb = codec.decode_forward_backward(req.payload, lambda _m: (lim.vocab, lim.context))
        from trainer.datum_losses import DATUM_LOSSES, datum_loss_errors

        errors = datum_loss_errors(fb.loss_fn, fb.config, [set(d.inputs) for d in fb.data])
        if errors:  # the door checked this already; a request stored before that check is refused here too
            raise UserError("; ".join(f"{'.'.join(map(str, loc))}: {msg}" for loc, msg in errors))
        datums = []
        for d in fb.data:
            inputs = {k: torch.from_numpy(v.copy()) for k, v in d.inputs.items()}
            if "weights" in DATUM_LOSSES[fb.loss_fn].inputs and "weights" not in inputs:
                inputs["weights"] = torch.ones(len(d.tokens))
            datums.append(prim.Datum(torch.from_numpy(d.tokens.copy()), inputs))
        lps, metrics = st.forward_backward(datums, fb.loss_fn, fb.config, backward=backward)
        out = {"result": codec.encode_forward_backward_output([x.numpy() for x in lps], metrics), "proto": True}
        if backward:
            self.grads.add(req.target)
            self.step_loss[req.target] = self.step_loss.get(req.target, 0.0) + metrics["loss:sum"]
            out["model"] = {"dirty": True}
        return out

    def _forward(self, req) -> dict[str, Any]:
        return self._forward_backward(req, backward=False)

    def _optim_step(self, req) -> dict[str, Any]:
        st = self._model(req.target)
        m = st.optim_step(prim.AdamHyper(**json.loads(req.payload)))
        self.grads.discard(req.target)
        record = {"loss": self.step_loss.pop(req.target, 0.0), "grad_norm": m["grad_norm:mean"],
                  "lr": m["learning_rate:mean"]}
        return {"result": _json({"metrics": m}), "model": {"dirty": True, "steps": st.steps},
                "metric": (st.steps, record)}

    def _checkpoint_dir(self, model_id: str, kind: str, name: str) -> Path:
        return self.settings.runs_dir / "sessions" / self.session_id / model_id.replace(":", "-") / kind / name

    def _save_weights(self, req) -> dict[str, Any]:
        p, st = json.loads(req.payload), self._model(req.target)
        row = self.sessions.model(req.target, None)
        meta = {"base_model": row.base_model, "lora": row.spec.get("lora"), "model_id": req.target}
        path = st.save(self._checkpoint_dir(req.target, "weights", p["name"]), True, meta)
        ck = {"tenant": row.tenant, "model_id": req.target, "kind": "training", "name": p["name"],
              "tinker_path": p["tinker_path"], "path": str(path), "base_model": row.base_model,
              "lora_rank": row.lora_rank, "has_optimizer": True, "step": st.steps}
        clean = req.target not in self.grads  # unapplied gradients are not part of a saved state
        return {"result": _json({"path": p["tinker_path"], "type": "save_weights"}), "checkpoint": ck,
                "model": {"dirty": not clean, **({"last_state": "new"} if clean else {})}}

    def _save_weights_for_sampler(self, req) -> dict[str, Any]:
        p, st = json.loads(req.payload), self._model(req.target)
        if p.get("sampler_id"):  # save_weights_and_get_sampling_client: a snapshot held in memory
            self.samplers[p["sampler_id"]] = (st.sampler_model(), st.tok)
            while len(self.samplers) > MAX_SNAPSHOTS:
                self.samplers.popitem(last=False)
            return {"result": _json({"sampling_session_id": p["sampler_id"], "type": "save_weights_for_sampler"})}
        row = self.sessions.model(req.target, None)
        path = save_to(self._checkpoint_dir(req.target, "sampler_weights", p["name"]), st.sampler_model(), st.tok,
                       {"primitives": {"base_model": row.base_model, "model_id": req.target}})
        ck = {"tenant": row.tenant, "model_id": req.target, "kind": "sampler", "name": p["name"],
              "tinker_path": p["tinker_path"], "path": str(path), "base_model": row.base_model,
              "lora_rank": 0, "has_optimizer": False, "step": st.steps}
        return {"result": _json({"path": p["tinker_path"], "type": "save_weights_for_sampler"}), "checkpoint": ck}

    def _sampler(self, sampler_id: str):
        if sampler_id in self.samplers:
            self.samplers.move_to_end(sampler_id)
            return self.samplers[sampler_id]
        row = self.sessions.sampler(sampler_id, None)
        if row.model_id is not None and row.checkpoint_id is None:
            raise UserError(f"sampler {sampler_id} was a snapshot this worker no longer holds (evicted after "
                            f"{MAX_SNAPSHOTS} newer ones, or its worker restarted): save again")
        src = (Path(self.sessions.checkpoint_by_id(row.checkpoint_id).path) if row.checkpoint_id
               else self._dir(row.base_model))
        model, tok = prim.load_model(src, self.dtype, None)
        model.requires_grad_(False)
        self.samplers[sampler_id] = (model.eval(), tok)
        while len(self.samplers) > MAX_SNAPSHOTS:
            self.samplers.popitem(last=False)
        return self.samplers[sampler_id]

    def _sample(self, req) -> dict[str, Any]:
        return self.sample_batch([req])[0]

    def sample_batch(self, reqs: list) -> list[dict[str, Any]]:
        """Sample requests of one sampler with the same parameters (``batch_key``), as ONE generation:
        the SDK sends one prompt per request, and a GRPO step sends many at once."""
        from trainer.rollout import SamplingParams

        p = json.loads(reqs[0].payload)
        model, tok = self._sampler(reqs[0].target)
        vocab = model.config.get_text_config().vocab_size
        prompts = [json.loads(r.payload)["prompt"] for r in reqs]
        if any(not 0 <= t < vocab for pr in prompts for t in pr):
            raise UserError(f"prompt token ids must be in [0, {vocab})")
        stops = p.get("stop_ids")
        strings = tuple(p.get("stop_strings") or [])  # several tokens each is fine: the sampler matches text
        if strings and stops is None:
            stops = []  # a given `stop` replaces the end-of-sequence tokens, strings as ids do
        t = p["temperature"]
        params = SamplingParams(p["max_tokens"], t if t > 0 else 1.0, p["top_p"], greedy=t == 0, stop=strings)
        groups = prim.sample(model, tok, prompts, p["num_samples"], params, stops, p.get("seed"))
        out = []
        for pr, seqs in zip(prompts, groups):
            plp = prim.prompt_logprobs(model, pr) if p.get("prompt_logprobs") else None
            out.append({"result": codec.encode_sample_response([(s.tokens, s.logprobs, s.stopped) for s in seqs], plp),
                        "proto": True})
        return out

    # ------------------------------------------------------------------ release
    def park(self, owner: str) -> None:
        """Before giving the session up: save every changed model so the next worker resumes it exactly
        (each checkpoint row through Sessions, only while ``owner`` still holds the session)."""
        for m in self.sessions.models_of(self.session_id):
            st = self.models.get(m.id)
            if st is None or m.status != "ready" or not m.dirty:
                continue
            if m.id in self.grads:
                self.sessions.set_model(m.id, status="lost", error=(
                    "the session was released while this model had gradients not yet applied (forward_backward "
                    "without optim_step); continue from its last saved state"))
                continue
            meta = {"base_model": m.base_model, "lora": m.spec.get("lora"), "model_id": m.id}
            name = f"autosave-{st.steps:07d}"
            path = st.save(self._checkpoint_dir(m.id, "weights", name), True, meta)
            self.sessions.save_checkpoint(m.id, owner, {
                "tenant": m.tenant, "model_id": m.id, "kind": "training", "name": name,
                "tinker_path": ids.weights_path(m.id, "weights", name), "path": str(path), "base_model": m.base_model,
                "lora_rank": m.lora_rank, "has_optimizer": True, "step": st.steps})


def batch_key(req) -> str | None:
    """Sample requests with equal keys can run as one generation (None: this one runs alone — a seeded
    request draws its own random stream)."""
    if req.kind != "sample":
        return None
    p = json.loads(req.payload)
    if p.get("seed") is not None:
        return None
    return json.dumps([req.target, {k: v for k, v in p.items() if k != "prompt"}], sort_keys=True)


def _json(obj: dict) -> bytes:
    return json.dumps(obj).encode()


def _meta(path: Path) -> dict:
    from trainer.checkpoint import STATE_FILE

    return torch.load(path / STATE_FILE, weights_only=False).get("primitives", {})


def serve_session(session_id: str, settings: Settings | None = None, store: Store | None = None,
                  hard_exit: bool = False) -> str:
    """Hold ``session_id`` and run its requests until it ends or idles out. Returns why it stopped."""
    settings = settings or get_settings()
    sessions = Sessions(store or Store(settings.db_url))
    owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
    if sessions.claim(session_id, owner, settings.lease_s) is None:
        return "skipped"
    if settings.worker_threads:
        torch.set_num_threads(settings.worker_threads)
    lease = _Lease(sessions, session_id, owner, settings, hard_exit)
    lease.start()
    holder = Holder(settings, sessions, session_id)
    bell = Bell(sessions.store.url, f"session:{session_id}")  # the API rings it after queueing a request
    why = "released"
    try:
        holder.restore()
        why = _loop(sessions, holder, lease, bell, session_id, owner, settings)
        if why == "idle":  # the session goes on: the next request's worker must find every change
            holder.park(owner)
        return why
    except LeaseLost:
        why = "lease_lost"
        return why
    finally:
        lease.stopped.set()
        bell.close()
        if why != "lease_lost":
            try:
                sessions.release(session_id, owner)
            except Exception as e:  # the reaper hands it back once the lease runs out
                log.warning("could not release session %s: %s", session_id, e)


def _loop(sessions: Sessions, holder: Holder, lease: _Lease, bell: Bell, session_id: str, owner: str,
          settings: Settings) -> str:
    idle_since, delay = time.monotonic(), settings.tinker_poll_min_s
    while not lease.lost:
        req = sessions.next_request(session_id, owner)
        if req is None:
            if not lease.active:
                return "session_ended"
            if time.monotonic() - idle_since > settings.tinker_release_idle_s:
                return "idle"
            if bell.sock is not None:  # rung when a request is queued; otherwise a slow look now and then
                bell.wait(settings.tinker_poll_max_s)
                continue
            time.sleep(delay)  # no bell (taken): a short poll while the client is active, backing off after
            if time.monotonic() - idle_since > settings.tinker_hot_s:
                delay = min(delay * 2, settings.tinker_poll_max_s)
            continue
        key = batch_key(req)
        batch = [req] + (sessions.take_batch(session_id, owner, req, key, batch_key, MAX_BATCH - 1) if key else [])
        lease.current = (req, time.monotonic())
        outcomes = _run(holder, batch, session_id)
        lease.current = None
        for r, outcome in zip(batch, outcomes):
            if "error" in outcome and r.kind in ("create_model", "load_weights") and r.target not in holder.models:
                outcome["model"] = {"status": "failed", "error": outcome["error"]}
            sessions.finish_request(r, owner, **outcome)
            ring(sessions.store.url, f"request:{r.request_id}")  # the API waiting for it looks now
        idle_since, delay = time.monotonic(), settings.tinker_poll_min_s
    return "lease_lost"


def _run(holder: Holder, batch: list, session_id: str) -> list[dict[str, Any]]:
    """Each request's outcome: its result, or its error (a request fails with its reason; the session goes on)."""
    try:
        return holder.sample_batch(batch) if len(batch) > 1 else [holder.run(batch[0])]
    except (UserError, codec.WireError, ValueError) as e:
        return [{"error": redact_paths(str(e))[:4000], "category": "user"}] * len(batch)
    except Exception as e:
        log.error("session %s request %s failed: %s", session_id, batch[0].request_id, traceback.format_exc())
        return [{"error": redact_paths(f"{type(e).__name__}: {e}")[:4000], "category": "server"}] * len(batch)
