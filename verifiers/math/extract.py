"""Find the final answer in a completion (whole chain of thought or a bare answer).

Order: the last ``\\boxed{}``/``\\fbox{}`` (boxes separated only by commas or "and" are one listed
answer) unless a "final answer is" / "answer is" / "Answer:" / "####" comes after it, then that
marker, then the concluding statement (its last "is"/"=" value, formula or lone number).
Reasoning inside ``<think>`` is ignored; an unfinished think block or an unclosed final box means
the output was truncated, and a truncated output has no answer.
Everything here is linear in the input: the worst 200k-character completions take about 0.1 s.
"""
from __future__ import annotations

import re

_BOX = re.compile(r"\\(?:boxed|fbox)\s*")
_BRACE = re.compile(r"\\.|[{}]", re.DOTALL)
_BOX_JOIN = re.compile(r"(?:[\s,;$.]|\\\)|\\\(|\\quad|\\text\{\s*(?:and|or|,)?\s*\}|and\b|or\b)*")
_MARKERS = re.compile(
    r"(?:final answer(?: is)?|answer is|answer\s*:|answer\s*=|answer(?=\s*(?:\$|\\\(|\\\[))|####)\s*:?\s*",
    re.IGNORECASE
)
_STATES = re.compile(r"=|\b(?:is|equals|get|be)\b")
_CHAT_TOKENS = re.compile(r"<\|[a-z_]+\|>(?:user|assistant|system)?|</?s>|<\|endoftext\|>")


def _brace_pairs(text: str) -> dict[int, int]:
    """Index of each "{" -> index just past its "}", in one pass (escaped braces skipped)."""
    pairs, stack, i = {}, [], 0
    while True:
        m = _BRACE.search(text, i)
        if not m:
            return pairs
        i = m.end()
        c = m.group()
        if c == "{":
            stack.append(m.start())
        elif c == "}" and stack:
            pairs[stack.pop()] = i


def _boxes(text: str) -> tuple[list[tuple[int, int, str]], bool]:
    """Closed boxes as (start, end, content), and whether the last box never closes."""
    found, truncated, pairs = [], False, None
    for m in _BOX.finditer(text):
        if found and m.start() < found[-1][1]:
            continue  # a box nested inside the previous one
        if m.end() < len(text) and text[m.end()] == "{":
            pairs = _brace_pairs(text) if pairs is None else pairs
            end = pairs.get(m.end(), -1)
            if end < 0:
                truncated = True
                continue
            found.append((m.start(), end, text[m.end() + 1:end - 1]))
        else:  # \boxed 5
            tail = re.match(r"[^\s$.,]+", text[m.end():m.end() + 200])
            if tail:
                found.append((m.start(), m.end() + tail.end(), tail.group()))
        truncated = False
    return found, truncated


def _math_segment(rest: str) -> str:
    """Answer text after a marker: a leading $...$ / \\(...\\) segment, else up to the sentence end."""
    rest = rest.strip()
    for open_, close in (("$$", "$$"), ("$", "$"), (r"\(", r"\)"), (r"\[", r"\]")):
        if rest.startswith(open_):
            end = rest.find(close, len(open_))
            return rest[len(open_):end] if end >= 0 else ""
    rest = rest.split("\n", 1)[0]
    m = re.search(r"\.(?:\s|$)|,?\s+(?:because|since|which|as|so that|where|i\.e\.|e\.g\.)(?:\s|\b)", rest)  # sentence end,
    return rest[:m.start()] if m else rest  # not a decimal point; or the start of a justification


def extract_answer(text: str) -> tuple[str | None, str]:
    """(answer or None, how it was found / why not)."""
    if "</think>" in text:
        text = text.rsplit("</think>", 1)[1]
    elif "<think>" in text:
        return None, "unfinished <think> block"
    text = _CHAT_TOKENS.sub("", text[-50000:])  # "<|im_start|>user" left after the answer
    boxes, truncated = _boxes(text)
    if truncated:
        return None, "unclosed \\boxed{} (truncated output)"
    tail_start = max(0, len(text) - 20000)
    markers = list(_MARKERS.finditer(text, tail_start))
    if boxes and not (markers and markers[-1].start() >= boxes[-1][1]):  # a later "final answer is" wins
        answers = [boxes[-1]]
        for prev in reversed(boxes[:-1]):
            gap = text[prev[1]:answers[0][0]]
            if len(gap) > 40 or not _BOX_JOIN.fullmatch(gap):
                break
            answers.insert(0, prev)
        parts = list(dict.fromkeys(a[2].strip() for a in answers))  # \boxed{3} and \boxed{3} is one answer
        return ", ".join(parts), "boxed"
    if markers:
        answer = _math_segment(text[markers[-1].end():]).strip()
        if re.search(r"[a-zA-Z]{3,}", re.sub(r"\\[a-zA-Z]+(?:\{[^{}]*\})?|\$[^$]*\$", "", answer)):
            answer = _from_sentence(answer) or answer  # "Final Answer: The largest $n$ is 34."
        return (answer, "marker") if answer else (None, "answer marker with nothing after it")
    return _conclusion(text)


def _conclusion(text: str) -> tuple[str | None, str]:
    lines = [ln.strip() for ln in text[-2000:].strip().splitlines() if ln.strip()]
    if not lines:
        return None, "empty completion"
    last = lines[-1]
    bare = last.strip("$").strip()
    if bare and len(bare) <= 40 and (
            re.match(r"-?[\d.,]+\b", bare) or not re.search(r"[a-zA-Z]{2,}", re.sub(r"\\[a-zA-Z]+", "", bare))):
        return bare.rstrip("."), "bare answer"  # "19", "$\frac{1}{2}$", "28 percent"
    sentence = re.split(r"(?<=[.!?])\s+(?=[A-Z])", last)[-1]
    answer = _from_sentence(sentence)
    if not re.search(r"[.!$]\s*$", last) and (
            len(text.strip()) > 200 or not answer or re.search(r"[a-zA-Z]{3,}", answer)):
        # no closing punctuation: only a short statement that ends in a bare value counts
        return None, "no final answer (output looks truncated)"
    return (answer, "concluding statement") if answer else (None, "no final answer found")


def _from_sentence(sentence: str) -> str | None:
    """The answer a concluding sentence states: the value after its last "is"/"=" if that value
    has a digit or formula ("The largest $n$ is 34."), else its last formula ("Thus $x \\le 2$ is
    our answer."), else its only number ("So there are 12 students.")."""
    maths = list(re.finditer(r"\$([^$]+)\$|\\\((.+?)\\\)", sentence))
    stated = None
    for stated in _STATES.finditer(sentence):  # the last "is" / "=": what follows is the value
        pass
    value = sentence[stated.end():].strip().rstrip(".!").strip() if stated else ""
    if stated and 0 < len(value) <= 80 and "=" not in value and (
            not maths or stated.start() >= maths[-1].end() and re.search(r"[\d\\]", value)):
        inner = re.fullmatch(r"\$([^$]+)\$|\\\((.+?)\\\)", value)
        return (inner.group(1) or inner.group(2)) if inner else value.replace("$", "")
    if maths:
        return maths[-1].group(1) or maths[-1].group(2)
    numbers = re.findall(r"(?<![\w.])-?\d[\d,]*(?:\.\d+)?(?![\w])", sentence)
    return numbers[0] if len(numbers) == 1 else None
