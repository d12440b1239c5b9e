"""Any environment over HTTP (episodes.env http, trainer/envs/http.py) against a stand-in OpenEnv server
(tests/scripted_env_server.py): rewards from step and from verify, observations as loss-0 tokens, and every
way a server can misbehave — slow, crashing, malformed JSON, huge bodies, a wrong episode id, at capacity,
vanished — ending as infra_error, never a hang; the URL allow-list (SSRF) and the per-tenant cap."""
from __future__ import annotations

import json
import socket
import time

import pytest
import torch

from tests import scripted_env_server as stand_in
from trainer import episodes
from trainer.config import EpisodesConfig, JobSpec
from trainer.envs import http, net
from trainer.loop import train
from trainer.rollout import Rollout, SamplingParams, left_pad, left_pad_mask


@pytest.fixture(scope="module")
def server():
    s = stand_in.Server()
    yield s
    s.stop()


@pytest.fixture(autouse=True)
def allow_loopback(monkeypatch, tmp_path):
    monkeypatch.setenv(net.ALLOW_ENV, "127.0.0.0/8")
    monkeypatch.setenv(http.SLOTS_DIR_ENV, str(tmp_path / "slots"))
    stand_in.MODE.update(mode="ok", max_sessions=64)


class Scripted:
    """Tags format: the first turn sends the number in the prompt (``<code>N</code>``), after an observation the
    model says "done" and ends its reply."""

    def __init__(self, tok, model=None):
        self.tok, self.model = tok, model

    def generate(self, prompts, n, params):
        from trainer.rollout import render_prompt

        return self.generate_ids([self.tok(render_prompt(self.tok, p), add_special_tokens=False)["input_ids"]
                                  for p in prompts for _ in range(n)], 1, params)

    @torch.no_grad()
    def generate_ids(self, ids, n, params):
        rows = []
        for p in ids:
            text = self.tok.decode(p, skip_special_tokens=False)
            if "<output>" in text or "error:" in text:
                rows.append(self.tok("done", add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id])
            else:
                num = text.split("say ")[1].split()[0].strip(".")
                rows.append(self.tok(f"<code>{num}</code>", add_special_tokens=False)["input_ids"])
        T = max(map(len, rows))
        comp = torch.tensor([r + [0] * (T - len(r)) for r in rows])
        mask = torch.tensor([[1] * len(r) + [0] * (T - len(r)) for r in rows])
        ro = Rollout(left_pad(ids, 0), left_pad_mask(ids, 0), comp, mask,
                     self.tok.batch_decode(comp * mask, skip_special_tokens=True),
                     torch.zeros(len(rows), dtype=torch.bool), torch.full(comp.shape, -0.5) * mask)
        if self.model is not None:  # the sampling model's own log-probs, as a real sampler reports them
            from trainer.batch import forward

            ro.logprobs = forward(self.model, ro, params.temperature).logp.float() * mask
        return ro


@pytest.fixture(scope="module")
def tok(tiny_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_path)


@pytest.fixture(scope="module")
def tiny_model_path(models_dir_module):
    return models_dir_module / "tiny-arith"


@pytest.fixture(scope="module")
def models_dir_module():
    from pathlib import Path

    return Path(__file__).resolve().parents[1] / ".cache" / "models"


def _play(tok, url, prompts=("say 42", "say 7"), n=2, **env):
    cfg = EpisodesConfig(env={"type": "http", "url": url, "timeout_s": 2.0, **env}, max_turns=3,
                         max_episode_tokens=400, max_observation_tokens=200)
    tools = episodes.Tools.from_spec(cfg, 0)
    t0 = time.monotonic()
    eps, _ = episodes.run(Scripted(tok), tok, list(prompts), n, SamplingParams(32), cfg, tools)
    return eps, tools.env, time.monotonic() - t0


def test_rewards_observations_and_tokens(tok, server):
    eps, env, _ = _play(tok, server.url)
    assert [e.reward for e in eps] == [1.0, 1.0, 0.0, 0.0] and not any(e.excluded for e in eps)
    assert [[t["kind"] for t in e.turns] for e in eps] == [["model"]] * 2 + [["model", "observation", "model"]] * 2
    seven = eps[2]
    obs = seven.turns[1]
    assert "7" in obs["text"] and obs["outcome"] == "ok"
    _, a, b = obs["span"]
    assert set(seven.sample.loss[a:b]) == {0} and b > a  # the server's words carry no loss
    sc = episodes.env_scores(eps)
    assert sc.rewards == [1.0, 1.0, 0.0, 0.0] and sc.correct == [True, True, False, False]
    assert stand_in.MODE["sessions"] == 0  # every session closed


def test_the_reset_observation_is_in_the_prompt(tok, server):
    """A game whose task is only in its reset: the model reads it (in the user's message, before its first turn,
    no loss on it); ``show_reset: false`` leaves the prompt as the dataset wrote it."""
    stand_in.MODE["mode"] = "task_in_reset"
    eps, _, _ = _play(tok, server.url, prompts=("play",), observation_field="echoed_message")
    for e in eps:
        prompt = tok.decode(e.calls[0].prompt_ids, skip_special_tokens=True)
        assert "play\n\nsay 42 to win" in prompt and e.opening == "say 42 to win", prompt
        assert e.reward == 1.0 and e.messages[0]["content"] == "play\n\nsay 42 to win"
        assert e.calls[0].prompt_ids == e.samples[0].prompt_ids  # rendered once, before anything was sampled
    assert episodes.ledger_mismatches(eps) == 0
    stand_in.MODE["mode"] = "ok"
    eps, _, _ = _play(tok, server.url, prompts=("say 7",))
    shown = tok.decode(eps[0].samples[0].prompt_ids, skip_special_tokens=True)
    assert "ready" in shown and "message_length" in shown  # no observation_field: the fields as JSON
    eps, _, _ = _play(tok, server.url, prompts=("say 7",), show_reset=False)
    assert "ready" not in tok.decode(eps[0].samples[0].prompt_ids, skip_special_tokens=True)
    assert eps[0].opening == ""


def test_verify_gives_the_final_reward(tok, server):
    eps, _, _ = _play(tok, server.url, verify=True)
    assert [e.reward for e in eps] == [2.0, 2.0, 0.0, 0.0]


@pytest.mark.parametrize("mode", ["slow", "crash", "malformed", "huge", "capacity"])
def test_a_misbehaving_server_is_an_infra_error_never_a_hang(tok, server, mode):
    stand_in.MODE["mode"] = mode
    eps, env, took = _play(tok, server.url, max_body_bytes=1 << 20)
    assert all(e.excluded and e.finish == "infra_error" for e in eps)
    assert took < 2.0 * 3 + 5  # each call had timeout_s = 2 s; nothing waited longer
    assert env.errors and episodes.env_scores(eps).infra == [True] * 4
    m = episodes.metrics(eps, {})
    assert m["episodes/excluded_frac"] == 1.0


@pytest.mark.parametrize("mode", ["verify_slow", "verify_lies"])
def test_a_slow_or_lying_verify_is_an_infra_error(tok, server, mode):
    stand_in.MODE["mode"] = mode
    eps, env, took = _play(tok, server.url, verify=True)
    assert all(e.excluded and e.finish == "infra_error" for e in eps) and took < 2.0 * 4 + 5
    assert env.errors and episodes.env_scores(eps).infra == [True] * 4


def test_environment_failures_warn_the_job_once():
    from service.jobs.watch import Watch

    w = Watch()
    assert not [x for x in w.observe(1, {"episodes/outcome/infra_error": 0.0}) if x.reason == "environment_errors"]
    first = [x for x in w.observe(2, {"episodes/outcome/infra_error": 0.25}) if x.reason == "environment_errors"]
    assert len(first) == 1 and "25%" in first[0].message and not first[0].pause
    assert not [x for x in w.observe(3, {"episodes/outcome/infra_error": 0.5}) if x.reason == "environment_errors"]


def test_a_server_answering_for_another_episode_is_caught(tok, server):
    stand_in.MODE["mode"] = "wrong_id"
    eps, env, _ = _play(tok, server.url)
    assert all(e.excluded for e in eps) and any("not ours" in x for x in env.errors)


def test_a_refused_action_is_shown_to_the_model(tok, server):
    stand_in.MODE["mode"] = "refuse_action"
    eps, _, _ = _play(tok, server.url, action_field="text")
    assert not any(e.excluded for e in eps)
    obs = eps[0].turns[1]
    assert obs["outcome"] == "tool_error" and "refused the action" in obs["text"]


def test_a_vanished_server(tok):
    s = stand_in.Server()
    url = s.url
    s.stop()
    eps, env, took = _play(tok, url)
    assert all(e.excluded for e in eps) and took < 10 and env.errors


# -- where a URL may point -------------------------------------------------------------------------------
def _resolver(*ips):
    return lambda host, port, type=0: [(socket.AF_INET6 if ":" in ip else socket.AF_INET, type, 6, "", (ip, port))
                                       for ip in ips]


@pytest.mark.parametrize("ip", ["127.0.0.1", "169.254.169.254", "10.1.2.3", "172.16.0.1", "192.168.1.1",
                                "100.64.0.1", "0.0.0.0", "::1", "::ffff:127.0.0.1", "fe80::1", "fd00::1"])
def test_non_public_addresses_are_refused(ip):
    with pytest.raises(net.Refused, match="non-public"):
        net.check("http://env.example/", allow=[], resolve=_resolver(ip))


def test_every_resolved_address_is_checked_and_the_allow_list_opens_a_network():
    with pytest.raises(net.Refused, match="10.0.0.5"):  # one private answer among public ones is enough
        net.check("https://env.example/", allow=[], resolve=_resolver("93.184.216.34", "10.0.0.5"))
    t = net.check("https://env.example/base/", allow=[], resolve=_resolver("93.184.216.34"))
    assert (t.scheme, t.host, t.port, t.path, t.addresses) == ("https", "env.example", 443, "/base", ("93.184.216.34",))
    allowed = net.check("http://10.0.0.5:9000", allow=net.allowed_networks("10.0.0.0/24"),
                        resolve=_resolver("10.0.0.5"))
    assert allowed.addresses == ("10.0.0.5",) and allowed.port == 9000


def test_a_hung_resolver_is_refused_in_bounded_time(monkeypatch):
    monkeypatch.setattr(net, "RESOLVE_TIMEOUT_S", 0.3)
    t0 = time.monotonic()
    with pytest.raises(net.Refused, match="did not resolve within"):
        net.check("http://env.example/", allow=[], resolve=lambda *a, **k: time.sleep(2) or [])
    assert time.monotonic() - t0 < 1.5


@pytest.mark.parametrize("url, why", [("file:///etc/passwd", "scheme"), ("gopher://x/", "scheme"),
                                      ("http://user:pw@env.example/", "user info"), ("http:///nohost", "no host")])
def test_bad_urls_are_refused(url, why):
    with pytest.raises(net.Refused, match=why):
        net.check(url, allow=[], resolve=_resolver("93.184.216.34"))


def test_a_loopback_environment_is_refused_unless_the_operator_allows_it(monkeypatch, server):
    monkeypatch.setenv(net.ALLOW_ENV, "")
    cfg = EpisodesConfig(env={"type": "http", "url": server.url})
    with pytest.raises(net.Refused, match="non-public"):
        episodes.Tools.from_spec(cfg, 0)


def test_the_tenant_cap_holds_across_holders(tmp_path):
    a, b = http.Slots("tenant-a", 1, str(tmp_path)), http.Slots("tenant-a", 1, str(tmp_path))
    fd = a.acquire(1.0)
    t0 = time.monotonic()
    with pytest.raises(http.EnvFailed, match="cap"):
        b.acquire(0.2)
    assert time.monotonic() - t0 < 2
    c = http.Slots("tenant-b", 1, str(tmp_path))
    other = c.acquire(0.2)  # another tenant has its own slots
    a.release(fd)
    b.release(b.acquire(0.2))
    c.release(other)


@pytest.mark.redis
def test_the_tenant_cap_holds_across_machines_in_redis():
    """Two workers (two RedisSlots on one Redis, as on two machines) share one tenant's cap; another tenant has
    its own; a holder that died mid-call frees its slot when its hold lapses, not before."""
    import redis

    url = "redis://127.0.0.1:6379/15"
    tenant = f"t-{time.time_ns()}"
    a, b = http.RedisSlots(tenant, 2, url, hold_s=2.0), http.RedisSlots(tenant, 2, url, hold_s=2.0)
    try:
        x = a.acquire(0.5)
        b.acquire(0.5)  # y: never released, its worker dies holding it
        t0 = time.monotonic()
        with pytest.raises(http.EnvFailed, match="across workers"):
            b.acquire(0.2)
        assert time.monotonic() - t0 < 2
        other = http.RedisSlots(tenant + "-other", 1, url, hold_s=1.0)
        other.release(other.acquire(0.2))
        a.release(x)
        b.release(b.acquire(0.2))  # a's released slot is b's now
        # y's worker "died" holding it: the slot comes back once the hold lapses (2 s), not before
        z = a.acquire(0.2)
        with pytest.raises(http.EnvFailed):
            a.acquire(0.3)
        t0 = time.monotonic()
        w = b.acquire(5.0)
        assert 0.2 < time.monotonic() - t0 < 5.0
        a.release(z)
        b.release(w)
    finally:
        redis.Redis.from_url(url).delete(a.key)


def test_the_worker_shares_the_cap_through_a_redis_broker(monkeypatch, tmp_path):
    from service.jobs.runner import env_settings
    from service.settings import Settings

    embedded = env_settings(Settings(home=tmp_path), "acme")
    assert embedded["RLVR_ENV_TENANT"] == "acme" and "RLVR_ENV_SLOTS_REDIS" not in embedded  # one machine
    broker = env_settings(Settings(home=tmp_path, broker_url="redis://10.0.0.5:6379/0"), "acme")
    assert broker["RLVR_ENV_SLOTS_REDIS"] == "redis://10.0.0.5:6379/0"
    named = Settings(home=tmp_path, broker_url="redis://a/0", env_slots_redis="redis://b/3")
    assert env_settings(named, "acme")["RLVR_ENV_SLOTS_REDIS"] == "redis://b/3"
    monkeypatch.setenv(http.SLOTS_REDIS_ENV, "redis://127.0.0.1:6379/15")
    assert isinstance(http.slots("t", 2, 1.0), http.RedisSlots)
    monkeypatch.delenv(http.SLOTS_REDIS_ENV)
    assert isinstance(http.slots("t", 2, 1.0), http.Slots)


def test_a_job_trains_on_the_environment_end_to_end(tmp_path, server, monkeypatch, models_dir):
    from trainer import engines

    monkeypatch.setitem(engines.ENGINES, "hf", lambda model, tok, **_: Scripted(tok, model))
    data = tmp_path / "say.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"say {n}", "answer": str(n)}) + "\n" for n in (42, 7, 42, 9) * 4))
    held_out = tmp_path / "held-out.jsonl"
    held_out.write_text("".join(json.dumps({"prompt": f"say {n}", "answer": str(n)}) + "\n" for n in (42, 7)))
    spec = JobSpec.model_validate({
        "data": {"dataset": str(data), "eval_dataset": str(held_out), "eval_size": 2},
        "verifiers": [{"name": "math"}],
        "rollout": {"group_size": 2, "max_new_tokens": 16},
        "episodes": {"env": {"type": "http", "url": server.url}, "max_turns": 2, "max_episode_tokens": 200,
                     "eval_tools_off": False},
        "train": {"steps": 2, "prompts_per_step": 2, "eval_every": 0, "eval_samples": 2, "threads": 1}})
    result = train(spec, tmp_path / "run", models_dir=models_dir, log=lambda m: None)
    assert result.status == "succeeded", result
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "episodes/turns" in r]
    assert len(steps) == 2 and all(r["episodes/excluded_frac"] == 0 for r in steps)
    # the environment's reward: 1 for "say 42", 0 for "say 7" / "say 9" (half the data each)
    assert all(0 <= r["reward/mean"] <= 1 for r in steps) and any(r["reward/mean"] > 0 for r in steps)
    # held-out pass@k of an env-reward job: judged by the environment's reward, as its greedy answers are (the
    # verifiers, math here, would call "<code>42</code>done" wrong: pass@k 0 for every problem)
    evals = [r for r in rows if "eval/pass@2" in r]
    recs = [json.loads(x) for x in (tmp_path / "run" / "evals" / "step-0000000.jsonl").read_text().splitlines()]
    assert [(r["prompt"], r["samples"], r["samples_correct"]) for r in recs] == [("say 42", 2, 2), ("say 7", 2, 0)]
    assert evals and all(r["eval/pass@2"] == r["eval/accuracy"] == 0.5 for r in evals), evals


@pytest.mark.parametrize("url", ["http://127.0.0.1:9/", "http://169.254.169.254/latest/meta-data/",
                                 "http://[::1]:8000", "http://10.0.0.1/", "file:///etc/passwd"])
def test_a_job_naming_a_refused_url_is_a_422_naming_it(client, settings, url, monkeypatch):
    monkeypatch.setattr(settings, "env_allow", "")  # the operator allows nothing beyond public addresses
    r = client.post("/v1/jobs", json={"train": {"steps": 1},
                                      "episodes": {"env": {"type": "http", "url": url}}})
    assert r.status_code == 422, r.text
    errs = r.json()["detail"]
    # (pydantic names the union's branch: body.episodes.env.http.url for a URL it refuses by pattern)
    assert any(e["loc"][:3] == ["body", "episodes", "env"] and e["loc"][-1] == "url" for e in errs), errs
    assert client.get("/v1/jobs").json()["data"] == []  # nothing queued


def test_the_export_format_is_the_ledger_and_a_tinker_datum(tok, server):
    """Per call: prompt ids, completion ids, log-probs, mask; per sample: a datum whose weighted targets
    are exactly the sampled tokens, with the sampler's log-probs, and nothing of the server's."""
    eps, _, _ = _play(tok, server.url, prompts=("say 7",), n=1)
    e = eps[0]
    out = json.loads(json.dumps(episodes.export(e, advantage=0.5)))  # plain JSON
    assert len(out["calls"]) == 2 and all(c["mask"] == [1] * len(c["completion_ids"]) for c in out["calls"])
    d, = out["datums"]
    ins = d["loss_fn_inputs"]
    assert d["model_input"][1:] == ins["target_tokens"][:-1]  # next-token shift
    sampled = [t for c in out["calls"] for t in c["completion_ids"]]
    assert [t for t, w in zip(ins["target_tokens"], ins["weights"]) if w] == sampled
    assert ([lp for lp, w in zip(ins["logprobs"], ins["weights"]) if w]
            == [x for c in out["calls"] for x in c["logprobs"]])
    assert set(a for a, w in zip(ins["advantages"], ins["weights"]) if w) == {0.5}
    obs = e.turns[1]
    _, a, b = obs["span"]
    n = len(e.sample.prompt_ids)
    assert all(w == 0 for w in ins["weights"][n + a - 1:n + b - 1])  # the observation's tokens carry no weight
    # every call's prompt is the datum's tokens up to that call: what Tinker trains on is what was sampled
    tokens = d["model_input"] + ins["target_tokens"][-1:]
    assert all(tokens[:len(c["prompt_ids"]) + len(c["completion_ids"])] == c["prompt_ids"] + c["completion_ids"]
               for c in out["calls"])
