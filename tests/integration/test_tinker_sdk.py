"""The official Tinker SDK (the version the test extra pins) against a live `rlvr serve` + session worker,
on the bundled tiny model: capabilities, a cross-entropy loss that goes down, importance sampling that
makes exactly our GRPO update, save → load that resumes bit for bit, sampled log-probs equal to
compute_logprobs, tenancy, and the sessions listing.

Tolerances come from the two epsilons in play (see tests/tinker_server.py): float64 round-off between
two computations of the same update (``TOL``, as tests/test_update.py argues) and the float32 the SDK
carries log-probs and advantages in (``EPS32``)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from tests import exact, scripted_engine
from tests.tinker_server import Server, tokenizer

tinker = pytest.importorskip("tinker")
from tinker import types  # noqa: E402

pytestmark = pytest.mark.slow
TOL = torch.finfo(torch.float64).eps ** 0.5  # relative to the largest weight move
EPS32 = float(np.finfo(np.float32).eps)
BASE = "builtin:tiny-arith"


@pytest.fixture(scope="module")
def server(tmp_path_factory, models_dir):
    s = Server(tmp_path_factory.mktemp("tinker"), models_dir)
    try:
        yield s
    finally:
        s.close()


@pytest.fixture(scope="module")
def tok(models_dir):
    return tokenizer(models_dir)


def _sft_datum(tok, text: str) -> types.Datum:
    ids = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    return types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]),
                       loss_fn_inputs={"target_tokens": ids[1:], "weights": [1.0] * (len(ids) - 1)})


def test_capabilities_and_cross_entropy_goes_down(server, tok):
    with server.client() as sc:
        names = [m.model_name for m in tinker.RestClient(base_url=server.url, api_key="tml-" + server.keys["acme"])
                 .get_server_capabilities().result().supported_models]
        assert BASE in names
        tc = sc.create_lora_training_client(base_model=BASE, rank=8, seed=0).result(timeout=120)
        info = tc.get_info()
        assert info.is_lora and info.lora_rank == 8 and info.model_data.model_name == BASE
        batch = [_sft_datum(tok, f"{a}+{b}={a + b}") for a, b in ((3, 4), (12, 9), (30, 15), (7, 41))]
        losses = []
        for _ in range(6):
            fb = tc.forward_backward(batch, "cross_entropy")
            tc.optim_step(types.AdamParams(learning_rate=5e-3)).result(timeout=120)
            out = fb.result(timeout=120)
            losses.append(out.metrics["loss:sum"])
            assert len(out.loss_fn_outputs) == 4
            # the per-token log-probs come back, one per target, and sum (weights 1) to minus the loss
            total = sum(float(np.sum(o["logprobs"].to_numpy())) for o in out.loss_fn_outputs)
            assert total == pytest.approx(-out.metrics["loss:sum"], rel=1e-5)
        assert losses[-1] < 0.8 * losses[0], losses
        assert all(b < a for a, b in zip(losses, losses[1:])), losses
        sessions = server.http().get("/v1/sessions").json()["data"]
        model = next(m for s in sessions for m in s["models"] if m["id"] == tc.model_id)
        assert model["steps"] == 6 and model["last_loss"] == pytest.approx(losses[-1])
        detail = server.http().get(f"/v1/sessions/{tc.model_id.split(':')[0]}").json()
        curve = next(m for m in detail["models"] if m["id"] == tc.model_id)["loss_curve"]
        assert [p["loss"] for p in curve] == pytest.approx(losses)
        # tenancy: the other tenant sees no session, no model, no future
        other = server.http("other")
        assert all(s["id"] != detail["id"] for s in other.get("/v1/sessions").json()["data"])
        assert other.post("/api/v1/get_info", json={"model_id": tc.model_id}).status_code == 404
        assert other.get(f"/v1/sessions/{detail['id']}").status_code == 404


def test_save_then_load_resumes_bit_for_bit(server, tok):
    batch = [_sft_datum(tok, f"{a}-{b}={a - b}") for a, b in ((9, 4), (40, 15), (22, 22))]
    adam = types.AdamParams(learning_rate=2e-3, beta1=0.9, beta2=0.99, eps=1e-8)

    def steps(tc, n):
        out = []
        for _ in range(n):
            fb = tc.forward_backward(batch, "cross_entropy")
            tc.optim_step(adam).result(timeout=120)
            out.append(fb.result(timeout=120).metrics["loss:sum"])
        return out

    with server.client() as sc:
        tc = sc.create_lora_training_client(base_model=BASE, rank=0).result(timeout=120)  # rank 0: all weights
        steps(tc, 2)
        state = tc.save_state("mid").result(timeout=120).path
        first = steps(tc, 3)
        end_a = tc.save_weights_for_sampler("end-a").result(timeout=120).path
        resumed = sc.create_training_client_from_state_with_optimizer(state).result(timeout=120)
        second = steps(resumed, 3)
        end_b = resumed.save_weights_for_sampler("end-b").result(timeout=120).path
    assert second == first  # the same losses, exactly
    a = load_file(server.checkpoint_dir(end_a) / "model.safetensors")
    b = load_file(server.checkpoint_dir(end_b) / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # without the optimiser state the moments start over: a different trajectory
    with server.client() as sc:
        fresh = sc.create_training_client_from_state(state).result(timeout=120)
        assert steps(fresh, 3) != first


def test_sampled_logprobs_equal_compute_logprobs(server, tok):
    prompt = tok("17+25=", add_special_tokens=False)["input_ids"]
    with server.client() as sc:
        tc = sc.create_lora_training_client(base_model=BASE, rank=4, seed=1).result(timeout=120)
        tc.forward_backward([_sft_datum(tok, "17+25=42")], "cross_entropy")
        tc.optim_step(types.AdamParams(learning_rate=1e-2)).result(timeout=120)
        sampler = tc.save_weights_and_get_sampling_client().result(timeout=120)
        res = sampler.sample(types.ModelInput.from_ints(prompt), 4, types.SamplingParams(max_tokens=8, seed=3)
                             ).result(timeout=120)
        assert len(res.sequences) == 4
        for seq in res.sequences:
            toks, lps = list(seq.tokens), list(seq.logprobs)
            assert len(toks) == len(lps) >= 1
            again = sampler.compute_logprobs(types.ModelInput.from_ints(prompt + toks)).result(timeout=120)
            assert again[0] is None and len(again) == len(prompt) + len(toks)
            for got, want in zip(lps, again[len(prompt):]):
                # both are float64 results rounded once to float32 on the wire
                assert abs(got - want) <= EPS32 * abs(want) + TOL * 1e-6, (got, want)



def test_a_stop_string_of_several_tokens_ends_each_sample_there(server, tok):
    """SamplingParams.stop as a string spanning tokens: each sequence ends at the token completing it
    (kept, so tokens and log-probs still line up), with stop_reason "stop"."""
    prompt = tok("17+25=", add_special_tokens=False)["input_ids"]
    stop = "ed{"  # inside "\\boxed{…}": three tokens of the character-level model
    assert len(tok(stop, add_special_tokens=False)["input_ids"]) == 3
    with server.client() as sc:
        tc = sc.create_lora_training_client(base_model=BASE, rank=4, seed=1).result(timeout=120)
        sampler = tc.save_weights_and_get_sampling_client().result(timeout=120)
        plain = sampler.sample(types.ModelInput.from_ints(prompt), 4, types.SamplingParams(
            max_tokens=16, temperature=0)).result(timeout=120)
        cut = sampler.sample(types.ModelInput.from_ints(prompt), 4, types.SamplingParams(
            max_tokens=16, temperature=0, stop=stop)).result(timeout=120)
    full = tok.decode(list(plain.sequences[0].tokens), skip_special_tokens=True)
    assert stop in full  # greedy: every sequence is this one
    for seq in cut.sequences:
        text = tok.decode(list(seq.tokens), skip_special_tokens=True)
        assert text == full[: full.index(stop) + len(stop)]
        assert len(seq.logprobs) == len(seq.tokens) and seq.stop_reason == "stop"


# ------------------------------------------------------------------------------ importance sampling = GRPO
def _grpo_step(models_dir, tmp_path, monkeypatch):
    """Our GRPO step (trainer.online) on one scripted batch in float64: the batch, its advantages and
    loss mask, and the weights before and after."""
    from trainer import engines, online
    from trainer.config import JobSpec
    from trainer.distributed import Dist
    from trainer.loop import setup

    monkeypatch.setitem(engines.ENGINES, "hf", scripted_engine.ScriptedEngine)
    spec = JobSpec.model_validate({
        "model": {"path": BASE, "dtype": "float64"}, "data": {"eval_size": 8},
        "rollout": {"group_size": 4, "max_new_tokens": 12, "temperature": 1.0},
        "algo": {"kl_coef": 0.0, "entropy_coef": 0.0}, "optim": {"lr": 1e-3, "max_grad_norm": 1.0},
        "train": {"steps": 1, "prompts_per_step": 2, "eval_every": 0, "threads": 1, "seed": 3}})
    ctx = setup(spec, tmp_path / "grpo", models_dir, Dist(), log=lambda m: None).ctx
    start = {k: v.detach().clone() for k, v in ctx.policy.state_dict().items()}
    grp = online.sample_groups(ctx)
    prep = online._prepare(ctx, grp)
    online._update(ctx, grp, prep)
    return grp.ro, prep, start, {k: v.detach().clone() for k, v in ctx.policy.state_dict().items()}, spec


def _datums(ro, prep):
    """Each row as a Tinker datum: advantages A_i / n_tokens on its completion targets (GRPO's token-mean)."""
    n_tok = float(prep.mask.sum())
    rows = []
    for i in range(len(ro.texts)):
        p = ro.prompt_ids[i][ro.prompt_mask[i].bool()].tolist()
        k = int(ro.completion_mask[i].sum())
        full = p + ro.completion_ids[i, :k].tolist()
        adv = np.zeros(len(full) - 1)
        adv[len(p) - 1: len(p) - 1 + k] = float(prep.adv[i]) / n_tok * prep.mask[i, :k].double().numpy()
        rows.append((full, adv))
    return rows


def test_importance_sampling_makes_our_grpo_update(server, models_dir, tmp_path, monkeypatch):
    from trainer import primitives as prim

    exact.install()
    try:
        ro, prep, start, after_grpo, spec = _grpo_step(models_dir, tmp_path, monkeypatch)
        rows = _datums(ro, prep)
        adam = dict(lr=spec.optim.lr, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0,
                    grad_clip_norm=spec.optim.max_grad_norm)  # torch AdamW's defaults: what our trainer uses
        # ---- over HTTP: a forward for the sampling log-probs, then importance_sampling and one Adam step
        with server.client() as sc:
            tc = sc.create_lora_training_client(base_model=BASE, rank=0).result(timeout=120)
            plain = [types.Datum(model_input=types.ModelInput.from_ints(f[:-1]),
                                 loss_fn_inputs={"target_tokens": f[1:]}) for f, _ in rows]
            q = [o["logprobs"].to_numpy()
                 for o in tc.forward(plain, "cross_entropy").result(timeout=120).loss_fn_outputs]
            data = [types.Datum(model_input=types.ModelInput.from_ints(f[:-1]), loss_fn_inputs={
                "target_tokens": f[1:], "logprobs": q[i].astype(np.float32), "advantages": a.astype(np.float32)})
                for i, (f, a) in enumerate(rows)]
            tc.forward_backward(data, "importance_sampling").result(timeout=120)
            tc.optim_step(types.AdamParams(learning_rate=adam["lr"], beta1=adam["beta1"], beta2=adam["beta2"],
                                           eps=adam["eps"], grad_clip_norm=adam["grad_clip_norm"])).result(timeout=120)
            path = tc.save_weights_for_sampler("is-step").result(timeout=120).path
        http = load_file(server.checkpoint_dir(path) / "model.safetensors")

        def inproc(adv_of, lp_of):
            """The same primitives in this process, from the starting weights, in float64."""
            model, t = prim.load_model(models_dir / "tiny-arith", torch.float64, None)
            st = prim.TrainState(model, t)
            ds = [prim.Datum(torch.tensor(f[:-1]), {"target_tokens": torch.tensor(f[1:])}) for f, _ in rows]
            with torch.no_grad():
                exact_lp = prim.datum_logprobs(model, ds)
            for i, d in enumerate(ds):
                d.inputs.update(advantages=adv_of(i), logprobs=lp_of(i, exact_lp[i]))
            st.forward_backward(ds, "importance_sampling", {})
            grads = {k: p.grad.detach().clone() for k, p in model.named_parameters()}
            norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads.values()]))
            coef = min(1.0, adam["grad_clip_norm"] / (float(norm) + 1e-6))  # clip_grad_norm_'s scaling
            st.optim_step(prim.AdamHyper(**adam))
            return {k: v.detach().clone() for k, v in model.state_dict().items()}, {k: g * coef for k,
                                                                                    g in grads.items()}

        wire, g_wire = inproc(lambda i: torch.tensor(rows[i][1].astype(np.float32)), lambda i, lp: torch.tensor(q[i]))
        ours, g_ours = inproc(lambda i: torch.tensor(rows[i][1]), lambda i, lp: lp)  # float64 A, ratio exactly 1
    finally:
        exact.uninstall()

    def assert_same(a, b):
        move = max((a[k].double() - start[k].double()).abs().max().item() for k in a)
        assert move > 1e-4  # the update did something
        for k in a:
            diff = (a[k].double() - b[k].double()).abs().max().item()
            assert diff <= TOL * move, (k, diff, TOL * move)

    shared = [k for k in after_grpo if k in http]
    assert len(shared) >= len(http) - 1  # lm_head is tied to the embeddings
    # 1. the server computed exactly what the primitives compute on the same (float32-wire) inputs
    assert_same({k: http[k] for k in shared}, {k: wire[k] for k in shared})
    # 2. importance sampling with our advantages (A_i / n_tokens) at ratio 1 is our GRPO step
    assert_same({k: ours[k] for k in shared}, {k: after_grpo[k] for k in shared})
    # 3. so the HTTP update is our GRPO update up to what the wire's float32 does to the gradient: Adam's
    #    first step is lr * g / (|g| + eps), which moves by at most lr * |dg| / eps when g moves by dg
    move = max((after_grpo[k] - start[k]).abs().max().item() for k in shared)
    for k in shared:
        bound = adam["lr"] * (g_wire[k] - g_ours[k]).abs() / adam["eps"] + 3 * TOL * move
        assert bool(((http[k].double() - after_grpo[k]).abs() <= bound).all()), k


def test_an_idle_session_is_released_and_resumed_exactly(tmp_path_factory, models_dir, tok):
    """A worker gives up a session after RLVR_TINKER_RELEASE_IDLE_S without requests, saving changed
    models first; the next request brings a worker that restores them: the run goes on as if it had
    never stopped (same losses, bit for bit, as a session that never idled)."""
    import time

    s = Server(tmp_path_factory.mktemp("idle"), models_dir, extra_env={"RLVR_TINKER_RELEASE_IDLE_S": "1"})
    batch = [_sft_datum(tok, f"{a}+{b}={a + b}") for a, b in ((5, 6), (20, 13))]
    adam = types.AdamParams(learning_rate=2e-3, beta2=0.99, eps=1e-8)

    def step(tc):
        fb = tc.forward_backward(batch, "cross_entropy")
        tc.optim_step(adam).result(timeout=120)
        return fb.result(timeout=120).metrics["loss:sum"]

    try:
        with s.client() as sc:
            tc = sc.create_lora_training_client(base_model=BASE, rank=0).result(timeout=120)
            paused = [step(tc), step(tc)]
            sid = tc.model_id.split(":")[0]
            deadline = time.monotonic() + 60
            while s.http().get(f"/v1/sessions/{sid}").json()["worker"] != "idle":  # released, saved
                assert time.monotonic() < deadline, s.logs()
                time.sleep(0.5)
            paused += [step(tc), step(tc)]  # a new worker restores the model from the autosave
            detail = s.http().get(f"/v1/sessions/{sid}").json()
        with s.client() as sc:
            tc = sc.create_lora_training_client(base_model=BASE, rank=0).result(timeout=120)
            straight = [step(tc) for _ in range(4)]
        assert paused == straight
        assert any("autosave" in c["tinker_path"] for c in detail["models"][0]["checkpoints"])
    finally:
        s.close()
