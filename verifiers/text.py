"""Small text verifiers: ``format``, ``string_check`` (alias ``exact``), ``multiple_choice``, ``length_penalty``.

Pure functions of (completion, reference) with the standard library only, so they are cheap enough to
run in any process. Regexes come from the job's own config (the job owner's, not the model's); the
model's completion is only ever the subject of a match, and its length is bounded by ``max_new_tokens``.
"""
from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from .base import BaseVerifier, Status, Verdict, VerifierConfig


def _regex(pattern: str | None, flags: int = 0) -> str | None:
    if pattern is not None:
        try:
            re.compile(pattern, flags)
        except re.error as e:
            raise ValueError(f"invalid regex {pattern!r}: {e}") from None
    return pattern


def _pass(ok: bool, why_ok: str, why_not: str, **details: Any) -> Verdict:
    return Verdict(1.0, Status.correct, why_ok, details) if ok else Verdict(0.0, Status.wrong, why_not, details)


# ---------------------------------------------------------------------------------------- format
class FormatVerifier(BaseVerifier):
    name = "format"
    version = "1"
    description = ("1 when the completion has the required shape: a regex and/or tags in order "
                   "(e.g. <think>…</think> then an answer), else 0. Ignores the reference.")

    class Config(VerifierConfig):
        pattern: str | None = Field(None, max_length=2000, description="Regex the completion must match.")
        match: Literal["search", "fullmatch"] = Field("search", description="How `pattern` is applied.")
        tags: list[str] = Field(default_factory=list, max_length=16,
                                description="Tag names that must each appear once, in this order, as <t>…</t>.")
        answer_after: bool = Field(False, description="Require non-blank text after the last closing tag.")
        strict: bool = Field(False, description="Only whitespace allowed before and between the tags.")

        @field_validator("pattern")
        @classmethod
        def _valid_pattern(cls, v: str | None) -> str | None:
            return _regex(v, re.DOTALL)

        @field_validator("tags")
        @classmethod
        def _tag_names(cls, v: list[str]) -> list[str]:
            for t in v:
                if not re.fullmatch(r"[A-Za-z][\w\-]{0,63}", t):
                    raise ValueError(f"tag {t!r} is not a plain tag name")
            return v

        @model_validator(mode="after")
        def _something(self) -> "FormatVerifier.Config":
            if self.pattern is None and not self.tags:
                raise ValueError("give `pattern`, `tags` or both")
            return self

    config: Config

    def verify(self, completion: str, reference: Any) -> Verdict:
        c, text = self.config, completion or ""
        if c.pattern is not None:
            m = (re.fullmatch if c.match == "fullmatch" else re.search)(c.pattern, text, re.DOTALL)
            if m is None:
                return Verdict(0.0, Status.wrong, f"does not {c.match} the pattern")
        pos, gaps = 0, []
        for t in c.tags:
            opens = [m.start() for m in re.finditer(f"<{t}>", text)]
            closes = [m.start() for m in re.finditer(f"</{t}>", text)]
            if len(opens) != 1 or len(closes) != 1:
                return Verdict(0.0, Status.wrong, f"<{t}>…</{t}> must appear exactly once "
                                                  f"({len(opens)} open, {len(closes)} close)")
            start, end = opens[0], closes[0]
            if start < pos or end < start:
                return Verdict(0.0, Status.wrong, f"<{t}> is out of order or not closed")
            gaps.append(text[pos:start])
            pos = end + len(f"</{t}>")
        if c.strict and any(g.strip() for g in gaps):
            return Verdict(0.0, Status.wrong, "text outside the required tags")
        if c.answer_after and not text[pos:].strip():
            return Verdict(0.0, Status.wrong, "no answer after the last tag")
        return Verdict(1.0, Status.correct, "format ok")


# ---------------------------------------------------------------------------------------- string_check
class StringCheckVerifier(BaseVerifier):
    name = "string_check"
    version = "1"
    description = ("Compares the completion (or the part a regex extracts) with the reference string: "
                   "eq, ne or contains, optionally case-insensitive. Alias: `exact`.")

    class Config(VerifierConfig):
        operation: Literal["eq", "ne", "contains"] = "eq"
        ignore_case: bool = False
        strip: bool = Field(True, description="Trim surrounding whitespace on both sides first.")
        extract: str | None = Field(None, max_length=2000, description=(
            "Regex applied to the completion; its first group (or whole match) is compared. "
            "No match: unparseable. E.g. `<answer>(.*?)</answer>`."))

        @field_validator("extract")
        @classmethod
        def _valid_extract(cls, v: str | None) -> str | None:
            return _regex(v, re.DOTALL)

    config: Config

    def verify(self, completion: str, reference: Any) -> Verdict:
        c, text = self.config, completion or ""
        if not isinstance(reference, str):
            return Verdict(0.0, Status.error, f"reference must be a string, not {type(reference).__name__}")
        if c.extract is not None:
            found = list(re.finditer(c.extract, text, re.DOTALL))
            if not found:
                return Verdict(0.0, Status.unparseable, "extract pattern found nothing")
            m = found[-1]  # the last one: models often restate the question's format before answering
            text = m.group(1) if m.re.groups else m.group(0)
        ref = reference
        if c.strip:
            text, ref = text.strip(), ref.strip()
        if c.ignore_case:
            text, ref = text.casefold(), ref.casefold()
        ok = {"eq": text == ref, "ne": text != ref, "contains": ref in text}[c.operation]
        return _pass(ok, f"{c.operation} holds", f"{c.operation} does not hold")


# ---------------------------------------------------------------------------------------- multiple_choice
_MC_PATTERNS = [  # most explicit first; within one pattern the last match wins (the final answer)
    r"<answer>\s*\(?([{L}])\)?\s*</answer>",
    r"\\boxed\{\s*\(?([{L}])\)?\s*\}",
    r"(?i:answer)\s*(?:is|:)?\s*[:\-]?\s*\**\(?([{L}])\)?(?![A-Za-z])",
    r"(?:^|\n)\s*\**\(?([{L}])\)?\**\s*[.):]?\s*(?:$|\n)",
    r"\(([{L}])\)",
]


class MultipleChoiceVerifier(BaseVerifier):
    name = "multiple_choice"
    version = "1"
    description = ("Extracts the chosen letter (`Answer: B`, `(B)`, `\\boxed{B}`, `<answer>B</answer>`, "
                   "a line with just `B`) and compares it with the reference letter.")

    class Config(VerifierConfig):
        choices: str = Field("ABCD", min_length=2, max_length=26, pattern=r"^[A-Z]+$",
                             description="The valid option letters.")

    config: Config

    def verify(self, completion: str, reference: Any) -> Verdict:
        letters = self.config.choices
        gold = str(reference).strip().strip("()").strip().upper() if reference is not None else ""
        if gold not in letters or len(gold) != 1:
            return Verdict(0.0, Status.error, f"reference {reference!r} is not one of {letters}")
        for pat in _MC_PATTERNS:
            found = re.findall(pat.replace("{L}", letters), completion or "")
            if found:
                pred = found[-1]
                return _pass(pred == gold, f"chose {pred}", f"chose {pred}, expected {gold}", choice=pred)
        return Verdict(0.0, Status.unparseable, "no option letter found")


# ---------------------------------------------------------------------------------------- length_penalty
class LengthPenaltyVerifier(BaseVerifier):
    name = "length_penalty"
    version = "1"
    description = ("1 inside [min_len, max_len] (characters or words), falling linearly to 0 over `ramp` "
                   "units outside it. Ignores the reference; combine it with `multi` or a weight.")

    class Config(VerifierConfig):
        unit: Literal["chars", "words"] = "chars"
        min_len: int = Field(0, ge=0)
        max_len: int = Field(..., ge=1)
        ramp: int | None = Field(None, ge=1, description="Units over which the score falls to 0 "
                                                          "(default: max_len).")

        @model_validator(mode="after")
        def _order(self) -> "LengthPenaltyVerifier.Config":
            if self.min_len > self.max_len:
                raise ValueError("min_len must be <= max_len")
            return self

    config: Config

    def verify(self, completion: str, reference: Any) -> Verdict:
        c, text = self.config, completion or ""
        n = len(text.split()) if c.unit == "words" else len(text)
        over = max(c.min_len - n, n - c.max_len, 0)
        score = max(0.0, 1.0 - over / (c.ramp or c.max_len))
        status = Status.correct if over == 0 else Status.wrong
        return Verdict(score, status, f"{n} {c.unit}", {"length": n})
