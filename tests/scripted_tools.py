"""A rollout engine that plays scripted tool-using turns, for tests of trainer.episodes and the online step.

The prompt is "a*b" (any of + - *). Each call's continuation is decided by the episode's text so far and a
hash of (prompt, row, turn), so the same run samples the same episodes:
- a first turn writes ``<code>\\nprint(a*b)\\n</code>`` (generation stops at the closing tag, as a stop string
  does), a wrong program, or answers at once (wrong, usually: ``\\boxed{a*b+1}``);
- after an ``<output>…</output>`` it answers ``\\boxed{<the number in the output>}`` and ends the turn (EOS).
In the chat format (``CHAT = True``) calls are ``<tool_call>{"name": "python", …}</tool_call>`` after a
``<think>…</think>`` that ``REWRITING_TEMPLATE`` drops from earlier turns: a history rewrite (one fork).

The log-probs it reports are the sampling model's own at the call's temperature (one forward over the
call's prompt + completion), as a sampler computing in the trainer's dtype would report them.
"""
from __future__ import annotations

import hashlib
import json
import re

import torch

CHAT = False
# what a turn writes past its closing tag in the same token (SmolLM2's ``><``): "" or e.g. "<"
STRAY = ""
# Qwen3's habit: an assistant turn's <think>…</think> is not rendered again once the conversation moved on
REWRITING_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'assistant' %}<|assistant|>"
    "{% if loop.last %}{{ m['content'] }}{% else %}{{ m['content'].split('</think>')[-1] }}{% endif %}<|end|>"
    "{% elif m['role'] == 'tool' %}<|user|>output: {{ m['content'] }}"
    "{% else %}<|user|>{{ m['content'] }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def _h(*parts) -> int:
    return int(hashlib.sha1("|".join(map(str, parts)).encode()).hexdigest(), 16)


def question(text: str) -> tuple[int, str, int]:
    m = re.search(r"(\d+)\s*([-+*])\s*(\d+)", text)
    return int(m.group(1)), m.group(2), int(m.group(3))


def next_turn(prompt_text: str, so_far: str, key: int) -> tuple[str, bool]:
    """(text of the next turn, whether it ends the reply with EOS)."""
    a, op, b = question(prompt_text)
    truth = {"+": a + b, "-": a - b, "*": a * b}[op]
    out = re.findall(r"(?:<output>\n|output: )(-?\d+)", so_far)
    if out:
        return f"\\boxed{{{out[-1]}}}", True
    if "Error" in so_far or "error" in so_far:
        return f"\\boxed{{{truth + 1}}}", True
    pick = key % 4
    if pick == 3:
        return f"\\boxed{{{truth + key % 5}}}", True  # no tool: right when key % 5 == 0
    code = f"print({a}{op}{b})" if pick != 2 else f"print({a}{op}{b}+1)"
    if CHAT:
        call = json.dumps({"name": "python", "arguments": {"code": code}})
        return f"<think>try</think><tool_call>{call}</tool_call>", False
    return f"<code>\n{code}\n</code>{STRAY}", False


class ScriptedToolEngine:
    def __init__(self, model, tokenizer, **_):
        self.model, self.tok = model, tokenizer
        self.calls = 0

    def generate(self, prompts, n, params):
        from trainer.rollout import render_prompt

        ids = [self.tok(render_prompt(self.tok, p), add_special_tokens=False)["input_ids"] for p in prompts]
        return self.generate_ids(ids, n, params)

    @torch.no_grad()
    def generate_ids(self, ids, n, params, stops=None):
        from trainer.batch import forward
        from trainer.rollout import Rollout, left_pad, left_pad_mask

        eos, pad = self.tok.eos_token_id, self.tok.pad_token_id
        prompts, rows, cut = [], [], []
        for r, p in enumerate(ids):
            text = self.tok.decode(p, skip_special_tokens=False)
            first = text.split("<|assistant|>")[0]
            for j in range(n):
                turn, ends = next_turn(first, text, _h(first, r * n + j, text.count("<|assistant|>"), len(text)))
                c = self.tok(turn, add_special_tokens=False)["input_ids"] + ([eos] if ends else [])
                cut.append(len(c) > params.max_new_tokens)
                prompts.append(p)
                rows.append(c[: params.max_new_tokens])
        self.calls += 1
        T = max(map(len, rows))
        comp = torch.tensor([x + [pad] * (T - len(x)) for x in rows])
        mask = torch.tensor([[1] * len(x) + [0] * (T - len(x)) for x in rows])
        ro = Rollout(left_pad(prompts, pad), left_pad_mask(prompts, 0), comp, mask,
                     self.tok.batch_decode(comp.masked_fill(mask == 0, pad), skip_special_tokens=True),
                     torch.tensor(cut))
        ro.logprobs = forward(self.model, ro, params.temperature).logp.float() * mask
        return ro


def install() -> None:
    """The async producer's prelude (RLVR_PRODUCER_PRELUDE=tests.scripted_tools:install)."""
    from trainer import engines

    engines.ENGINES["hf"] = ScriptedToolEngine
