"""The training primitives' routes without a worker: the SDK's auth header, bad input refused with a 4xx
naming the field (protobuf bodies included), tenant scope, the per-tenant session limit, and what the
reaper does with a session whose worker died."""
from __future__ import annotations

import datetime as dt

import numpy as np
import pytest
from fastapi.testclient import TestClient

tinker = pytest.importorskip("tinker")
from tinker import types  # noqa: E402
from tinker.proto.request_conv import forward_backward_request_to_proto  # noqa: E402

ADMIN = "admin-key-for-tinker-tests"
BASE = "builtin:tiny-arith"


@pytest.fixture
def api(tmp_path, models_dir, monkeypatch):
    from service.app import create_app
    from service.settings import Settings
    from service.worker import tasks

    sent = []
    monkeypatch.setattr(tasks, "enqueue_session", lambda sid, settings: sent.append(sid))
    settings = Settings(home=tmp_path / "home", models=models_dir, auth=True, admin_key=ADMIN,
                        tinker_sessions_per_tenant=1, tinker_long_poll_s=0.2)
    app = create_app(settings, reaper=False)
    with TestClient(app) as c:
        keys = {}
        for tenant in ("alice", "bob"):
            keys[tenant] = c.post("/v1/keys", json={"tenant": tenant}, headers={"Authorization": f"Bearer {ADMIN}"}
                                  ).json()["key"]
        yield c, keys, sent, app


def sdk(key: str) -> dict[str, str]:
    return {"X-API-Key": "tml-" + key}


def _model(c, key) -> tuple[str, str]:
    sid = c.post("/api/v1/create_session", json={"tags": [], "sdk_version": "t"}, headers=sdk(key)).json()["session_id"]
    r = c.post("/api/v1/create_model", headers=sdk(key), json={
        "session_id": sid, "model_seq_id": 0, "base_model": BASE, "lora_config": {"rank": 4}})
    assert r.status_code == 200, r.text
    return sid, r.json()["model_id"]


def _fwdbwd(model_id: str, datums, loss_fn="cross_entropy", seq=1) -> bytes:
    req = types.ForwardBackwardRequest(forward_backward_input=types.ForwardBackwardInput(data=datums, loss_fn=loss_fn),
                                       model_id=model_id, seq_id=seq)
    return forward_backward_request_to_proto(req).SerializeToString()


def _datum(tokens, **inputs):
    return types.Datum(model_input=types.ModelInput.from_ints(tokens),
                       loss_fn_inputs={"target_tokens": tokens[1:] + [0], **inputs})


def test_the_sdk_key_header_and_its_prefix(api):
    c, keys, _, _ = api
    assert c.post("/api/v1/create_session", json={"tags": []}).status_code == 401
    assert c.post("/api/v1/create_session", json={"tags": []},
                  headers={"X-API-Key": "tml-rlvr_forged"}).status_code == 401
    assert c.post("/api/v1/create_session", json={"tags": []}, headers=sdk(keys["alice"])).status_code == 200
    assert c.post("/api/v1/create_session", json={"tags": []},
                  headers={"Authorization": f"Bearer {keys['alice']}"}).status_code == 200


def test_bad_input_is_a_4xx_naming_the_field(api, tmp_path):
    c, keys, sent, _ = api
    h = sdk(keys["alice"])
    sid = c.post("/api/v1/create_session", json={"tags": []}, headers=h).json()["session_id"]
    for base in ("no-such-model", str(tmp_path), "../models/tiny-arith", "builtin:nope"):
        r = c.post("/api/v1/create_model", headers=h, json={"session_id": sid, "model_seq_id": 0, "base_model": base})
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "base_model"], r.text
        assert str(tmp_path) not in r.text
    r = c.post("/api/v1/create_model", headers=h, json={"session_id": sid, "model_seq_id": 0, "base_model": BASE,
                                                       "lora_config": {"rank": -1}})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"][:3] == ["body", "lora_config", "rank"]
    sid, model_id = _model(c, keys["alice"])
    assert sent == [sid]  # the session's worker was asked for once
    fb = "/api/v1/forward_backward"
    hp = {**h, "Content-Type": "application/x-protobuf"}
    bad = [(b"\xff\x00garbage", []),
           (_fwdbwd(model_id, [_datum([1, 2, 10**6])]), ["data", 0, "model_input"]),
           (_fwdbwd(model_id, [_datum([1, 2, 3], weights=[1.0, 1.0])]), ["data", 0, "loss_fn_inputs", "weights"]),
           (_fwdbwd(model_id, [_datum([1, 2, 3], mask=np.ones(3, dtype=np.float32))]),
            ["data", 0, "loss_fn_inputs", "mask"]),
           (_fwdbwd(model_id, [types.Datum(model_input=types.ModelInput.from_ints([1, 2]), loss_fn_inputs={})]),
            ["data", 0, "loss_fn_inputs", "target_tokens"]),
           (_fwdbwd(model_id, [_datum([1, 2, 3], weights=[1.0, float("nan"), 1.0])]),
            ["data", 0, "loss_fn_inputs", "weights"])]
    for body, loc in bad:
        r = c.post(fb, content=body, headers=hp)
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", *loc], (loc, r.text)
    ok = c.post(fb, content=_fwdbwd(model_id, [_datum([1, 2, 3])]), headers=hp)
    assert ok.status_code == 200 and ok.json()["request_id"].startswith("req-")
    again = c.post(fb, content=_fwdbwd(model_id, [_datum([1, 2, 3])]), headers=hp)  # a resent request
    assert again.json()["request_id"] == ok.json()["request_id"]
    for params, loc in [({"learning_rate": -1}, "learning_rate"), ({"beta2": 1.0}, "beta2"), ({"eps": 0}, "eps")]:
        r = c.post("/api/v1/optim_step", headers=h, json={"model_id": model_id, "seq_id": 2, "adam_params": params})
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "adam_params", loc], r.text
    r = c.post("/api/v1/optim_step", headers=h, content=b'{"model_id": "%s", "seq_id": 2, "adam_params": '
               b'{"learning_rate": NaN}}' % model_id.encode(), )
    assert r.status_code == 422
    r = c.post("/api/v1/save_weights", headers=h, json={"model_id": model_id, "seq_id": 3, "path": "../../etc"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "path"]
    r = c.post("/api/v1/load_weights", headers=h, json={"session_id": sid, "model_seq_id": 1, "optimizer": True,
                                                       "path": "tinker://nope/weights/x"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "path"]
    samp = c.post("/api/v1/create_sampling_session", headers=h, json={
        "session_id": sid, "sampling_session_seq_id": 0, "base_model": BASE}).json()["sampling_session_id"]
    prompt = {"chunks": [{"type": "encoded_text", "tokens": [1, 2, 3]}]}
    for sp, loc in [({"top_k": 5}, ["sampling_params", "top_k"]),
                    ({"max_tokens": 0}, ["sampling_params", "max_tokens"]),
                    ({"temperature": -1}, ["sampling_params", "temperature"]),
                    ({"stop": "x" * 65}, ["sampling_params", "stop"]), ({"stop": [""]}, ["sampling_params", "stop"]),
                    ({"stop": ["a"] * 9}, ["sampling_params", "stop"])]:
        r = c.post("/api/v1/asample", headers=h, json={"sampling_session_id": samp, "seq_id": 1, "num_samples": 1,
                                                      "prompt": prompt, "sampling_params": sp})
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", *loc], r.text
    r = c.post("/api/v1/asample", headers=h, json={"sampling_session_id": samp, "seq_id": 1, "num_samples": 256,
                                                  "prompt": prompt, "sampling_params": {"max_tokens": 65536}})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "num_samples"]
    # a pending future: try_again after the long poll; an unknown one: 404
    r = c.post("/api/v1/retrieve_future", headers=h, json={"request_id": ok.json()["request_id"]})
    assert r.json()["type"] == "try_again"
    assert c.post("/api/v1/retrieve_future", headers=h, json={"request_id": "req-nope"}).status_code == 404


def test_tenants_see_only_their_own(api):
    c, keys, _, _ = api
    sid, model_id = _model(c, keys["alice"])
    fut = c.post("/api/v1/forward_backward", content=_fwdbwd(model_id, [_datum([1, 2, 3])]),
                 headers={**sdk(keys["alice"]), "Content-Type": "application/x-protobuf"}).json()["request_id"]
    bob = sdk(keys["bob"])
    assert c.post("/api/v1/retrieve_future", headers=bob, json={"request_id": fut}).status_code == 404
    assert c.post("/api/v1/get_info", headers=bob, json={"model_id": model_id}).status_code == 404
    assert c.post("/api/v1/session_heartbeat", headers=bob, json={"session_id": sid}).status_code == 404
    r = c.post("/api/v1/forward_backward", content=_fwdbwd(model_id, [_datum([1, 2, 3])], seq=2),
               headers={**bob, "Content-Type": "application/x-protobuf"})
    assert r.status_code == 404
    r = c.post("/api/v1/create_model", headers=bob, json={"session_id": sid, "model_seq_id": 5, "base_model": BASE})
    assert r.status_code == 404
    assert c.get("/v1/sessions", headers={"Authorization": f"Bearer {keys['bob']}"}).json()["data"] == []
    mine = c.get("/v1/sessions", headers={"Authorization": f"Bearer {keys['alice']}"}).json()["data"]
    assert [s["id"] for s in mine] == [sid] and "tenant" not in mine[0]
    admin = c.get("/v1/sessions", headers={"Authorization": f"Bearer {ADMIN}"}).json()["data"]
    assert admin[0]["tenant"] == "alice"


def test_per_tenant_session_limit(api):
    c, keys, _, _ = api
    _model(c, keys["alice"])  # holds (waits for) a worker: the limit is 1 here
    sid = c.post("/api/v1/create_session", json={"tags": []}, headers=sdk(keys["alice"])).json()["session_id"]
    r = c.post("/api/v1/create_model", headers=sdk(keys["alice"]), json={"session_id": sid, "model_seq_id": 0,
                                                                          "base_model": BASE})
    assert r.status_code == 429 and "RLVR_TINKER_SESSIONS_PER_TENANT" in r.text
    _model(c, keys["bob"])  # another tenant is not affected


def test_a_dead_workers_session_resumes_clean_models_and_fails_changed_ones(api):
    from service.store.tables import TinkerModel, TinkerRequest, TinkerSession
    from service.tinker.sessions import Sessions

    c, keys, _, app = api
    sid, clean = _model(c, keys["alice"])
    ss = Sessions(app.state.store)
    assert ss.claim(sid, "w1", 30) is not None
    with ss.Session.begin() as s:  # the worker created both models, one was trained without a save
        s.add(TinkerModel(id=f"{sid}:train:1", session_id=sid, tenant="alice", base_model=BASE, lora_rank=0, spec={},
                          status="ready", dirty=True, steps=3))
        s.get(TinkerModel, clean).status = "ready"
    hp = {**sdk(keys["alice"]), "Content-Type": "application/x-protobuf"}
    futs = [c.post("/api/v1/forward_backward", content=_fwdbwd(m, [_datum([1, 2, 3])], seq=5), headers=hp
                   ).json()["request_id"] for m in (clean, f"{sid}:train:1")]
    with ss.Session.begin() as s:  # the lease ran out: the worker died
        s.get(TinkerSession, sid).lease_expires_at = dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=1)
    assert ss.reap(idle_s=600, queue_timeout_s=900, retention_s=3600, requeue_after_s=120) == [sid]
    with ss.Session() as s:
        by_id = {r.request_id: r for r in s.query(TinkerRequest)}
        assert by_id[futs[0]].status == "queued"  # the clean model resumes from its last state
        assert by_id[futs[1]].status == "failed" and "no saved state" in by_id[futs[1]].error
        assert s.get(TinkerModel, f"{sid}:train:1").status == "lost"
        assert s.get(TinkerSession, sid).worker_state == "queued"
    r = c.post("/api/v1/retrieve_future", headers=sdk(keys["alice"]), json={"request_id": futs[1]}).json()
    assert r["category"] == "server" and "stopped" in r["error"]
    r = c.post("/api/v1/forward_backward", content=_fwdbwd(f"{sid}:train:1", [_datum([1, 2, 3])], seq=6), headers=hp)
    assert r.status_code == 410 and "lost" in r.text


def test_capabilities_list_served_models_only(api):
    c, keys, _, _ = api
    names = [m["model_name"] for m in c.get("/api/v1/get_server_capabilities", headers=sdk(keys["alice"])
                                            ).json()["supported_models"]]
    assert "builtin:tiny-arith" in names and not any(n.startswith("/") for n in names)
    cfg = c.post("/api/v1/client/config", headers=sdk(keys["alice"]), json={"sdk_version": "x"}).json()
    assert cfg["parallel_fwdbwd_chunks"] is False  # chunks in order: gradient accumulation is reproducible


def test_a_job_can_start_from_a_sessions_full_weights_of_its_own_tenant(api, tmp_path):
    from fastapi.exceptions import RequestValidationError

    from service.access.keys import Scope
    from service.jobs.specs import check_spec, resolve_spec
    from service.store.tables import TinkerCheckpoint
    from trainer.config import JobSpec

    c, keys, _, app = api
    store, settings = app.state.store, app.state.settings
    with store.Session.begin() as s:
        for name, kind, rank in (("full", "sampler", 0), ("adapter", "training", 8)):
            s.add(TinkerCheckpoint(tenant="alice", model_id="m", kind=kind, name=name, tinker_path=f"tinker://m/x/{name}",
                                   path=str(tmp_path / name), base_model=BASE, lora_rank=rank, has_optimizer=False))

    def spec(path):
        return JobSpec.model_validate({"name": "from-session", "model": {"path": path}})

    check_spec(spec("tinker://m/x/full"), settings, store, Scope("alice"))
    resolved = resolve_spec(spec("tinker://m/x/full"), store, "alice", settings)
    assert resolved.model.path == str(tmp_path / "full")
    for path, tenant, why in (("tinker://m/x/full", "bob", "not found"), ("tinker://m/x/adapter", "alice", "LoRA")):
        with pytest.raises(RequestValidationError) as e:
            check_spec(spec(path), settings, store, Scope(tenant))
        assert e.value.errors()[0]["loc"] == ("body", "model", "path") and why in e.value.errors()[0]["msg"]


def test_a_revoked_keys_long_poll_ends_with_401(tmp_path, models_dir, monkeypatch):
    """Issue 33 (streams re-check their key): retrieve_future waits up to RLVR_TINKER_LONG_POLL_S; a key
    revoked meanwhile gets a 401 within about a second, not the result (nor a try_again) at the end."""
    import threading
    import time

    from service.app import create_app
    from service.settings import Settings
    from service.worker import tasks

    monkeypatch.setattr(tasks, "enqueue_session", lambda sid, settings: None)
    app = create_app(Settings(home=tmp_path / "home", models=models_dir, auth=True, admin_key=ADMIN,
                              tinker_long_poll_s=8), reaper=False)
    with TestClient(app) as c:
        made = c.post("/v1/keys", json={"tenant": "alice"}, headers={"Authorization": f"Bearer {ADMIN}"}).json()
        _, model_id = _model(c, made["key"])
        fut = c.post("/api/v1/forward_backward", content=_fwdbwd(model_id, [_datum([1, 2, 3])]),
                     headers={**sdk(made["key"]), "Content-Type": "application/x-protobuf"}).json()["request_id"]
        out = {}

        def poll():
            t0 = time.monotonic()
            out["r"] = c.post("/api/v1/retrieve_future", headers=sdk(made["key"]), json={"request_id": fut})
            out["s"] = time.monotonic() - t0

        t = threading.Thread(target=poll)
        t.start()
        time.sleep(1.0)
        assert c.delete(f"/v1/keys/{made['id']}", headers={"Authorization": f"Bearer {ADMIN}"}).status_code == 200
        t.join(20)
    assert out["r"].status_code == 401 and out["s"] < 5, (out["r"].text, out["s"])


# -- issue 33, items 8-10: lengths against the model's context, 32-bit counters, one session cap everywhere ---
def test_lengths_past_the_models_context_are_refused_at_the_door(api):
    """The tiny model's context is 128 positions: forward_backward took datums of 129-65536 tokens and asample
    prompts (and prompt + max_tokens) past it, for the worker to fail on."""
    c, keys, _, app = api
    h = sdk(keys["alice"])
    hp = {**h, "Content-Type": "application/x-protobuf"}
    sid, model_id = _model(c, keys["alice"])
    r = c.post("/api/v1/forward_backward", content=_fwdbwd(model_id, [_datum([1] * 129)]), headers=hp)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "data", 0, "model_input"], r.text
    assert "context is 128" in r.text
    long = _fwdbwd(model_id, [_datum([1, 2, 3]), _datum([1] * 65_536)], seq=2)
    r = c.post("/api/v1/forward_backward", content=long, headers=hp)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "data", 1, "model_input"]
    assert c.post("/api/v1/forward_backward", content=_fwdbwd(model_id, [_datum([1] * 128)], seq=3),
                  headers=hp).status_code == 200
    samp = c.post("/api/v1/create_sampling_session", headers=h, json={
        "session_id": sid, "sampling_session_seq_id": 0, "base_model": BASE}).json()["sampling_session_id"]

    def sample(tokens, seq, chunks=1, **sp):
        prompt = {"chunks": [{"type": "encoded_text", "tokens": tokens}] * chunks}
        return c.post("/api/v1/asample", headers=h, json={"sampling_session_id": samp, "seq_id": seq,
                                                         "prompt": prompt, "sampling_params": sp})

    for r, loc in [(sample([1] * 128, 1), ["prompt"]), (sample([1] * 64, 2, chunks=1024), ["prompt"]),
                   (sample([1] * 100, 3, max_tokens=29), ["sampling_params", "max_tokens"]),
                   (sample([1] * 100, 4, max_tokens=65_536), ["sampling_params", "max_tokens"]),
                   (sample([1, 2, 10**6], 5, max_tokens=4), ["prompt"]),
                   (sample([1, -1], 6, max_tokens=4), ["prompt"])]:
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", *loc], r.text
    assert sample([1] * 100, 7, max_tokens=28).status_code == 200  # exactly fills the context
    assert sample([1] * 100, 8).status_code == 200  # the default max_tokens fits what is left


def test_seq_ids_fit_their_32_bit_column(api):
    """SampleIn.seq_id allowed up to 2**63-1 into a 32-bit column (a 500 on Postgres)."""
    c, keys, _, _ = api
    h = sdk(keys["alice"])
    sid, model_id = _model(c, keys["alice"])
    samp = c.post("/api/v1/create_sampling_session", headers=h, json={
        "session_id": sid, "sampling_session_seq_id": 0, "base_model": BASE}).json()["sampling_session_id"]
    prompt = {"chunks": [{"type": "encoded_text", "tokens": [1, 2]}]}
    for seq in (2**31, 2**63 - 1):
        r = c.post("/api/v1/asample", headers=h, json={"sampling_session_id": samp, "seq_id": seq, "prompt": prompt,
                                                      "sampling_params": {"max_tokens": 2}})
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "seq_id"], r.text
    for seq in (0, -1, -(2**31)):  # the wire's seq_id is an int32: only below 1 can be out of range
        r = c.post("/api/v1/forward_backward", content=_fwdbwd(model_id, [_datum([1, 2, 3])], seq=seq),
                   headers={**h, "Content-Type": "application/x-protobuf"})
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "seq_id"], r.text
    assert c.post("/api/v1/asample", headers=h, json={"sampling_session_id": samp, "seq_id": 2**31 - 1,
                                                     "prompt": prompt, "sampling_params": {"max_tokens": 2}}
                  ).status_code == 200


def test_every_route_that_requeues_a_session_keeps_the_tenant_cap(api):
    """The cap (1 here) was checked only when a model was created: forward_backward, optim_step, the save
    routes, load_weights and asample re-queued an idle session without it (4 queued under a cap of 2)."""
    from service.store.tables import TinkerCheckpoint, TinkerRequest, TinkerSession
    from service.tinker.sessions import Sessions

    c, keys, _, app = api
    h = sdk(keys["alice"])
    ss = Sessions(app.state.store)
    idle_sid, model = _model(c, keys["alice"])
    samp = c.post("/api/v1/create_sampling_session", headers=h, json={
        "session_id": idle_sid, "sampling_session_seq_id": 0, "base_model": BASE}).json()["sampling_session_id"]
    with ss.Session.begin() as s:  # its worker gave it up (idle), and it saved a state before
        s.get(TinkerSession, idle_sid).worker_state = "idle"
        s.add(TinkerCheckpoint(tenant="alice", model_id=model, kind="training", name="s1", base_model=BASE,
                               lora_rank=4, tinker_path=f"tinker://{model}/weights/s1", path="/nonexistent"))
    _model(c, keys["alice"])  # another session of hers now holds the one slot
    with ss.Session() as s:
        before = s.query(TinkerRequest).count()
    hp = {**h, "Content-Type": "application/x-protobuf"}
    attempts = {
        "forward_backward": lambda: c.post("/api/v1/forward_backward",
                                           content=_fwdbwd(model, [_datum([1, 2, 3])], seq=9),
                                           headers=hp),
        "optim_step": lambda: c.post("/api/v1/optim_step", headers=h, json={"model_id": model, "seq_id": 10}),
        "save_weights": lambda: c.post("/api/v1/save_weights", headers=h, json={"model_id": model, "seq_id": 11}),
        "save_weights_for_sampler": lambda: c.post("/api/v1/save_weights_for_sampler", headers=h, json={
            "model_id": model, "seq_id": 12, "sampling_session_seq_id": 7}),
        "load_weights": lambda: c.post("/api/v1/load_weights", headers=h, json={
            "model_id": model, "seq_id": 13, "path": f"tinker://{model}/weights/s1", "optimizer": True}),
        "load_weights (new model)": lambda: c.post("/api/v1/load_weights", headers=h, json={
            "session_id": idle_sid, "model_seq_id": 5, "path": f"tinker://{model}/weights/s1", "optimizer": False}),
        "asample": lambda: c.post("/api/v1/asample", headers=h, json={
            "sampling_session_id": samp, "seq_id": 14, "prompt": {"chunks": [{"type": "encoded_text", "tokens": [1]}]},
            "sampling_params": {"max_tokens": 2}}),
        "create_model": lambda: c.post("/api/v1/create_model", headers=h, json={
            "session_id": idle_sid, "model_seq_id": 3, "base_model": BASE}),
    }
    for name, attempt in attempts.items():
        r = attempt()
        assert r.status_code == 429 and "RLVR_TINKER_SESSIONS_PER_TENANT" in r.text, (name, r.text)
        assert r.headers["retry-after"] == "5"
    with ss.Session() as s:
        assert s.get(TinkerSession, idle_sid).worker_state == "idle"  # never re-queued
        assert s.query(TinkerRequest).count() == before  # and nothing stored: no request, model or sampler
        assert {m.id for m in ss.models_of(idle_sid)} == {model}
    assert c.get(f"/api/v1/samplers/{idle_sid}:sample:7", headers=h).status_code == 404


def test_the_loss_its_config_and_its_inputs_are_checked_at_the_door(api):
    """A typo in loss_fn was a 200 and a failed future after a worker restored the session: now a 422 naming
    the field, before anything is queued; cispo and dro are served."""
    c, keys, sent, _ = api
    sid, model_id = _model(c, keys["alice"])
    hp = {**sdk(keys["alice"]), "Content-Type": "application/x-protobuf"}
    before = len(sent)

    def body(loss_fn="ppo", config=None, **inputs):
        req = types.ForwardBackwardRequest(forward_backward_input=types.ForwardBackwardInput(
            data=[_datum([1, 2, 3], **inputs)], loss_fn="ppo", loss_fn_config=config), model_id=model_id, seq_id=1)
        msg = forward_backward_request_to_proto(req)
        msg.loss_fn = loss_fn  # the SDK's types refuse an unknown name; a raw client does not
        return msg.SerializeToString()

    lp, adv = np.zeros(3, dtype=np.float32), np.ones(3, dtype=np.float32)
    for content, loc in [(body("ppo2", logprobs=lp, advantages=adv), ["loss_fn"]),
                         (body(config={"clip": 0.5}, logprobs=lp, advantages=adv), ["loss_fn_config", "clip"]),
                         (body(logprobs=lp), ["data", 0, "loss_fn_inputs", "advantages"]),
                         (body("dro", config={"clip_low_threshold": 0.5}, logprobs=lp, advantages=adv),
                          ["loss_fn_config", "clip_low_threshold"])]:
        r = c.post("/api/v1/forward_backward", content=content, headers=hp)
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", *loc], (loc, r.text)
    assert len(sent) == before  # nothing was queued for the session's worker
    for seq, loss in enumerate(("cispo", "dro"), start=2):
        ok = body(loss, logprobs=lp, advantages=adv)
        msg = forward_backward_request_to_proto(types.ForwardBackwardRequest(
            forward_backward_input=types.ForwardBackwardInput(data=[_datum([1, 2, 3], logprobs=lp, advantages=adv)],
                                                              loss_fn=loss), model_id=model_id, seq_id=seq))
        r = c.post("/api/v1/forward_backward", content=msg.SerializeToString(), headers=hp)
        assert r.status_code == 200 and r.json()["request_id"].startswith("req-"), (ok, r.text)


def test_checkpoint_rows_are_written_through_sessions_only_by_the_holder(api):
    """The worker parks a changed model through Sessions.save_checkpoint: one upsert by tinker:// path, the
    model's last_state pointing at it, and nothing written by a worker that no longer holds the session."""
    from service.access.keys import Scope
    from service.store.jobs import LeaseLost
    from service.tinker import ids
    from service.tinker.sessions import Sessions

    c, keys, _, app = api
    sid, model_id = _model(c, keys["alice"])
    ss = Sessions(app.state.store)
    assert ss.claim(sid, "worker-a", 60) is not None
    row = {"tenant": "alice", "model_id": model_id, "kind": "training", "name": "autosave-0000001",
           "tinker_path": ids.weights_path(model_id, "weights", "autosave-0000001"), "path": "/x", "base_model": BASE,
           "lora_rank": 4, "has_optimizer": True, "step": 1}
    with pytest.raises(LeaseLost):
        ss.save_checkpoint(model_id, "worker-b", row)
    first = ss.save_checkpoint(model_id, "worker-a", row)
    again = ss.save_checkpoint(model_id, "worker-a", {**row, "step": 2})  # the same name again replaces it
    assert ss.checkpoint(row["tinker_path"], None).step == 2 and len(ss.checkpoints(Scope("alice"))) == 1 and first
    m = ss.model(model_id, None)
    assert m.last_state == again and m.dirty is False
