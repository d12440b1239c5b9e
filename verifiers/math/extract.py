"""Find the final answer in a completion (whole chain of thought or a bare answer).

Order: inside the last ``<answer>...</answer>`` when there is one (R1 / reasoning-gym format); the
last ``\\boxed{}``/``\\fbox{}`` (boxes separated only by commas or "and" are one listed answer; when
the reference lists n values, up to n boxes within one sentence) unless a "final answer is" /
"answer is" / "Answer:" / "####" comes after it, then that marker, then the concluding statement
(its last "is"/"="/"it's" value, formula or lone number). Inline math after a marker does not run
over a line break; "I hope it is correct." and chat-template tokens after the answer are ignored.
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
_STATES = re.compile(r"=|\b(?:is|equals|get|be)\b|\b(?:[Ii]t|[Tt]hat|[Tt]his)'s\b")
_CHAT_TOKENS = re.compile(r"<\|[a-z_]+\|>(?:user|assistant|system)?|</?s>|<\|endoftext\|>")
# "\frac" written in a non-raw string literal arrives as form feed + "rac"; these control characters
# never occur in real text, so the lost backslash is restored (tab, CR and newline are real whitespace)
_LOST_ESCAPES = re.compile(r"[\x07\x08\x0b\x0c](?=[a-zA-Z])")
_LOST = {"\x07": "\\a", "\x08": "\\b", "\x0b": "\\v", "\x0c": "\\f"}
_BOILERPLATE = re.compile(r"(?:\s*I hope (?:it|this|that) (?:is correct|helps)\s*[.!]?)+\s*$", re.IGNORECASE)
# a number as people write it: 1,234.5  1.234,5  1'234  0,5  -3.25
NUMBER = (r"-?\d+\s+\d+/\d+|-?\d+/\d+"  # 3 1/2, 1/2
          r"|-?\d{1,3}(?:[,.' ](?=\d{3}(?!\d))\d{3})+(?:[.,]\d+)?|-?\d+(?:[.,]\d+)?")


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


def _boxes(text: str) -> tuple[list[tuple[int, int, str]], int]:
    """Closed boxes as (start, end, content), and where the content of a last box that never closes
    starts (-1 when it closes)."""
    found, open_at, pairs = [], -1, None
    for m in _BOX.finditer(text):
        if found and m.start() < found[-1][1]:
            continue  # a box nested inside the previous one
        if m.end() < len(text) and text[m.end()] == "{":
            pairs = _brace_pairs(text) if pairs is None else pairs
            end = pairs.get(m.end(), -1)
            if end < 0:
                open_at = m.end() + 1
                continue
            found.append((m.start(), end, text[m.end() + 1:end - 1]))
        else:  # \boxed 5
            tail = re.match(r"[^\s$.,]+", text[m.end():m.end() + 200])
            if tail:
                found.append((m.start(), m.end() + tail.end(), tail.group()))
        open_at = -1
    return found, open_at


# what may stand between boxes that together state one answer, and what ends that run
_BOX_BREAK = re.compile(r"\n|[.!?]\s+[A-Z]|\b(?:wait|but|no|actually|hmm)\b", re.IGNORECASE)


def _joined_boxes(text: str, boxes: list, want: int) -> list:
    """The last box plus the boxes just before it that belong to the same answer: those separated
    only by commas / "and" (\\boxed{1} and \\boxed{2}), and, while fewer than ``want`` boxes are
    found, those separated by a short phrase within the same sentence ("for part (a) and")."""
    answers = [boxes[-1]]
    for prev in reversed(boxes[:-1]):
        gap = text[prev[1]:answers[0][0]]
        if not (len(gap) <= 40 and _BOX_JOIN.fullmatch(gap)) and (
                len(answers) >= want or len(gap) > 100 or _BOX_BREAK.search(gap)):
            break
        answers.insert(0, prev)
    return answers


def _inline_end(rest: str, open_: str, close: str) -> int:
    """Index of the closing delimiter of a math segment opened at 0, or -1. An escaped \\$ is a
    dollar sign inside the formula, not its end."""
    if close == "$":
        m = re.compile(r"(?<!\\)\$").search(rest, len(open_))
        return m.start() if m else -1
    return rest.find(close, len(open_))


_SEGMENTS = (("$$", "$$"), ("$", "$"), (r"\(", r"\)"), (r"\[", r"\]"))
_CONNECTOR = re.compile(r"\s*(?:,|;|\band\b|\bor\b|\\text\{\s*(?:and|or)\s*\})\s*")


def _math_segment(rest: str) -> str:
    """Answer text after a marker: a leading $...$ / \\(...\\) segment (several joined by "and" /
    commas: "$12$ and $13$"), else up to the sentence end. Inline math ($...$, \\(...\\)) does not
    run over a line break, as in the Markdown renderers models write for; display math may."""
    rest = re.sub(r'^[\s"\u201c\u201d\']*(?:\\")?', "", rest)  # "The final answer is \"$12$\""
    parts = []
    while True:
        for open_, close in _SEGMENTS:
            if rest.startswith(open_):
                end = _inline_end(rest, open_, close)
                if end < 0 and open_ == "$" and not parts:
                    continue  # "$1,234.50" with no closing $: a dollar sign, not math
                inner = rest[len(open_):end] if end >= 0 else ""
                if open_ in ("$", r"\(") and "\n" in inner:
                    inner = ""
                if not inner.strip():
                    return ", ".join(parts)
                parts.append(inner.strip())
                rest = rest[end + len(close):]
                break
        else:
            if parts:
                return ", ".join(parts)
            break
        joint = _CONNECTOR.match(rest)
        if not joint or not rest[joint.end():].startswith(("$", r"\(")):
            return ", ".join(parts)
        rest = rest[joint.end():]
    rest = rest.split("\n", 1)[0]
    # cut at the sentence end, not a decimal point; or at the start of a justification
    m = re.search(r"\.(?:\s|$)|,?\s+(?:because|since|which|as|so that|where|i\.e\.|e\.g\.)(?:\s|\b)", rest)
    return rest[:m.start()] if m else rest


def restore_escapes(text: str) -> str:
    return _LOST_ESCAPES.sub(lambda m: _LOST[m.group()], text) if _LOST_ESCAPES.search(text) else text


def extract_answer(text: str, want: int = 1, gold: bool = False) -> tuple[str | None, str]:
    """(answer or None, how it was found / why not). ``want``: how many boxes may make up the answer
    (the number of values the reference lists). ``gold``: the text is a reference solution, trusted:
    all its boxes together are the answer, and a box left open runs to the end."""
    text = restore_escapes(text)
    if "</think>" in text:
        text = text.rsplit("</think>", 1)[1]
    elif "<think>" in text:
        return None, "unfinished <think> block"
    text = _BOILERPLATE.sub("", _CHAT_TOKENS.sub("", text[-50000:]))  # "<|im_start|>user" after the answer
    if "<answer>" in text:  # the R1 / reasoning-gym answer tag: the answer is inside the last one
        inside = text.rsplit("<answer>", 1)[1]
        if "</answer>" not in inside:
            return None, "unclosed <answer> (truncated output)"
        text = inside.split("</answer>", 1)[0].strip()
        if not text:
            return None, "empty <answer>"
        if "\n" not in text and not _BOX.search(text) and not _MARKERS.search(text):
            return text.strip("$").strip(), "answer tag"
    boxes, open_at = _boxes(text)
    if gold and (boxes or open_at >= 0):  # "\\boxed{1} papers and \\boxed{2} bins" lists two values
        parts = [b[2] for b in _joined_boxes(text, boxes, len(boxes))] if boxes else []
        parts += [text[open_at:]] if open_at >= 0 else []
        return ", ".join(dict.fromkeys(p.strip() for p in parts)), "boxed"
    if open_at >= 0:
        return None, "unclosed \\boxed{} (truncated output)"
    tail_start = max(0, len(text) - 20000)
    markers = list(_MARKERS.finditer(text, tail_start))
    if boxes and not (markers and markers[-1].start() >= boxes[-1][1]):  # a later "final answer is" wins
        answers = _joined_boxes(text, boxes, want)
        parts = list(dict.fromkeys(a[2].strip() for a in answers))  # \boxed{3} and \boxed{3} is one answer
        return ", ".join(parts), "boxed"
    if markers:
        answer = _math_segment(text[markers[-1].end():]).strip()
        if re.search(r"[a-zA-Z]{3,}", re.sub(r"\\[a-zA-Z]+(?:\{[^{}]*\})?|\$[^$]*\$", "", answer)):
            answer = _from_sentence(answer) or answer  # "Final Answer: The largest $n$ is 34."
        return (answer, "marker") if answer else (None, "answer marker with nothing after it")
    return _conclusion(text)


# a sentence ends at . ! ? (also when a display formula ends with it: "... \\geq 2.$$ Therefore")
_SENTENCE = re.compile(r"(?:(?<=[.!?])|(?<=[.!?]\$)|(?<=[.!?]\$\$))\s+(?=[A-Z])")


_GLUED = re.compile(r"\\[a-zA-Z]+|(?<=\d)(?:or|and)(?=[A-Z(])")  # commands, and "1orW(x)=-1"


def _conclusion(text: str) -> tuple[str | None, str]:
    lines = [ln.strip() for ln in text[-2000:].strip().splitlines() if ln.strip()]
    if not lines:
        return None, "empty completion"
    last = lines[-1]
    bare = last.strip("$").strip()
    if bare and len(bare) <= 40 and (
            re.match(r"-?\d", bare) or not re.search(r"[a-zA-Z]{2,}", _GLUED.sub("", bare))):
        return bare.rstrip("."), "bare answer"  # "19", "$\frac{1}{2}$", "28 percent"
    sentence = _SENTENCE.split(last)[-1]
    answer = _from_sentence(sentence)
    if not re.search(r"[.!$]\s*$", last) and (
            len(text.strip()) > 200 or not answer or re.search(r"[a-zA-Z]{3,}", answer)):
        # no closing punctuation: only a short statement that ends in a bare value counts
        return None, "no final answer (output looks truncated)"
    return (answer, "concluding statement") if answer else (None, "no final answer found")


def _from_sentence(sentence: str) -> str | None:
    """The answer a concluding sentence states: the value after its last "is"/"="/"it's" if that
    value has a digit or formula ("The largest $n$ is 34."), else its last formula ("Thus $x \\le 2$
    is our answer."), else its only number ("So there are 12 students.")."""
    maths = list(re.finditer(r"(?<!\\)\$([^$]+)(?<!\\)\$|\\\((.+?)\\\)", sentence))
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
    numbers = re.findall(rf"(?<![\w.,'/])(?:{NUMBER})(?![\w/])", sentence)
    return numbers[0] if len(numbers) == 1 else None
