"""Multi-turn episodes (spec.episodes, trainer/episodes.py): what the trainer trains on is exactly what was
sampled, tool output carries no gradient, history rewrites fork instead of re-tokenising, sandbox deaths are
left out rather than scored 0, and a run repeats itself. Scripted tool-using turns (tests/scripted_tools.py)
on the bundled tiny model; tool calls run in the real sandbox."""
from __future__ import annotations

import json

import pytest
import torch

from tests import scripted_tools
from trainer import algos, engines, episodes, online
from trainer.config import EpisodesConfig, JobSpec
from trainer.loop import train
from trainer.rollout import SamplingParams


@pytest.fixture
def model_tok(tiny_model):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(tiny_model), AutoTokenizer.from_pretrained(tiny_model)


@pytest.fixture
def scripted(monkeypatch):
    monkeypatch.setitem(engines.ENGINES, "hf", scripted_tools.ScriptedToolEngine)


def _play(model_tok, prompts=("12*34", "7+5", "81-9"), n=4, max_new=48, **cfg):
    model, tok = model_tok
    c = EpisodesConfig(**cfg)
    return episodes.run(scripted_tools.ScriptedToolEngine(model, tok), tok, list(prompts), n, SamplingParams(max_new),
                        c, episodes.Tools.from_spec(c, 0)), tok


def _spec(**over) -> JobSpec:
    base = {"data": {"eval_size": 4}, "rollout": {"group_size": 4, "max_new_tokens": 48},
            "episodes": {"max_episode_tokens": 200, "eval_tools_off": False},
            "verifiers": [{"name": "math", "config": {"allow_unevaluated": False}}],
            "train": {"steps": 2, "prompts_per_step": 2, "eval_every": 0, "threads": 1}}
    for k, v in over.items():
        base[k] = {**base.get(k, {}), **v} if isinstance(v, dict) else v
    return JobSpec.model_validate(base)


def test_the_trainer_trains_on_exactly_the_sampled_ids(model_tok):
    """Every engine call's prompt is the ledger so far, and the row the trainer trains on is the calls'
    sampled ids with the observations between them: nothing decoded and re-encoded."""
    (eps, _), tok = _play(model_tok)
    assert {e.finish for e in eps} == {"answer"} and any(e.tool_calls for e in eps)
    ro, row_ep = episodes.to_rollout(eps, tok.pad_token_id)
    assert row_ep == list(range(len(eps)))  # tags: no forks, one row per episode
    for k, e in enumerate(eps):
        row = ro.completion_ids[k][ro.completion_mask[k].bool()].tolist()
        prompt = ro.prompt_ids[k][ro.prompt_mask[k].bool()].tolist()
        rebuilt, obs = [], [t for t in e.turns if t["kind"] == "observation"]
        for i, c in enumerate(e.calls):
            assert c.prompt_ids == prompt + rebuilt  # each call saw exactly the ledger so far
            rebuilt += c.completion_ids
            if i < len(obs):
                a, b = obs[i]["span"][1:]
                rebuilt += row[a:b]
        assert rebuilt == row
        engine = [lp for c in e.calls for lp in c.logprobs]
        assert ro.logprobs[k][ro.trained[k].bool()].tolist() == engine  # the sampler's log-probs, in place
    assert episodes.ledger_mismatches(eps) == 0


def test_weighted_tokens_are_the_sampled_tokens(model_tok):
    (eps, _), tok = _play(model_tok)
    ro, _ = episodes.to_rollout(eps, tok.pad_token_id)
    sampled = sum(len(c.completion_ids) for e in eps for c in e.calls)
    observed = sum(b - a for e in eps for t in e.turns if t["kind"] == "observation" for a, b in [t["span"][1:]])
    assert observed > 0
    assert int(ro.trained.sum()) == sampled and int(ro.completion_mask.sum()) == sampled + observed


def test_a_ledger_that_drifted_is_counted(model_tok):
    """The check can fail: one sampled token changed after the fact is a mismatch, and fails a job."""
    (eps, _), _ = _play(model_tok)
    e = next(e for e in eps if e.tool_calls)
    e.sample.ids[0] += 1
    assert episodes.ledger_mismatches(eps) >= 1
    with pytest.raises(RuntimeError, match="not the tokens trained on"):
        episodes.check_drift({"episodes/token_mismatches": 1}, _spec())


def test_observation_tokens_get_no_gradient(tmp_path, models_dir, scripted, monkeypatch):
    """On the gradient itself: d loss / d log p(token) is exactly 0 at every tool-output token the policy
    attends to, and not 0 at the tokens it wrote (the real update path, one step)."""
    seen = []
    real = online.forward

    def keep(model, part, *a, **k):
        fwd = real(model, part, *a, **k)
        if fwd.logp.requires_grad:
            fwd.logp.retain_grad()
            seen.append((part, fwd.logp))
        return fwd

    monkeypatch.setattr(online, "forward", keep)
    train(_spec(train={"steps": 1}), tmp_path / "run", models_dir=models_dir, log=lambda m: None)
    assert seen
    obs_tokens = 0
    for part, logp in seen:
        grad = logp.grad
        observation = part.completion_mask.bool() & ~part.trained.bool()
        obs_tokens += int(observation.sum())
        assert torch.all(grad[observation] == 0)
        assert grad[part.trained.bool()].abs().sum() > 0
    assert obs_tokens > 0


def test_a_stop_inside_a_token_does_not_double_the_observation_tag(model_tok, monkeypatch):
    """SmolLM2 has one token for ``><``: a turn stopped at ``</code>`` can end in a stray ``<``. The
    observation then opens with ``output>``, so the episode reads ``</code><output>``; the sampled tokens
    are kept as sampled and the ledger stays exact."""
    monkeypatch.setattr(scripted_tools, "STRAY", "<")
    (eps, _), tok = _play(model_tok)
    called = [e for e in eps if e.tool_calls]
    assert called and {e.finish for e in eps} == {"answer"}
    for e in called:
        text = tok.decode(e.sample.ids, skip_special_tokens=True)
        assert "</code><output>\n" in text and "<<" not in text, text
        obs = next(t for t in e.turns if t["kind"] == "observation")
        assert obs["text"].startswith("output>\n")
        assert e.turns[-1]["kind"] == "model" and e.turns[-1]["text"].startswith("\\boxed{")
    assert episodes.ledger_mismatches(eps) == 0
    monkeypatch.setattr(scripted_tools, "STRAY", " ")  # whitespace past the call: the head is kept whole
    (eps, _), tok = _play(model_tok)
    text = tok.decode(next(e for e in eps if e.tool_calls).sample.ids, skip_special_tokens=True)
    assert "</code> <output>\n" in text


def test_a_history_rewrite_makes_exactly_one_fork(model_tok, monkeypatch):
    """A chat template that renders an earlier turn differently (Qwen3 drops its <think>) makes the next
    call's prompt no longer extend the ledger: a new sample starts there — counted, never re-tokenised."""
    model, tok = model_tok
    monkeypatch.setattr(scripted_tools, "CHAT", True)
    tok.chat_template = scripted_tools.REWRITING_TEMPLATE
    (eps, timings), _ = _play((model, tok), prompts=("12*34",), n=2, max_new=120, format="chat")
    for e in eps:
        assert e.forks == 1 and len(e.samples) == 2 and e.finish == "answer", e.turns
        assert "<think>" not in tok.decode(e.samples[1].prompt_ids)  # the re-rendered history
        assert e.samples[1].prompt_ids[: len(e.samples[0].prompt_ids)] == e.samples[0].prompt_ids
    ro, row_ep = episodes.to_rollout(eps, tok.pad_token_id)
    assert row_ep == [0, 0, 1, 1]
    assert int(ro.trained.sum()) == sum(len(c.completion_ids) for e in eps for c in e.calls)
    assert episodes.ledger_mismatches(eps) == 0
    assert episodes.metrics(eps, timings)["episodes/forks"] == 1.0


def test_a_forked_episode_trains_with_its_advantage_on_every_row(tmp_path, models_dir, scripted, monkeypatch):
    monkeypatch.setattr(scripted_tools, "CHAT", True)
    from transformers import AutoTokenizer

    real = AutoTokenizer.from_pretrained

    def rewriting(*a, **k):
        tok = real(*a, **k)
        tok.chat_template = scripted_tools.REWRITING_TEMPLATE
        return tok

    monkeypatch.setattr(AutoTokenizer, "from_pretrained", rewriting)
    got = []
    real_prepare = online._prepare
    monkeypatch.setattr(online, "_prepare", lambda ctx, grp: got.append((grp, real_prepare(ctx, grp))) or got[-1][1])
    result = train(_spec(episodes={"format": "chat"}, rollout={"max_new_tokens": 120}, train={"steps": 1}),
                   tmp_path / "run", models_dir=models_dir,
                   log=lambda m: None)
    assert result.status == "succeeded"
    grp, p = got[0]
    assert grp.row_episode is not None and len(grp.row_episode) > len(grp.rewards)
    want = algos.ADVANTAGES["grpo"](grp.rewards_global, 4, grp.valid_global)
    per_row = p.adv if p.adv.dim() == 1 else p.adv[:, 0]
    assert torch.equal(per_row, want[grp.row_episode])
    metrics = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    step, = [m for m in metrics if "episodes/forks" in m]
    assert step["episodes/forks"] == step["episodes/tool_calls"] > 0  # each call re-rendered the history once


def _killing(monkeypatch, share: float):
    """Make ``share`` of the sessions' tool calls die in the sandbox (both tries): chosen by the session's
    seed and the call, so the same calls die in every run."""
    import hashlib

    from sandbox import session
    from sandbox.types import Result, Status

    real = session.run_sessions
    killed = []

    def run(calls, limits):
        out = real(calls, limits)
        for i, (s, code) in enumerate(calls):
            h = int(hashlib.sha1(f"{s.seed}|{code}".encode()).hexdigest(), 16)
            if h % 1000 < share * 1000:
                out[i] = Result(Status.sandbox_error, reason="killed by the test")
                killed.append((s.seed, code))
        return out

    monkeypatch.setattr(session, "run_sessions", run)
    return killed


def test_killed_tool_calls_leave_the_surviving_episodes_advantages_as_a_fault_free_run(
        tmp_path, models_dir, scripted, monkeypatch):
    """10% of tool calls die in the sandbox: their episodes are retried once, then left out of their group's
    statistics and of the loss (never scored 0); the surviving episodes' advantages are exactly those a
    fault-free run's same episodes get when the baseline is taken over the survivors."""
    got = {}

    def capture(name):
        real_prepare = online._prepare

        def prep(ctx, grp):
            p = real_prepare(ctx, grp)
            got.setdefault(name, []).append((grp, p))
            return p
        return prep

    spec = _spec(train={"steps": 2, "prompts_per_step": 4}, rollout={"group_size": 6})
    monkeypatch.setattr(online, "_prepare", capture("clean"))
    train(spec, tmp_path / "clean", models_dir=models_dir, log=lambda m: None)
    killed = _killing(monkeypatch, 0.10)
    monkeypatch.setattr(online, "_prepare", capture("faulty"))
    train(spec, tmp_path / "faulty", models_dir=models_dir, log=lambda m: None)
    assert killed  # some calls died (each twice: the retry died too)
    left_out = 0
    for (clean, pc), (faulty, pf) in zip(got["clean"], got["faulty"]):
        survivors = faulty.valid_global
        left_out += int((~survivors).sum())
        assert torch.equal(clean.rewards_global[survivors], faulty.rewards_global[survivors])
        want = algos.ADVANTAGES["grpo"](clean.rewards_global, 6, survivors)
        assert torch.allclose(pf.adv[survivors], want[survivors], rtol=0, atol=0)
        assert torch.all(pf.mask[~survivors] == 0)  # no loss on the dead episodes' tokens
    assert left_out > 0
    rows = [json.loads(x) for x in (tmp_path / "faulty" / "metrics.jsonl").read_text().splitlines()]
    assert any(r.get("episodes/outcome/infra_error", 0) > 0 for r in rows)
    assert all(r.get("reward/infra_fail_frac", 0) == 0 for r in rows)  # the verifiers never failed


def test_the_same_seed_gives_the_same_metrics(tmp_path, models_dir, scripted):
    spec = _spec()
    for name in ("a", "b"):
        train(spec, tmp_path / name, models_dir=models_dir, log=lambda m: None)
    timed = ("time/", "tokens_per_s", "_s", "tool_time_frac", "ts", "wall")

    def rows(name):
        out = [json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in r.items() if not any(t in k for t in timed)} for r in out]

    a, b = rows("a"), rows("b")
    assert a == b and any("episodes/tool_calls" in r for r in a)


def test_the_rollout_browser_shows_episodes_turn_by_turn(tmp_path, models_dir, scripted):
    groups = []
    train(_spec(train={"steps": 1}), tmp_path / "run", models_dir=models_dir,
          on_rollouts=lambda step, g: groups.extend(g), log=lambda m: None)
    comps = [c for g in groups for c in g["completions"]]
    tooled = [c for c in comps if c["tool_calls"]]
    assert tooled
    for c in tooled:
        kinds = [t["kind"] for t in c["turns"]]
        assert kinds[:3] == ["model", "observation", "model"]
        obs = c["turns"][1]
        assert obs["outcome"] == "ok" and obs["tool_s"] > 0 and "<output>" in obs["text"]
        a, b = obs["tokens"]
        assert c["trained"][a:b] == [0] * (b - a) and c["trained"][:a] == [1] * a
        assert "advantage" in c and "<output>" not in c["text"]  # the verifiers read what the model wrote


def test_stored_episodes_export_their_ledger_over_the_api(tmp_path, models_dir, scripted, client, store):
    """episodes.keep_tokens: the stored groups keep each episode's ledger; /rollouts/export gives every one as
    per-call ids and log-probs and a Tinker datum whose weighted targets are exactly the sampled tokens, with
    the advantage the update gave it. The browser's list leaves the ledger out; a job without it is a 404."""
    groups = []
    train(_spec(train={"steps": 1}, episodes={"keep_tokens": True}), tmp_path / "run", models_dir=models_dir,
          on_rollouts=lambda step, g: groups.extend(g), log=lambda m: None)
    job = client.post("/v1/jobs", json={"name": "ex", "train": {"steps": 1}}).json()["id"]
    assert client.get(f"/v1/jobs/{job}/rollouts/export").status_code == 404  # nothing stored yet
    store.put_rollouts(job, 0, groups)
    listed = client.get(f"/v1/jobs/{job}/rollouts").json()
    assert listed and not any("ledger" in c for g in listed[0]["groups"] for c in g["completions"])
    r = client.get(f"/v1/jobs/{job}/rollouts/export", params={"step": 0})
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/x-ndjson")
    lines = [json.loads(x) for x in r.text.splitlines()]
    comps = [c for g in groups for c in g["completions"]]
    assert len(lines) == len(comps) and any(x["calls"][1:] for x in lines)  # some episode made a second call
    for x, c in zip(lines, comps):
        assert x["advantage"] == c["advantage"] and x["reward"] == c["reward"] and x["trained"]
        ins = x["datums"][0]["loss_fn_inputs"]
        sampled = [t for k in x["calls"] for t in k["completion_ids"]]
        assert [t for t, w in zip(ins["target_tokens"], ins["weights"]) if w] == sampled
        assert [lp for lp, w in zip(ins["logprobs"], ins["weights"]) if w] == [v for k in x["calls"]
                                                                              for v in k["logprobs"]]
        assert {a for a, w in zip(ins["advantages"], ins["weights"]) if w} <= {c["advantage"]}
        assert all(k["version"] == 0 for k in x["calls"])
    other = client.post("/v1/jobs", json={"name": "no-ledger", "train": {"steps": 1}}).json()["id"]
    store.put_rollouts(other, 0, [{**g, "completions": [{k: v for k, v in c.items() if k != "ledger"}
                                                        for c in g["completions"]]} for g in groups])
    r = client.get(f"/v1/jobs/{other}/rollouts/export")
    assert r.status_code == 404 and "episodes.keep_tokens" in r.json()["detail"]
    assert client.get(f"/v1/jobs/{job}/rollouts/export", params={"step": -1}).status_code == 422
    assert client.get(f"/v1/jobs/{job}/rollouts/export", params={"limit": 101}).status_code == 422  # bounded reply


def test_held_out_episodes_are_scored_with_and_without_the_tool(tmp_path, models_dir, scripted):
    result = train(_spec(train={"steps": 1}, episodes={"eval_tools_off": True}), tmp_path / "run",
                   models_dir=models_dir, log=lambda m: None)
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    first = rows[0]
    assert {"eval/accuracy", "eval/tool_calls", "eval/tools_off/accuracy"} <= set(first)
    assert first["eval/tool_calls"] > 0
    assert first["eval/accuracy"] > first["eval/tools_off/accuracy"]  # the scripted policy needs its tool
    records = [json.loads(x) for x in (tmp_path / "run" / "evals" / "step-0000000.jsonl").read_text().splitlines()]
    assert all("turns" in r and "tools_off" in r for r in records)
    assert result.status == "succeeded"


@pytest.mark.parametrize("over,field", [
    ({"algorithm": "ppo"}, "algorithm 'ppo'"),
    ({"rollout": {"engine": "hf-generate"}}, "hf-generate"),
    ({"algo": {"kl_coef": 0.1, "kl_in": "reward"}}, "kl_in reward"),
    ({"episodes": {"max_observation_tokens": 300, "max_episode_tokens": 200}}, "max_observation_tokens"),
    ({"episodes": {"observation": "<out>no placeholder</out>"}}, "{output}"),
])
def test_specs_episodes_cannot_run_are_refused(over, field):
    with pytest.raises(ValueError, match="episodes"):
        _spec(**over)
    try:
        _spec(**over)
    except ValueError as e:
        assert field in str(e)


def test_parse_errors_and_void_turns_follow_the_outcome_policy(model_tok, monkeypatch):
    """An unreadable call is a parse_error the model is told about, its turn masked; an episode ending with
    neither a call nor an answer is a void turn, dropped from its group."""
    monkeypatch.setattr(scripted_tools, "next_turn", lambda prompt, so_far, key: (
        ("<code>\nprint(1)\n", False) if "error:" not in so_far else ("I give up", True)))
    (eps, timings), tok = _play(model_tok, prompts=("1+1",), n=2)
    for e in eps:
        assert [t.get("outcome") for t in e.turns] == ["parse_error", "parse_error", "void"]
        assert e.excluded and e.finish == "answer"
        first = e.turns[0]["span"]
        assert e.sample.loss[first[1]:first[2]] == [0] * (first[2] - first[1])  # mask_turn
    m = episodes.metrics(eps, timings)
    assert m["episodes/outcome/parse_error"] > 0 and m["episodes/excluded_frac"] == 1.0


@pytest.mark.slow
def test_the_async_producer_plays_episodes_and_a_pause_loses_none(tmp_path, models_dir, scripted, monkeypatch):
    """rollout.max_staleness: the producer process plays the episodes (its own tools and sessions), and a
    run paused mid-way then resumed trains on the same episodes, step for step, as one that never stopped
    (in-flight episodes are played again from the checkpointed stream position)."""
    monkeypatch.setenv("RLVR_PRODUCER_PRELUDE", "tests.scripted_tools:install")
    spec = _spec(rollout={"max_staleness": 1}, train={"steps": 4})
    train(spec, tmp_path / "straight", models_dir=models_dir, log=lambda m: None)
    calls = {"n": 0}

    def pause_at_2():
        calls["n"] += 1
        return "pause" if calls["n"] == 2 else None

    first = train(spec, tmp_path / "paused", models_dir=models_dir, should_stop=pause_at_2, log=lambda m: None)
    assert (first.status, first.step) == ("paused", 2)
    second = train(spec, tmp_path / "paused", models_dir=models_dir, log=lambda m: None)
    assert (second.status, second.step) == ("succeeded", 4)
    keys = ("step", "reward/mean", "accuracy", "episodes/tool_calls", "episodes/turns", "episodes/token_mismatches",
            "data_position")

    def rows(name):
        return [{k: r[k] for k in keys} for r in (json.loads(x) for x in
                (tmp_path / name / "metrics.jsonl").read_text().splitlines()) if "episodes/turns" in r]

    straight = rows("straight")
    assert len(straight) == 4 and all(r["episodes/tool_calls"] > 0 for r in straight)
    assert rows("paused") == straight


def test_a_long_observation_keeps_its_head_and_its_tail(model_tok):
    """Output past max_observation_tokens is cut in the middle: the start of the output and the end of a
    traceback (the line that says what went wrong) both reach the model, within the bound."""
    _, tok = model_tok
    cfg = EpisodesConfig(max_observation_tokens=60)
    out = "line one\n" + "x" * 300 + "\nValueError: boom\n"
    ids = episodes._tag_observation(tok, out, cfg)
    text = tok.decode(ids)
    assert len(ids) <= 60 and text.startswith("<output>\nline") and text.endswith("ValueError: boom\n</output>\n")
    assert "\n...\n" in text
    short = episodes._tag_observation(tok, "7\n", cfg)
    assert tok.decode(short) == "<output>\n7\n</output>\n"
