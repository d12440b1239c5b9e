"""Multi-turn episodes: the model calls Python in our sandbox between turns (``spec.episodes``).

An episode is a prompt and what followed it: model turns (sampled tokens, loss on them) and tool observations
(tokens appended with loss 0). The ledger is token-exact by construction: every engine call's prompt is the
previous call's prompt plus what came after it, as token ids — nothing is decoded and re-encoded — and the
trainer trains on exactly those ids. Each call is recorded (``Call``: its prompt ids, sampled ids, log-probs,
policy version), so the equality can be checked rather than trusted.

Two formats. ``tags`` (small models, no tool template): the model writes ``<code>…</code>`` inside its own
reply, generation stops at the closing tag, the code runs, ``<output>…</output>`` is appended to the same
reply, and the model goes on. ``chat``: tool calls in the chat template's own form
(``<tool_call>{"name": "python", "arguments": {"code": …}}</tool_call>``, as Qwen and Hermes templates write
them); the observation is the template's rendering of a tool message, appended when the re-rendered history
starts with the ledger, and otherwise a new sample (a *fork*) starts from the re-rendered history — counted,
never silently re-tokenised.

Every tool call and turn gets a typed outcome: ``ok``, ``tool_error`` (the program raised or broke a limit:
the model sees why), ``timeout``, ``parse_error`` (a call the parser cannot read), ``infra_error`` (the
sandbox failed: retried once, then the episode is left out of its group's statistics and of the loss —
never scored 0).
"""
from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from .rollout import Rollout, SamplingParams, left_pad, left_pad_mask, render_prompt

OUTCOMES = ("ok", "tool_error", "timeout", "parse_error", "infra_error")
TRUNCATED = ("max_tokens", "max_turns", "max_tool_calls")  # finishes that cut an episode short
_TOOL_CALL = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.S)
_STATUS = {"ok": "ok", "runtime_error": "tool_error", "memory_limit": "tool_error", "output_limit": "tool_error",
           "timeout": "timeout", "sandbox_error": "infra_error"}


@dataclass
class Call:
    """One engine call of an episode, as the sampler saw it: what the trainer must train on, exactly."""
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    version: int


@dataclass
class Sample:
    """One training row: a prompt and the ids that followed it (model tokens carry loss, observations not)."""
    prompt_ids: list[int]
    ids: list[int] = field(default_factory=list)
    loss: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)

    def add(self, ids: Sequence[int], loss: int, logprobs: Sequence[float] | None = None) -> None:
        self.ids += list(ids)
        self.loss += [loss] * len(ids)
        self.logprobs += list(logprobs) if logprobs is not None else [0.0] * len(ids)


@dataclass
class Episode:
    prompt: Any
    samples: list[Sample]
    session: Any = None                      # sandbox.session.PythonSession (per_episode) or None
    messages: list[dict] = field(default_factory=list)  # the chat format's conversation so far
    calls: list[Call] = field(default_factory=list)
    turns: list[dict] = field(default_factory=list)     # for people: kind, text, outcome, tool_s, token span
    tool_calls: int = 0
    done: bool = False
    # answer | max_turns | max_tool_calls | max_tokens | parse_error | infra_error
    finish: str = ""
    excluded: bool = False                   # left out of group statistics and the loss (infra_error, void turn)
    forks: int = 0
    reference: Any = None                    # the problem's reference (an environment may read it: public tests)
    reward: float | None = None              # the environment's reward (episodes.env http, reward: env)
    final_only: bool = False                 # the verifiers judge the last answer alone (code repair)
    env_state: Any = None                    # the environment's handle for this episode (an HTTP session)
    tool_schema: Any = None                  # chat format: the tool the template describes (None: no tool)
    opening: str = ""                        # the environment's reset observation, shown in the prompt

    @property
    def sample(self) -> Sample:
        return self.samples[-1]

    def model_text(self) -> str:
        """What the model wrote, every turn, observations left out: what the verifiers judge (under code
        repair: its last answer alone)."""
        texts = [t["text"] for t in self.turns if t["kind"] == "model"]
        return (texts[-1] if texts else "") if self.final_only else "".join(texts)

    def first_text(self) -> str:
        """The model's first turn (code repair: the first attempt, for the fix rate)."""
        return next((t["text"] for t in self.turns if t["kind"] == "model"), "")

    def tokens(self) -> int:
        return sum(len(s.ids) for s in self.samples)


@dataclass
class Tools:
    """What an episode's tool calls run in: a session per episode (state kept) or a fresh one per call."""
    limits: Any                               # sandbox.Limits
    per_episode: bool = True
    seed: int = 0
    env: Any = None                           # trainer.envs: what answers instead of the python tool (None: python)

    @classmethod
    def from_spec(cls, cfg, seed: int) -> "Tools":
        from sandbox import Limits

        from . import envs

        tool = cfg.tools[0]
        lim = tool.limits
        env = envs.build(cfg, seed)
        return cls(Limits(wall_s=lim.wall_s, cpu_s=lim.cpu_s, memory_mb=lim.memory_mb,
                          max_output_bytes=lim.output_bytes), tool.session == "per_episode" and env is None, seed, env)

    def session(self, k: int, base: int = 0):
        """Session ``k`` of the batch at data position ``base``: its ``random`` seed is fixed by where it is
        in the run (a resumed run seeds the same sessions alike)."""
        from sandbox.session import PythonSession

        return PythonSession(self.limits, seed=(self.seed * 1_000_003 + base * 4099 + k) % 2**31)

    def run(self, calls: list[tuple[Episode, str]]) -> tuple[list[Any], float]:
        """Run each (episode, code) call; infrastructure failures are retried once. (results, seconds)."""
        from sandbox.session import run_sessions

        t0 = time.perf_counter()
        pairs = [(e.session if self.per_episode else self.session(0), code) for e, code in calls]
        results = run_sessions(pairs, self.limits)
        again = [i for i, r in enumerate(results) if r.status.value == "sandbox_error"]
        if again:
            for i, r in zip(again, run_sessions([pairs[i] for i in again], self.limits)):
                results[i] = r
        return results, time.perf_counter() - t0


def tools_for(spec, rank: int) -> Tools | None:
    """The job's tools (None for a single-turn job), seeded by the job's seed and the rank."""
    if spec.episodes is None:
        return None
    return Tools.from_spec(spec.episodes, seed=spec.train.seed * 64 + rank)


def check_drift(m: dict, spec) -> None:
    """Fail fast when what the trainer trained on is not what was sampled: a ledger call that is not a
    prefix of its row, or the trainer's log-probs of the sampled tokens off the sampler's by more than
    ``episodes.max_logprob_diff`` on average (default from the dtype both compute in)."""
    if m.get("episodes/token_mismatches", 0):
        raise RuntimeError(f"episodes: {m['episodes/token_mismatches']} engine calls' tokens are not the tokens "
                           "trained on (a ledger bug): the job stops rather than train on them")
    gap = m.get("rollout/logp_abs_diff_mean")
    if m.get("async/staleness", 0):  # sampled by an older policy: the gap is the lag too (the TIS weights' job)
        return
    bound = drift_bound(spec)
    if gap is not None and gap > bound:
        raise RuntimeError(f"episodes: the trainer's log-probs of the sampled tokens differ from the sampler's by "
                           f"{gap:.3g} nats per token on average, above the bound {bound:.3g} "
                           "(episodes.max_logprob_diff): the trained tokens drifted from the sampled ones")


def drift_bound(spec) -> float:
    """8·sqrt(eps) of the dtype sampler and trainer compute in (bf16 autocast: bfloat16): rounding in a
    forward is O(eps) per op and adds up over layers like a random walk; a drifted token costs nats."""
    if spec.episodes.max_logprob_diff is not None:
        return spec.episodes.max_logprob_diff
    dtype = torch.bfloat16 if spec.train.precision == "bf16" else getattr(torch, spec.model.dtype)
    return 8 * torch.finfo(dtype).eps ** 0.5


def start(tok, prompts: Sequence[Any], n: int, cfg, tools: Tools, base: int = 0,
          references: Sequence[Any] | None = None) -> list[Episode]:
    """``n`` episodes per prompt, each with the prompt's token ids (the chat format: with the tool's schema)."""
    out = []
    env = tools.env
    refs = list(references) if references is not None else [None] * len(prompts)
    for p, ref in zip(prompts, refs):
        messages = [{"role": "user", "content": p}] if isinstance(p, str) else list(p)
        schema = PYTHON_TOOL if env is None else env.schema
        ids = _render(tok, messages, schema) if cfg.format == "chat" else \
            tok(render_prompt(tok, p), add_special_tokens=False)["input_ids"]
        for _ in range(n):
            k = len(out)
            out.append(Episode(p, [Sample(list(ids))], tools.session(k, base) if tools.per_episode else None,
                               list(messages), reference=ref, tool_schema=schema,
                               final_only=env is not None and getattr(env, "judged", "all") == "final"))
    if env is not None:
        env.open(out)  # an environment that cannot start an episode marks it infra_error (excluded)
        for e in out:
            if e.opening and not e.excluded:
                _show_opening(e, tok, cfg)
    return out


def _show_opening(e: Episode, tok, cfg) -> None:
    """The reset observation joins the prompt's last user message (cut as an observation is), and the prompt is
    rendered again: nothing has been sampled yet, so the ledger starts from the new prompt."""
    ids = tok(e.opening, add_special_tokens=False)["input_ids"]
    if len(ids) > cfg.max_observation_tokens:
        e.opening = tok.decode(ids[: cfg.max_observation_tokens], skip_special_tokens=True)
    messages = [{"role": "user", "content": e.prompt}] if isinstance(e.prompt, str) else list(e.prompt)
    last = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=None)
    if last is None:
        messages.append({"role": "user", "content": e.opening})
    else:
        messages[last] = {**messages[last], "content": f"{messages[last]['content']}\n\n{e.opening}"}
    e.messages = messages
    ids = _render(tok, messages, e.tool_schema) if cfg.format == "chat" else \
        tok(render_prompt(tok, messages), add_special_tokens=False)["input_ids"]
    e.samples = [Sample(list(ids))]


def run(engine, tok, prompts: Sequence[Any], n: int, sampling: SamplingParams, cfg, tools: Tools,
        version: int = 0, base: int = 0,
        references: Sequence[Any] | None = None) -> tuple[list[Episode], dict[str, float]]:
    """Play ``n`` episodes of every prompt to their end: (episodes in prompt-major order, timings).
    ``version``: the policy's, recorded on every call; ``base``: seeds the batch's sessions; ``references``:
    the problems' (an environment may read them: code repair's public tests)."""
    env = tools.env
    episodes = start(tok, prompts, n, cfg, tools, base, references)
    try:
        timings = _loop(engine, tok, episodes, sampling, cfg, tools, version)
    finally:
        if env is not None:
            env.close(episodes)
    if env is None:  # a void turn is the python tool's notion (an answer without its marker)
        for e in episodes:
            _void(e, cfg)
    return episodes, timings


def _loop(engine, tok, episodes: list[Episode], sampling: SamplingParams, cfg, tools: Tools,
          version: int) -> dict[str, float]:
    env = tools.env
    eos = set(_stop_ids(tok, engine))
    calls = env is None or env.acts_on == "call"  # code repair's model makes no calls: its answers are tested
    stops = tuple(sampling.stop) + (() if not calls else (cfg.call_close,)
                                    if cfg.format == "tags" else ("</tool_call>",))
    gen_s = tool_s = 0.0
    for turn in range(cfg.max_turns):
        live = [e for e in episodes if not e.done]
        if not live:
            break
        room = [cfg.max_episode_tokens - e.tokens() for e in live]
        budget = min(sampling.max_new_tokens, max(room))
        params = SamplingParams(budget, sampling.temperature, sampling.top_p, sampling.greedy, stops)
        t0 = time.perf_counter()
        ro = engine.generate_ids([e.sample.prompt_ids + e.sample.ids for e in live], 1, params)
        gen_s += time.perf_counter() - t0
        pending, answered = [], []
        last = turn == cfg.max_turns - 1
        for i, (e, left) in enumerate(zip(live, room)):
            code = _model_turn(e, ro, i, left, eos, tok, cfg, version, calls)
            if code is not None:
                pending.append((e, code))
            elif env is not None and env.acts_on == "answer" and e.finish == "answer" and not last:
                answered.append(e)  # the last turn's answer is judged by the verifiers alone: no test run
        if pending and env is None:
            results, s = tools.run(pending)
            tool_s += s
            for (e, _code), r in zip(pending, results):
                _observe(e, r, tok, cfg)
        elif pending:
            replies = env.step(pending)
            tool_s += sum(r.seconds for r in replies)
            for (e, _code), r in zip(pending, replies):
                _reply(e, r, tok, cfg, env)
        if answered:
            replies = env.step([(e, e.turns[-1]["text"]) for e in answered])
            tool_s += sum(r.seconds for r in replies)
            for e, r in zip(answered, replies):
                e.turns[-1]["public"] = r.outcome == "ok"
                if not r.done:
                    e.done, e.finish = False, ""
                _reply(e, r, tok, cfg, env)
        if last:
            for e in episodes:
                if not e.done:
                    e.done, e.finish = True, "max_turns"
    return {"generate_s": gen_s, "tool_s": tool_s}


def _model_turn(e: Episode, ro: Rollout, i: int, left: int, eos: set[int], tok, cfg, version: int,
                calls: bool = True) -> str | None:
    """Record row ``i`` of this turn's generation as episode ``e``'s model turn; returns the call to run, if
    any (the python tool's code; an HTTP environment's action text)."""
    m = int(ro.completion_mask[i].sum())
    ids = ro.completion_ids[i, :m].tolist()
    lps = (ro.logprobs[i, :m] if ro.logprobs is not None else torch.zeros(m)).tolist()
    cut = len(ids) > left  # past the episode's token budget: what is beyond it is dropped
    ids, lps = ids[:left], lps[:left]
    e.calls.append(Call(e.sample.prompt_ids + e.sample.ids, ids, lps, version))
    start = len(e.sample.ids)
    e.sample.add(ids, 1, lps)
    text = tok.decode(ids, skip_special_tokens=True)
    turn = {"kind": "model", "text": text, "span": [len(e.samples) - 1, start, len(e.sample.ids)]}
    e.turns.append(turn)
    if cfg.format == "chat":
        e.messages.append({"role": "assistant", "content": text})
    if bool(ids) and ids[-1] in eos:  # the model ended its reply: its final answer
        e.done, e.finish = True, "answer"
        return None
    out_of_room = cut or bool(ro.truncated[i])  # no stop: the turn's (or the episode's) budget ran out
    if not calls:
        e.done, e.finish = True, "max_tokens" if out_of_room else "answer"
        return None
    code, problem = _parse(text, cfg, (e.tool_schema or PYTHON_TOOL)["function"]["name"])
    if problem is not None:  # a call the parser cannot read: the model is told, the turn may lose its loss
        turn["outcome"] = "parse_error"
        if cfg.on_outcome.parse_error == "mask_turn":
            e.sample.loss[start:] = [0] * (len(e.sample.ids) - start)
        if out_of_room:
            e.done, e.finish = True, "parse_error"
        else:
            _append_observation(e, f"error: {problem}\n", tok, cfg, outcome="parse_error", tool_s=0.0)
        return None
    if code is None or out_of_room:
        e.done, e.finish = True, "max_tokens" if out_of_room else "answer"
        return None
    if e.tool_calls >= cfg.max_tool_calls:
        e.done, e.finish = True, "max_tool_calls"
        return None
    e.tool_calls += 1
    turn["tool_call"] = code
    return code


def _parse(text: str, cfg, tool: str = "python") -> tuple[str | None, str | None]:
    """(call, problem) of a turn that stopped at a call's closing marker; (None, None) when it made no call.
    The call: the python tool's code; another tool's (an HTTP environment's) arguments, as a JSON object."""
    if cfg.format == "chat":
        if "</tool_call>" not in text:
            return (None, "an unclosed <tool_call>") if "<tool_call>" in text else (None, None)
        m = _TOOL_CALL.search(text)
        try:
            call = json.loads(m.group(1)) if m else None
            args = call["arguments"] if type(call) is dict and call.get("name") == tool else None
            code = args["code"] if tool == "python" else json.dumps(args) if type(args) is dict else None
        except (ValueError, KeyError, TypeError, RecursionError):
            code = None
        want = '"arguments": {"code": "…"}' if tool == "python" else '"arguments": {…}'
        return ((code, None) if isinstance(code, str)
                else (None, f'a tool call that is not {{"name": "{tool}", {want}}}'))
    close = text.rfind(cfg.call_close)
    if close < 0:
        return (None, f"an unclosed {cfg.call_open}") if cfg.call_open in text else (None, None)
    open_ = text.rfind(cfg.call_open, 0, close)
    if open_ < 0:
        return None, f"{cfg.call_close} without {cfg.call_open}"
    return text[open_ + len(cfg.call_open):close].strip("\n"), None


def _reply(e: Episode, r, tok, cfg, env) -> None:
    """An environment's reply (trainer.envs.Reply): its reward kept, its text appended as an observation."""
    if r.reward is not None:
        e.reward = (e.reward or 0.0) + r.reward
    if r.outcome == "infra_error":  # the environment failed: no judgement of the episode is possible
        e.excluded, e.done, e.finish = True, True, "infra_error"
        e.turns[-1]["outcome"] = "infra_error"
        if r.text:
            e.turns[-1]["error"] = r.text  # why, for people reading the rollouts (never shown to the model)
        return
    if r.done:  # nothing follows: a last observation would be tokens no turn reads
        e.done, e.finish = True, e.finish or "answer"
        e.turns[-1].setdefault("outcome", r.outcome)
        return
    if e.turns[-1].get("outcome") is None:
        e.turns[-1]["outcome"] = r.outcome
    _append_observation(e, r.text, tok, cfg, outcome=r.outcome, tool_s=r.seconds, role=env.role)


def _observe(e: Episode, result, tok, cfg) -> None:
    outcome = _STATUS.get(result.status.value, "tool_error")
    if outcome == "infra_error":  # the sandbox failed twice: no judgement of the episode is possible
        e.excluded, e.done, e.finish = True, True, "infra_error"
        e.turns[-1]["outcome"] = "infra_error"
        return
    out = result.stdout.decode("utf-8", "replace") + result.stderr.decode("utf-8", "replace")
    if outcome == "timeout":
        out += f"TimeoutError: the call ran past its limit ({result.reason})\n"
    elif result.status.value in ("memory_limit", "output_limit"):
        out += f"{result.reason}\n"
    e.turns[-1]["outcome"] = outcome
    _append_observation(e, out, tok, cfg, outcome=outcome, tool_s=result.wall_s)


def _append_observation(e: Episode, output: str, tok, cfg, outcome: str, tool_s: float, role: str = "tool") -> None:
    """The tool's output as tokens with loss 0: appended to the ledger, or (chat, history rewritten) a fork."""
    if cfg.format == "chat":
        name = (e.tool_schema or PYTHON_TOOL)["function"]["name"]
        e.messages.append({"role": "tool", "name": name, "content": output} if role == "tool" else
                          {"role": role, "content": output})
        full = _render(tok, e.messages, e.tool_schema)
        have = e.sample.prompt_ids + e.sample.ids
        if full[: len(have)] == have:
            obs = full[len(have):]
        else:  # the template re-renders the history differently: start a new sample there, never re-tokenise
            e.samples.append(Sample(full))
            e.forks += 1
            obs = []
    else:
        obs = _tag_observation(tok, output, cfg, _past_close(e, cfg))
    start = len(e.sample.ids)
    e.sample.add(obs, 0)
    e.turns.append({"kind": "observation", "text": tok.decode(obs, skip_special_tokens=False) if obs else output,
                    "outcome": outcome, "tool_s": round(tool_s, 4),
                    "span": [len(e.samples) - 1, start, len(e.sample.ids)]})


def _past_close(e: Episode, cfg) -> str:
    """What the model's last turn wrote after its call's closing marker. A BPE token can hold the end of the
    stop string and the start of what follows (SmolLM2 has one token for ``><``): the turn then ends in a
    stray ``<`` that the observation's opening tag would repeat."""
    model = next((t for t in reversed(e.turns) if t["kind"] == "model"), None)
    text = model["text"] if model else ""
    close = text.rfind(cfg.call_close)
    return text[close + len(cfg.call_close):] if close >= 0 else ""


def _tag_observation(tok, output: str, cfg, written: str = "") -> list[int]:
    """``<output>…</output>`` as tokens, the output cut to ``max_observation_tokens`` in all. ``written``: what
    the model already wrote past its call (``_past_close``): where the observation's head (after its leading
    whitespace) starts with it, that part is not appended again, so the text reads ``</code><output>`` rather
    than ``</code><<output>``. The sampled tokens stay as sampled (the ledger never re-tokenises)."""
    head, _, tail = cfg.observation.partition("{output}")
    lead = len(head) - len(head.lstrip())
    if written.strip() and head[lead:].startswith(written):
        head = head[lead + len(written):]
    ids = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    h, t, body = ids(head), ids(tail), ids(output)
    room = max(0, cfg.max_observation_tokens - len(h) - len(t))
    if len(body) > room:  # its head and its tail (a traceback's last line says what went wrong), cut between
        marker = ids("\n...\n")
        if room <= 2 * len(marker):
            body = body[len(body) - room:]
        else:
            keep = room - len(marker)
            body = body[: keep // 3] + marker + body[len(body) - (keep - keep // 3):]
    return h + body + t


PYTHON_TOOL = {"type": "function", "function": {"name": "python", "description": "Run Python code; its printed "
               "output (or the value of its last expression) comes back.", "parameters": {"type": "object",
               "properties": {"code": {"type": "string"}}, "required": ["code"]}}}


def _render(tok, messages: list[dict], schema) -> list[int]:
    """The chat template's rendering with the tool's schema: python's, an environment's, or none (code repair:
    the feedback is a user turn)."""
    kw = {"tools": [schema]} if schema else {}
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kw)
    return tok(text, add_special_tokens=False)["input_ids"]


def _void(e: Episode, cfg) -> None:
    """A void turn: the episode ended without a call and without an answer (SimpleTIR's degenerate turns)."""
    last = next((t for t in reversed(e.turns) if t["kind"] == "model"), None)
    void = (e.finish == "answer" and last is not None and cfg.answer_marker not in last["text"]
            and "tool_call" not in last)
    if void:
        last["outcome"] = "void"
        if cfg.on_outcome.void_turn == "drop":
            e.excluded = True


def _stop_ids(tok, engine) -> list[int]:
    from .rollout import stop_ids

    return stop_ids(tok, getattr(engine, "model", None))


def to_rollout(episodes: list[Episode], pad: int) -> tuple[Rollout, list[int]]:
    """Every sample of every episode as one row (attention over all of it, loss on model tokens), and each
    row's episode index."""
    rows = [(k, s) for k, e in enumerate(episodes) for s in e.samples]
    prompts = [s.prompt_ids for _, s in rows]
    T = max(1, max(len(s.ids) for _, s in rows))
    comp = torch.tensor([s.ids + [pad] * (T - len(s.ids)) for _, s in rows], dtype=torch.long)
    attn = torch.tensor([[1] * len(s.ids) + [0] * (T - len(s.ids)) for _, s in rows], dtype=torch.long)
    loss = torch.tensor([s.loss + [0] * (T - len(s.ids)) for _, s in rows], dtype=torch.long)
    lps = torch.tensor([s.logprobs + [0.0] * (T - len(s.ids)) for _, s in rows], dtype=torch.float32)
    truncated = torch.tensor([episodes[k].finish in TRUNCATED for k, _ in rows])
    texts = [episodes[k].model_text() for k, _ in rows]
    ro = Rollout(left_pad(prompts, pad), left_pad_mask(prompts, 0), comp, attn, texts, truncated, lps, loss_mask=loss)
    return ro, [k for k, _ in rows]


def env_scores(episodes: list[Episode]):
    """The environment's rewards as the scorer's result (``episodes.env`` http with ``reward: env``): an
    episode's reward is the sum of its steps' (or verify's); correct = a positive reward; an excluded episode
    (the environment failed) is an infrastructure failure, left out."""
    from .scoring import Scores

    rewards = [float(e.reward or 0.0) for e in episodes]
    return Scores(rewards, [r > 0 for r in rewards], {"env": rewards}, infra=[e.excluded for e in episodes])


def ledger(e: Episode) -> dict[str, Any]:
    """An episode's token ledger, compact (what stored rollouts keep under ``episodes.keep_tokens``): each
    sample's prompt ids, ids, loss mask and log-probs, and each engine call as (sample, start, end, version)
    — its prompt is the sample's prompt and ids before ``start``, its completion the ids in [start, end)."""
    calls = []
    for c in e.calls:
        want = c.prompt_ids + c.completion_ids
        k = next((k for k, s in enumerate(e.samples) if (s.prompt_ids + s.ids)[: len(want)] == want), None)
        if k is None:  # a drifted ledger (ledger_mismatches counts it): nothing exportable is made up
            raise ValueError("an engine call is not a prefix of its episode's ledger")
        start = len(c.prompt_ids) - len(e.samples[k].prompt_ids)
        calls.append({"sample": k, "start": start, "end": start + len(c.completion_ids), "version": c.version})
    return {"samples": [{"prompt_ids": s.prompt_ids, "ids": s.ids, "loss": s.loss, "logprobs": s.logprobs}
                        for s in e.samples],
            "calls": calls, "reward": e.reward, "excluded": e.excluded, "finish": e.finish}


def export(e: Episode | dict, advantage: float = 0.0) -> dict[str, Any]:
    """An episode (or its :func:`ledger`) in the per-call token format (docs/environments.md): each engine
    call's prompt ids, completion ids, log-probs and mask (1 = a sampled token, trained), and each sample as a
    Tinker datum — ``model_input`` the tokens but the last, ``loss_fn_inputs`` the next tokens
    (``target_tokens``), the loss mask (``weights``: 0 on the prompt and every observation), the sampler's
    ``logprobs`` and the episode's ``advantages`` on the weighted tokens — which Tinker's ``forward_backward``
    (and this service's Tinker door) trains on as it stands."""
    lg = ledger(e) if isinstance(e, Episode) else e
    samples = lg["samples"]
    calls = []
    for c in lg["calls"]:
        s = samples[c["sample"]]
        calls.append({"prompt_ids": s["prompt_ids"] + s["ids"][: c["start"]],
                      "completion_ids": s["ids"][c["start"]: c["end"]], "logprobs": s["logprobs"][c["start"]: c["end"]],
                      "mask": [1] * (c["end"] - c["start"]), "version": c["version"]})
    datums = []
    for s in samples:
        tokens = s["prompt_ids"] + s["ids"]
        weights = [0] * len(s["prompt_ids"]) + list(s["loss"])
        lps = [0.0] * len(s["prompt_ids"]) + list(s["logprobs"])
        datums.append({"model_input": tokens[:-1], "loss_fn_inputs": {
            "target_tokens": tokens[1:], "weights": [float(w) for w in weights[1:]], "logprobs": lps[1:],
            "advantages": [advantage * w for w in weights[1:]]}})
    return {"calls": calls, "datums": datums, "reward": lg["reward"], "excluded": lg["excluded"],
            "finish": lg["finish"]}


def ledger_mismatches(episodes: list[Episode]) -> int:
    """Engine calls whose prompt + sampled ids are not exactly a prefix of the row the trainer trains on
    (with the sampler's log-probs in place): 0 by construction; counted so that it is checked, not trusted."""
    bad = 0
    for e in episodes:
        rows = [(s.prompt_ids + s.ids, [0.0] * len(s.prompt_ids) + s.logprobs) for s in e.samples]
        for c in e.calls:
            want = c.prompt_ids + c.completion_ids
            n = len(c.prompt_ids)
            ok = any(ids[: len(want)] == want and lps[n: len(want)] == c.logprobs for ids, lps in rows)
            bad += not ok
    return bad


def turns_for_people(e: Episode) -> list[dict]:
    """An episode's turns for the rollout browser: who wrote each, its text, outcome, tool time, tokens."""
    out = []
    for t in e.turns:
        sample, a, b = t["span"]
        out.append({"kind": t["kind"], "text": t["text"], "outcome": t.get("outcome", "ok"),
                    "tool_s": t.get("tool_s"), "sample": sample, "tokens": [a, b]})
    return out


def metrics(episodes: list[Episode], timings: dict[str, float], prefix: str = "episodes/") -> dict[str, float]:
    """Turns and tool calls per episode, outcome rates over tool calls and turns, tool latency, forks."""
    n = max(1, len(episodes))
    outcomes = [t["outcome"] for e in episodes for t in e.turns if t["kind"] == "observation" or
                t.get("outcome") in ("parse_error", "infra_error", "void")]
    calls = [t["tool_s"] for e in episodes for t in e.turns
             if t["kind"] == "observation" and t["outcome"] != "parse_error"]
    lat = sorted(calls)
    q = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))] if lat else 0.0  # noqa: E731
    out = {f"{prefix}turns": sum(sum(t["kind"] == "model" for t in e.turns) for e in episodes) / n,
           f"{prefix}tool_calls": sum(e.tool_calls for e in episodes) / n,
           f"{prefix}forks": sum(e.forks for e in episodes) / n,
           f"{prefix}excluded_frac": sum(e.excluded for e in episodes) / n,
           f"{prefix}tool_latency_p50_s": q(0.5), f"{prefix}tool_latency_p99_s": q(0.99),
           f"{prefix}generate_s": timings.get("generate_s", 0.0), f"{prefix}tool_s": timings.get("tool_s", 0.0)}
    tested = [[t["public"] for t in e.turns if "public" in t] for e in episodes]
    if any(tested):  # code repair: did the first answer pass the public tests, did a failing one get fixed
        firsts = [p for p in tested if p]
        out[f"{prefix}public_first_pass"] = sum(p[0] for p in firsts) / len(firsts)
        out[f"{prefix}public_fixed"] = sum(not p[0] and p[-1] for p in firsts) / len(firsts)
    for o in (*OUTCOMES, "void"):
        out[f"{prefix}outcome/{o}"] = sum(x == o for x in outcomes) / max(1, len(outcomes))
    for f in ("answer", "max_turns", "max_tool_calls", "max_tokens", "parse_error", "infra_error"):
        out[f"{prefix}finish/{f}"] = sum(e.finish == f for e in episodes) / n
    return out
