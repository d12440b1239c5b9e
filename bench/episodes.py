"""Episodes with a Python tool vs single-turn GRPO vs TRL's tool loop: held-out accuracy at equal wall-clock.

Task: 3-4-digit arithmetic that a 135M model cannot do in its head, half products of two 3-digit numbers,
half sums of two 4-digit numbers ("What is 347 * 812?"), generated here from a fixed seed: the held-out
problems are the same in every arm and every run (``problems``), and never trained on. Every arm is judged
by the same strict verifier (math, ``allow_unevaluated: false``: the number must be stated, an expression
such as ``\\boxed{347*812}`` earns nothing), greedy, one attempt per problem, on what the model wrote
(tool output left out). Three arms on the same model, problems, clock, G, prompts per step, temperature,
learning rate, β = 0 and thread count:

  single   our GRPO, one turn, no tool (trainer.loop.train);
  tool     our GRPO over episodes (spec.episodes, format ``tags``): the model writes ``<code>…</code>``, the
           code runs in our sandbox (state kept for the episode), ``<output>…</output>`` is appended and
           the model goes on; held-out problems are played as episodes with the tool;
  trl      TRL 1.16 GRPOTrainer with its own tool support (``environment_factory``: an environment whose
           ``python(code)`` method is the tool; TRL parses the chat template's ``<tool_call>`` JSON, runs
           the call, appends the tool message and generates again). The code runs in our sandbox too (a
           stateful ``PythonSession`` per rollout) — nothing the model writes runs outside the jail. SmolLM2's
           chat template renders no tools, so the tokenizer gets TRL's own bundled Qwen2.5 template (ChatML,
           the same special tokens); held-out problems are played in that format, with the tool's schema as
           TRL renders it, by our chat-format episode runner.

Prompts (stated, not hidden): a system line saying how to answer (and, for the tool arms, how to call the
tool), then two worked examples as chat turns — the same two problems in every arm, each in its arm's own
format (a boxed number; a ``<code>`` call, its output and the boxed number; a tool call, the tool message
and the boxed number) — then the question. No format warm-up.

Each arm's weights are copied when its training clock passes 1/8, 1/4, 1/2 and all of ``--minutes``
(copies off the clock; evaluation after training), over ``--seeds`` seeds. Also measured in the same run:
the sandbox's stateful session (start, one call that needs the state, the state kept) beside a one-shot
``print(1)`` run, one call at a time and batched over the pool.

    .venv/bin/python bench/episodes.py                         # SmolLM2-135M, 30 min per arm, 3 seeds
    .venv/bin/python bench/episodes.py --minutes 4 --seeds 1   # a shortened run
    .venv/bin/python bench/episodes.py --quick                 # the tiny tool model (builtin:tiny-tool), < 5 min
    .venv/bin/python bench/episodes.py --smoke                 # CI: every arm for seconds; measures nothing
    .venv/bin/python bench/episodes.py --arms trl --out /tmp/trl ...   # one arm per process, then:
    .venv/bin/python bench/episodes.py --merge bench/results/episodes.json /tmp/trl/episodes.json

``--quick`` (and ``--smoke``) run builtin:tiny-tool (trainer/models/tiny_tool.py: tiny-arith taught the ``tags``
tool format by a short SFT, its own arithmetic left weak) on its own task: ``a+b``, operands 0-50, the bare
question, no examples, the observation format it was built with (``<output>\n…</output>\n``), its demo recipe's
sizes (examples/jobs/demo-tools.yaml: lr 3e-4, 2 turns, 80 episode tokens). Its SFT drew its problems from
``builtin:arithmetic``'s train split, not from these; the held-out ones here may overlap that split (the SFT
trained the call's format and copying the question, not the sums' digits). TRL's arm gets a minimal
tool-capable chat template (the model's context is 128 tokens), whose JSON calls tiny-tool was never taught:
in --quick that arm checks TRL's loop end to end, it is no comparison.

Needs trl and matplotlib (``pip install 'rlvr[bench]'``). JSON and PNG in bench/results/. Last line:
``tool_gain= single_turn_gain= trl_tool_gain= tool_time_frac= token_mismatches= seeds= model=`` — tool_gain: the
tool arm's final held-out accuracy minus the single-turn arm's (mean over seeds); single_turn_gain: the
single-turn arm's final minus its start; trl_tool_gain: TRL's tool arm's final minus the single-turn arm's
final (comparable with tool_gain); tool_time_frac: tool time / step time of our tool arm (mean over steps);
token_mismatches: engine calls whose tokens were not the tokens trained on (summed over steps).
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import torch  # noqa: E402
from grpo_vs_trl import FRACTIONS, Snapshots, model_dir  # noqa: E402

from trainer import episodes  # noqa: E402
from trainer.config import EpisodesConfig, JobSpec  # noqa: E402
from trainer.engines import ENGINES  # noqa: E402
from trainer.evaluation import Episodes, evaluate  # noqa: E402
from trainer.scoring import Scorer  # noqa: E402
from verifiers.spec import VerifierSpec  # noqa: E402

ARMS = ("single", "tool", "trl")
STRICT = [{"name": "math", "config": {"allow_unevaluated": False}}]
SHOTS = [(123, "*", 456), (4821, "+", 7390)]  # the worked examples (never drawn: problems skips them)
TOOLS_ON = ("You can run Python: write <code>\n...\n</code> and its output comes back in <output>...</output>. "
            "Then give only the final number in \\boxed{}.")
TOOLS_OFF = "Give only the final number in \\boxed{}."
TRL_SYSTEM = "Use the python tool to compute the answer. Then give only the final number in \\boxed{}."
# "</code><output>" is one token short of SmolLM2's "><": a call stopped at "</code>" would end mid-token and
# leave a stray "<" before the output, so the output starts on a line of its own ("</code>" ends in ">")
OBSERVATION = "\n<output>\n{output}</output>\n"


def observation(tiny: bool) -> str:
    """SmolLM2's turn may end mid-token after ``</code>``: a new line first. tiny-tool was built on the default."""
    return EpisodesConfig.model_fields["observation"].default if tiny else OBSERVATION
LIMITS = {"cpu_s": 2, "wall_s": 4, "memory_mb": 256, "output_bytes": 2048}


# --- the task ------------------------------------------------------------------------------------------------

def problems(n_train: int, n_eval: int, tiny: bool = False) -> tuple[list[tuple], list[tuple]]:
    """(train, held-out) problems as (a, op, b): a fixed seed, so every arm and every run holds out the same
    ones; held-out first, then train, with no problem in both. ``tiny``: the tiny model's own a+b, 0-50."""
    rng = random.Random(20261202)
    seen = set(SHOTS)
    out = []
    while len(out) < n_train + n_eval:
        if tiny:
            p = (rng.randint(0, 50), "+", rng.randint(0, 50))
        elif len(out) % 2 == 0:
            p = (rng.randint(100, 999), "*", rng.randint(100, 999))
        else:
            p = (rng.randint(1000, 9999), "+", rng.randint(1000, 9999))
        if p not in seen:
            seen.add(p)
            out.append(p)
    return out[n_eval:], out[:n_eval]


def answer(p: tuple) -> int:
    a, op, b = p
    return a * b if op == "*" else a + b


def question(p: tuple, tiny: bool) -> str:
    return f"{p[0]}{p[1]}{p[2]}" if tiny else f"What is {p[0]} {p[1]} {p[2]}?"


def prompt(p: tuple, arm: str, tiny: bool, shots: int = 2) -> list[dict]:
    """The chat messages an arm sees for problem ``p``: its system line, the two worked examples in its own
    format, the question."""
    if tiny:
        return [{"role": "user", "content": question(p, tiny)}]
    msgs = [{"role": "system", "content": {"single": TOOLS_OFF, "tool": TOOLS_ON, "trl": TRL_SYSTEM}[arm]}]
    for s in SHOTS[:shots]:
        code, ans = f"print({s[0]} {s[1]} {s[2]})", answer(s)
        msgs.append({"role": "user", "content": question(s, tiny)})
        if arm == "single":
            msgs.append({"role": "assistant", "content": f"\\boxed{{{ans}}}"})
        elif arm == "tool":  # exactly what an episode's reply looks like: the call, the output appended, the answer
            obs = OBSERVATION.format(output=f"{ans}\n")
            msgs.append({"role": "assistant", "content": f"<code>\n{code}\n</code>{obs}\\boxed{{{ans}}}"})
        else:
            msgs += [{"role": "assistant", "content": "", "tool_calls": [
                         {"type": "function", "function": {"name": "python", "arguments": {"code": code}}}]},
                     {"role": "tool", "name": "python", "content": f"{ans}\n"},
                     {"role": "assistant", "content": f"\\boxed{{{ans}}}"}]
    return msgs + [{"role": "user", "content": question(p, tiny)}]


def samples(ps: list[tuple], arm: str, tiny: bool, shots: int = 2) -> list[dict]:
    return [{"id": f"{p[0]}{p[1]}{p[2]}", "prompt": prompt(p, arm, tiny, shots),
             "reference": {"answer": str(answer(p))}}
            for p in ps]


# --- our two arms --------------------------------------------------------------------------------------------

def our_spec(arm: str, a, seed: int, files: dict[str, Path]) -> JobSpec:
    ep = None
    if arm == "tool":
        ep = {"tools": [{"name": "python", "session": "per_episode", "limits": LIMITS}], "format": "tags",
              "observation": observation(a.tiny),
              "max_turns": a.max_turns, "max_tool_calls": a.max_turns - 1,
              "max_observation_tokens": a.max_observation_tokens, "max_episode_tokens": a.max_episode_tokens,
              "eval_tools_off": False}
    return JobSpec.model_validate({
        "name": f"episodes-bench-{arm}", "algorithm": "grpo", "model": {"path": str(a.mdir)},
        # the loop's own step-0 eval (off the clock) sees 4 problems: the bench scores its snapshots itself
        "data": {"dataset": str(files[arm]), "eval_dataset": str(files[arm + "-eval"]), "eval_size": 4},
        "verifiers": STRICT, "episodes": ep,
        "rollout": {"group_size": a.group_size, "max_new_tokens": a.max_new_tokens, "temperature": 1.0},
        "algo": {"kl_coef": 0.0, "micro_batch_size": a.micro_rows}, "optim": {"lr": a.lr},
        "train": {"steps": 100_000, "prompts_per_step": a.prompts, "eval_every": 0, "seed": seed,
                  "threads": a.threads}})


def run_ours(arm: str, a, seed: int, files: dict[str, Path], work: Path, eval_set: list[dict]) -> dict:
    import trainer.loop as loop

    spec = our_spec(arm, a, seed, files)
    live, stamps, steps_m = {}, [], []
    setup = loop.setup

    def keep(*args, **kw):  # the bench holds the live policy, to snapshot it (bench-only hook)
        run = setup(*args, **kw)
        live["model"], live["tok"] = run.ctx.policy, run.ctx.tok
        return run

    def on_step(step, m):
        if step == 0:  # the clock starts after our step-0 eval: TRL runs none
            snaps.t0, snaps.paused = time.perf_counter(), 0.0
            return
        stamps.append(time.perf_counter())
        steps_m.append({k: float(v) for k, v in m.items() if k.startswith(("episodes/", "rollout/logp_abs_diff"))
                        and isinstance(v, (int, float))})
        snaps.maybe_take(live["model"])

    loop.setup = keep
    snaps = Snapshots(a.minutes * 60)
    try:
        loop.train(spec, work / f"{arm}-{seed}", models_dir=a.models, log=lambda m: None, on_step=on_step,
                   should_stop=lambda: "pause" if snaps.over() else None)
    finally:
        loop.setup = setup
    wall = snaps.elapsed()
    snaps.maybe_take(live["model"], final=True)
    cfg = spec.episodes
    acc = score(snaps, live["model"], live["tok"], eval_set, a, cfg,
                episodes.Tools.from_spec(cfg, seed) if cfg else None)
    out = {"steps": len(stamps), "wall_s": wall, "accuracy": acc[1.0], "accuracy_at": acc,
           "s_per_step": statistics.median([b - a_ for a_, b in zip(stamps, stamps[1:])] or [wall])}
    if cfg is not None:
        mean = lambda k: statistics.fmean(s.get(k, 0.0) for s in steps_m) if steps_m else 0.0  # noqa: E731
        out.update({"tool_time_frac": mean("episodes/tool_time_frac"), "tool_calls": mean("episodes/tool_calls"),
                    "turns": mean("episodes/turns"), "forks": mean("episodes/forks"),
                    "tool_latency_p50_s": mean("episodes/tool_latency_p50_s"),
                    "logp_abs_diff_mean": mean("rollout/logp_abs_diff_mean"),
                    "token_mismatches": int(sum(s.get("episodes/token_mismatches", 0) for s in steps_m))})
    return out


def score(snaps: Snapshots, model, tok, eval_set, a, cfg=None, tools=None) -> dict[float, float]:
    out = {}
    for f, state in sorted(snaps.taken.items()):
        model.load_state_dict(state)
        out[f] = held_out(model.eval(), tok, eval_set, a, cfg, tools)
    return out


def held_out(model, tok, eval_set, a, cfg=None, tools=None) -> float:
    """Greedy, strict: the share of held-out problems whose stated number is right (with the tool, as episodes)."""
    play = Episodes(tok, cfg, tools) if cfg is not None else None
    m = evaluate(ENGINES["hf"](model, tok), Scorer([VerifierSpec(**v) for v in STRICT]), eval_set, a.max_new_tokens,
                 batch=64, play=play)
    return m["eval/accuracy"]


# --- TRL's arm -----------------------------------------------------------------------------------------------

TINY_TOOL_TEMPLATE = (  # tiny-arith's own template plus tool calls and tool messages (its context is 128 tokens)
    "{% for m in messages %}"
    "{% if m['role'] == 'assistant' %}<|assistant|>{{ m['content'] or '' }}"
    "{% for t in m['tool_calls'] or [] %}<tool_call>{{ t['function'] | tojson }}</tool_call>{% endfor %}<|end|>"
    "{% elif m['role'] == 'tool' %}<|user|><tool_response>{{ m['content'] }}</tool_response>"
    "{% else %}<|user|>{{ m['content'] }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def trl_tokenizer(mdir: Path, tiny: bool):
    """The tokenizer with a chat template that renders tool calls (TRL refuses one that does not):
    TRL's bundled Qwen2.5 template for SmolLM2 (both ChatML), and its response parser."""
    import copy
    from importlib.resources import files

    from transformers import AutoTokenizer
    from trl import chat_template_utils as ctu

    tok = AutoTokenizer.from_pretrained(mdir)
    if tiny:
        tok.chat_template = TINY_TOOL_TEMPLATE
        parser = copy.deepcopy(ctu.qwen3_template)
        parser["start_anchor"] = "<|assistant|>"
        parser["fields"]["content"]["close_pattern"] = r"<\|end\|>\s*"
        tok.response_template = parser
    else:
        tok.chat_template = (files("trl") / "chat_templates" / "qwen2_5.jinja").read_text()
    return tok


def python_env(limits, tool_s: list[float], seed: int):
    """TRL's environment: one per rollout, reset before each; its ``python`` method is the tool."""
    from sandbox.session import PythonSession

    class PythonEnv:
        def reset(self, **_):
            self.session = PythonSession(limits, seed=seed)

        def python(self, code: str) -> str:
            """Run Python code; what it prints (or the value of its last expression) comes back.

            Args:
                code: The Python code to run.
            """
            t0 = time.perf_counter()
            r = self.session.call(code)
            tool_s.append(time.perf_counter() - t0)
            return (r.stdout + r.stderr).decode("utf-8", "replace") or (r.reason or "")

    return PythonEnv


@contextlib.contextmanager
def rendered_like_trl(schema: dict):
    """Our chat-format runner renders the prompt with the tool's schema as TRL rendered it (bench-only patch)."""
    render = episodes._render

    def _render(tok, messages, cfg):
        text = tok.apply_chat_template(messages, tools=[schema], tokenize=False, add_generation_prompt=True)
        return tok(text, add_special_tokens=False)["input_ids"]

    episodes._render = _render
    try:
        yield
    finally:
        episodes._render = render


def run_trl(a, seed: int, train_set: list[dict], eval_set: list[dict], work: Path) -> dict:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, PrinterCallback, TrainerCallback
    from transformers.utils import get_json_schema
    from trl import GRPOConfig, GRPOTrainer

    from sandbox import Limits

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    scorer = Scorer([VerifierSpec(**v) for v in STRICT])

    def reward(completions, reference, **_):  # what the model wrote, every turn; tool messages left out
        texts = ["".join(m.get("content") or "" for m in c if m["role"] == "assistant") if isinstance(c, list) else c
                 for c in completions]
        return scorer(texts, [json.loads(r) for r in reference]).rewards

    rows = [{"prompt": s["prompt"], "reference": json.dumps(s["reference"])} for s in train_set]
    batch = a.prompts * a.group_size
    micro = a.micro_rows or batch  # one step generates the whole batch, then accumulates over its micro-batches
    if batch % micro:
        raise SystemExit(f"--micro-rows {micro} must divide the step's {batch} episodes")
    cfg = GRPOConfig(
        output_dir=str(work / "trl"), num_generations=a.group_size,
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=batch // micro, max_completion_length=a.max_episode_tokens,
        max_tool_calling_iterations=a.max_turns - 1, learning_rate=a.lr, beta=0.0, temperature=1.0, top_k=0,
        loss_type="dapo", scale_rewards="group", num_iterations=1, max_steps=100_000, lr_scheduler_type="constant",
        warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0, gradient_checkpointing=False, bf16=False,
        use_cpu=True, logging_steps=1, save_strategy="no", report_to="none", seed=seed, disable_tqdm=True,
        dataloader_num_workers=0)
    stamps: list[float] = []
    tool_s: list[float] = []
    seen: list[dict] = []  # TRL's logged metrics (tools/call_frequency among them)

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kw):
            stamps.append(time.perf_counter())
            snaps.maybe_take(model)
            if snaps.over():
                control.should_training_stop = True

        def on_log(self, args, state, control, logs=None, **kw):
            seen.append(dict(logs or {}))

    lim = Limits(wall_s=LIMITS["wall_s"], cpu_s=LIMITS["cpu_s"], memory_mb=LIMITS["memory_mb"],
                 max_output_bytes=LIMITS["output_bytes"])
    tok = trl_tokenizer(a.mdir, a.tiny)
    model = AutoModelForCausalLM.from_pretrained(a.mdir, dtype=torch.float32)
    env = python_env(lim, tool_s, seed)
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=cfg, train_dataset=Dataset.from_list(rows),
                          processing_class=tok, callbacks=[Clock()], environment_factory=env)
    trainer.remove_callback(PrinterCallback)  # its per-step dicts on stdout: TRL's figures are kept in the JSON
    snaps = Snapshots(a.minutes * 60)  # the clock starts here for TRL: after model load, before step 1
    t0 = time.perf_counter()
    trainer.train()
    train_s = time.perf_counter() - t0
    wall = snaps.elapsed()
    snaps.maybe_take(trainer.model, final=True)
    if trainer.chat_template is not None:  # TRL trained with its prefix-preserving copy: play held-out with it
        tok.chat_template = trainer.chat_template
    ecfg = EpisodesConfig(tools=[{"name": "python", "session": "per_episode", "limits": LIMITS}], format="chat",
                          max_turns=a.max_turns, max_tool_calls=a.max_turns - 1,
                          max_observation_tokens=a.max_observation_tokens, max_episode_tokens=a.max_episode_tokens,
                          eval_tools_off=False)
    with rendered_like_trl(get_json_schema(env().python)):
        acc = score(snaps, trainer.model, tok, eval_set, a, ecfg, episodes.Tools.from_spec(ecfg, seed))
    calls = [x.get("tools/call_frequency") for x in seen if "tools/call_frequency" in x]
    return {"steps": len(stamps), "wall_s": wall, "accuracy": acc[1.0], "accuracy_at": acc,
            "s_per_step": statistics.median([b - x for x, b in zip(stamps, stamps[1:])] or [wall]),
            "tool_time_frac": sum(tool_s) / max(train_s, 1e-9), "tool_calls_total": len(tool_s),
            "tool_call_frequency": statistics.fmean(calls) if calls else None}


# --- the sandbox's stateful session ---------------------------------------------------------------------------

def session_cost(n: int) -> dict[str, float]:
    """Milliseconds, medians over ``n``: a one-shot ``print(1)`` run; a session's start (a new session's first
    call, ``x = 41``); its next call, which needs the state (``print(x + 1)``: the replay of the first cell
    and the cell), checked to print 42; and the same two calls for 32 sessions at once over the pool."""
    import sandbox
    from sandbox import Limits
    from sandbox.session import PythonSession, run_sessions

    lim = Limits(wall_s=4.0)
    sandbox.run_many([b"print(1)"] * 4, lim)  # the pool's jails start outside the timing
    one, start, call = [], [], []
    kept = True
    for i in range(n):
        t = time.perf_counter()
        assert sandbox.run(b"print(1)", b"", lim).stdout == b"1\n"
        one.append(time.perf_counter() - t)
        s = PythonSession(lim, seed=i)
        t = time.perf_counter()
        s.call("x = 41")
        start.append(time.perf_counter() - t)
        t = time.perf_counter()
        r = s.call("print(x + 1)")
        call.append(time.perf_counter() - t)
        kept &= r.stdout == b"42\n"
    many = [PythonSession(lim, seed=k) for k in range(32)]
    t = time.perf_counter()
    run_sessions([(s, "x = 41") for s in many], lim)
    rs = run_sessions([(s, "print(x + 1)") for s in many], lim)
    batch = (time.perf_counter() - t) / 64
    kept &= all(r.stdout == b"42\n" for r in rs)
    ms = lambda xs: 1000 * statistics.median(xs)  # noqa: E731
    return {"print1_ms": ms(one), "session_start_ms": ms(start), "session_call_ms": ms(call),
            "session_batched_ms_per_call": 1000 * batch, "state_kept": int(kept), "n": n}


# --- the run -------------------------------------------------------------------------------------------------

def plot(res: dict, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    names = {"single": "rlvr GRPO, single turn", "tool": "rlvr GRPO, episodes + Python tool",
             "trl": "TRL GRPOTrainer + its tool loop"}
    for arm, style in zip(ARMS, ("o-", "s-", "^--")):
        runs = res["arms"].get(arm)
        if not runs:  # not run, or the run stopped before it finished
            continue
        xs = [0.0] + [f * statistics.fmean(r["wall_s"] for r in runs) / 60 for f in FRACTIONS]
        ys = [statistics.fmean(res["start"][arm])] + [statistics.fmean(r["accuracy_at"][f] for r in runs)
                                                      for f in FRACTIONS]
        ax.plot(xs, ys, style, label=f"{names[arm]} ({statistics.fmean(r['steps'] for r in runs):.0f} steps)")
    ax.set_title(title)
    ax.set_xlabel("minutes of training (mean over seeds)")
    ax.set_ylabel("held-out accuracy (greedy, strict)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--minutes", type=float, default=30.0, help="wall-clock training budget per arm per seed")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--first-seed", type=int, default=0, help="seeds --first-seed .. + --seeds - 1 (one process per "
                    "seed side by side, then --merge)")
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--eval-size", type=int, default=100)
    ap.add_argument("--shots", type=int, default=2, choices=range(len(SHOTS) + 1),
                    help="worked examples in every prompt (0: the system line alone says how to call the tool)")
    ap.add_argument("--train-size", type=int, default=2000)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=4, help="prompts per step")
    ap.add_argument("--lr", type=float, default=5e-6)
    ap.add_argument("--max-new-tokens", type=int, default=40, help="one model turn")
    ap.add_argument("--max-turns", type=int, default=3)
    ap.add_argument("--max-episode-tokens", type=int, default=160)
    ap.add_argument("--max-observation-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--micro-rows", type=int, default=None, help="episodes per forward/backward for every arm (ours: "
                    "algo.micro_batch_size; TRL: per_device_train_batch_size with gradient accumulation over the "
                    "step's prompts x group); the step is the same, only its memory changes")
    ap.add_argument("--session-reps", type=int, default=50)
    ap.add_argument("--quick", action="store_true", help="builtin:tiny-tool on a+b, 1 minute per arm, 1 seed")
    ap.add_argument("--smoke", action="store_true", help="builtin:tiny-tool, 3 s per arm, 8 held out: checks the "
                    "script runs end to end (seconds; not a measurement)")
    ap.add_argument("--out", default=None, help="where the JSON and the PNG go (default bench/results; --smoke: a "
                    "temporary folder, its figures are not results)")
    ap.add_argument("--models", default=os.environ.get("RLVR_MODELS", str(REPO / ".cache" / "models")))
    ap.add_argument("--merge", nargs="*", default=[], metavar="JSON", help="no training: the arms of earlier runs "
                    "(e.g. each arm in its own process, --arms), same setup, into one JSON, plot and last line")
    a = ap.parse_args()
    if a.merge:
        (out := Path(a.out or REPO / "bench" / "results")).mkdir(parents=True, exist_ok=True)
        return merge(a.merge, out)
    if a.quick or a.smoke:
        a.model, a.seeds, a.threads, a.lr = "builtin:tiny-tool", 1, 1, 3e-4  # examples/jobs/demo-tools.yaml
        a.minutes, a.eval_size, a.train_size = (1.0, 200, 2000) if a.quick else (0.05, 8, 64)
        a.group_size, a.prompts = (8, 8) if a.quick else (4, 2)
        a.max_new_tokens, a.max_episode_tokens, a.max_observation_tokens, a.max_turns = 32, 80, 24, 2
        a.session_reps = 20 if a.quick else 3
    a.tiny = a.model.startswith("builtin:")
    arms = [x for x in ARMS if x in a.arms.split(",")]
    torch.set_num_threads(a.threads)
    a.models = Path(a.models)
    a.mdir = model_dir(a.model, a.models)
    t_start, load = time.time(), os.getloadavg()[0]
    cost = session_cost(a.session_reps)
    print(f"session cost: {cost}", file=sys.stderr, flush=True)
    train_p, eval_p = problems(a.train_size, a.eval_size, a.tiny)
    res = {"config": {k: str(v) for k, v in vars(a).items()}, "session": cost, "load1_at_start": load,
           "start": {x: [] for x in arms}, "arms": {x: [] for x in arms}}
    out = Path(a.out or (tempfile.mkdtemp(prefix="episodes-smoke-") if a.smoke else REPO / "bench" / "results"))
    out.mkdir(parents=True, exist_ok=True)
    stem = "episodes-smoke" if a.smoke else "episodes-quick" if a.quick else "episodes"
    with tempfile.TemporaryDirectory(prefix="episodes-bench-") as tmp:
        work = Path(tmp)
        files, evals = {}, {}
        for arm in arms:
            evals[arm] = samples(eval_p, arm, a.tiny, a.shots)
            for name, rows in ((arm, samples(train_p, arm, a.tiny, a.shots)), (arm + "-eval", evals[arm][:4])):
                files[name] = work / f"{name}.jsonl"
                files[name].write_text("".join(json.dumps(r) + "\n" for r in rows))
        for seed in range(a.first_seed, a.first_seed + a.seeds):
            for arm in arms:
                gc.collect()
                if seed == a.first_seed:  # before training: a run stopped early still has every started arm's start
                    res["start"][arm].append(start_accuracy(a, arm, evals[arm]))
                    print(f"{arm}: held-out start {res['start'][arm][0]:.3f}", file=sys.stderr, flush=True)
                    (out / f"{stem}.json").write_text(json.dumps(res, indent=1, default=str))
                if arm == "trl":
                    r = run_trl(a, seed, samples(train_p, "trl", a.tiny, a.shots), evals[arm], work)
                else:
                    r = run_ours(arm, a, seed, files, work, evals[arm])
                res["arms"][arm].append({"seed": seed, **r})
                print(f"seed {seed} {arm}: start {res['start'][arm][-1]:.3f} {r}", file=sys.stderr, flush=True)
                (out / f"{stem}.json").write_text(json.dumps(res, indent=1, default=str))
    res["total_s"] = time.time() - t_start
    (out / f"{stem}.json").write_text(json.dumps(res, indent=1, default=str))
    plot(res, out / f"{stem}.png", f"3-4-digit arithmetic, {a.model}, {a.minutes:g} min per arm"
         if not a.tiny else f"a+b (tiny model), {a.minutes:g} min per arm")
    print_summary(res, arms, a, cost, out / f"{stem}.png")
    return 0


def merge(paths: list[str], out: Path) -> int:
    """Earlier runs' arms in one result: they must share the setup (what the held-out problems and the clock are).
    An arm's runs from several files are its seeds (a run written before runs carried their seed was seed 0); a
    seed twice for one arm is refused. Differences between arms are paired by seed."""
    same = ("model", "minutes", "eval_size", "shots", "group_size", "prompts", "lr", "max_new_tokens",
            "max_turns", "max_episode_tokens", "threads")
    res: dict = {}
    for p in paths:
        r = json.loads(Path(p).read_text())
        for arm_runs in r["arms"].values():
            for run in arm_runs:
                run["accuracy_at"] = {float(k): v for k, v in run["accuracy_at"].items()}
                run.setdefault("seed", 0)
        r["total_s"] = r.get("total_s", 0.0)  # a run stopped early wrote its finished arms, not its total
        if not res:
            res = r
            continue
        diff = [k for k in same if res["config"].get(k) != r["config"].get(k)]
        if diff:
            raise SystemExit(f"{p}: not the same setup as {paths[0]} ({', '.join(diff)} differ)")
        for arm in (x for x in r["arms"] if r["arms"][x]):
            twice = {run["seed"] for run in res["arms"].get(arm, [])} & {run["seed"] for run in r["arms"][arm]}
            if twice:
                raise SystemExit(f"{p}: arm {arm} seed {sorted(twice)} is in an earlier file too")
            res["arms"][arm] = res["arms"].get(arm, []) + r["arms"][arm]
            res["start"][arm] = res["start"].get(arm) or r["start"][arm]
        res["total_s"] += r["total_s"]
    for arm, runs in res["arms"].items():
        runs.sort(key=lambda run: run["seed"])
    seeds = {arm: [run["seed"] for run in runs] for arm, runs in res["arms"].items() if runs}
    if len({tuple(x) for x in seeds.values()}) > 1:
        raise SystemExit(f"the arms do not hold the same seeds: {seeds}")
    res["merged_from"] = paths
    arms = [x for x in ARMS if res["arms"].get(x)]
    cfg = res["config"]
    cfg["seeds"] = str(len(next(iter(seeds.values()))))
    a = argparse.Namespace(seeds=int(cfg["seeds"]), model=cfg["model"], minutes=float(cfg["minutes"]))
    stem = "episodes"
    (out / f"{stem}.json").write_text(json.dumps(res, indent=1, default=str))
    plot(res, out / f"{stem}.png", f"3-4-digit arithmetic, {a.model}, {a.minutes:g} min per arm")
    print_summary(res, arms, a, res["session"], out / f"{stem}.png")
    return 0


def start_accuracy(a, arm: str, eval_set: list[dict]) -> float:
    """The untrained model's held-out accuracy in the arm's own format (greedy: the same for every seed)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(a.mdir, dtype=torch.float32).eval()
    if arm == "single":
        return held_out(model, AutoTokenizer.from_pretrained(a.mdir), eval_set, a)
    cfg = EpisodesConfig(tools=[{"name": "python", "session": "per_episode", "limits": LIMITS}],
                         format="tags" if arm == "tool" else "chat", max_turns=a.max_turns,
                         observation=observation(a.tiny),
                         max_tool_calls=a.max_turns - 1, max_observation_tokens=a.max_observation_tokens,
                         max_episode_tokens=a.max_episode_tokens, eval_tools_off=False)
    tools = episodes.Tools.from_spec(cfg, 0)
    if arm == "tool":
        return held_out(model, AutoTokenizer.from_pretrained(a.mdir), eval_set, a, cfg, tools)
    from transformers.utils import get_json_schema

    tok = trl_tokenizer(a.mdir, a.tiny)
    with rendered_like_trl(get_json_schema(python_env(None, [], 0)().python)):
        return held_out(model, tok, eval_set, a, cfg, tools)


def print_summary(res: dict, arms: list[str], a, cost: dict, png: Path) -> None:
    final = {x: [r["accuracy"] for r in res["arms"][x]] for x in arms}
    mean = lambda xs: statistics.fmean(xs) if xs else float("nan")  # noqa: E731
    diff = lambda x, y: mean([p - q for p, q in zip(final[x], final[y])]) if x in final and y in final else float("nan")  # noqa: E731
    tool = res["arms"].get("tool", [])
    at = {x: {f: mean([r["accuracy_at"][f] for r in res["arms"][x]]) for f in FRACTIONS} for x in arms}
    above = int(all(at["tool"][f] > at["trl"][f] for f in FRACTIONS)) if {"tool", "trl"} <= set(arms) else -1
    print(json.dumps({"start": {x: res["start"][x][0] for x in arms}, "accuracy_at": at, "session": cost}))
    print(f"(total {res['total_s']:.0f} s, load1 at start {res['load1_at_start']:.1f})", flush=True)
    print(f"tool_gain={diff('tool', 'single'):+.3f} "
          f"single_turn_gain={mean([f - res['start']['single'][0] for f in final.get('single', [])]):+.3f} "
          f"trl_tool_gain={diff('trl', 'single'):+.3f} "
          f"tool_time_frac={mean([r['tool_time_frac'] for r in tool]):.4f} "
          f"token_mismatches={sum(r['token_mismatches'] for r in tool)} seeds={a.seeds} model={a.model} "
          f"tool_acc={mean(final.get('tool', [])):.3f} single_acc={mean(final.get('single', [])):.3f} "
          f"trl_acc={mean(final.get('trl', [])):.3f} above_trl_every_mark={above} "
          f"trl_tool_time_frac={mean([r['tool_time_frac'] for r in res['arms'].get('trl', [])]):.4f} "
          f"print1_ms={cost['print1_ms']:.1f} session_start_ms={cost['session_start_ms']:.1f} "
          f"session_call_ms={cost['session_call_ms']:.1f} session_batched_ms={cost['session_batched_ms_per_call']:.1f} "
          f"state_kept={cost['state_kept']} minutes={a.minutes:g} png={png}")


if __name__ == "__main__":
    sys.exit(main())
