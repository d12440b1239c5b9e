"""Answer string -> normalised LaTeX -> AST. Pure regex and string work, linear in the input.

Conventions (documented because graders differ): ``\\%`` is dropped (MATH: "50\\%" is the number 50),
``^\\circ``/``°`` are dropped, units and currency words after a number are dropped, ``1,000`` /
``1\\,000`` / ``1{,}000`` / ``1 000`` / ``1'000`` are one thousand, ``1.234,5`` and ``1 234,5`` are
1234.5 (a decimal comma after grouped thousands), ``2\\frac{1}{2}`` and ``2 1/2`` are the mixed number
5/2, decimals are exact (0.333 is 333/1000), and a whole-word answer ("Monday", "(B)") is compared as
text. A lone ``1,5`` is ambiguous (the decimal 1.5 in much of the world, the list 1, 5 in MATH
answers): it parses to ``("amb", decimal, list)`` and the other side decides which reading applies.
Text that was escaped twice (``\\\\frac``, from JSON written into JSON) is read once-escaped.
"""
from __future__ import annotations

import re
from fractions import Fraction

from .latex import ParseError, parse_latex

MAX_ANSWER_CHARS = 1000  # longer "answers" are pasted derivations or attacks; never real gold

_UNICODE = {
    "\u2212": "-", "\u2013": "-", "\u2014": "-", "\u00d7": r"\times ", "\u22c5": r"\cdot ",
    "\u00b7": r"\cdot ", "\u00f7": r"\div ", "\u00bd": r"\frac{1}{2}", "\u2153": r"\frac{1}{3}",
    "\u2154": r"\frac{2}{3}", "\u00bc": r"\frac{1}{4}", "\u00be": r"\frac{3}{4}", "\u221a": r"\sqrt ",
    "\u03c0": r"\pi ", "\u221e": r"\infty ", "\u2264": r"\le ", "\u2265": r"\ge ", "\u2260": r"\ne ",
    "\u00b1": r"\pm ", "\u222a": r"\cup ", "\u2208": r"\in ", "\u2205": r"\emptyset ", "\u00b0": "",
    "\u00b2": "^2", "\u00b3": "^3", "\u2032": "'", "\u00a0": " ", "\u2009": " ", "\u202f": " ",
    "\u2019": "'", "\u20ac": "", "\u00a3": "",
}
_UNICODE_RE = re.compile("|".join(map(re.escape, _UNICODE)))

# commands whose removal changes nothing mathematically (sizing, spacing, fonts, styles)
_DROP = re.compile(
    r"\\(?:left|right|bigl|bigr|Bigl|Bigr|biggl|biggr|big|Big|bigg|Bigg|displaystyle|textstyle"
    r"|limits|nolimits|middle)(?![a-zA-Z])|\\[,;:! ]|\\q?quad|~|\\(?:hspace|vspace)\{[^{}]*\}"
)
_WRAPPERS = re.compile(r"\\(?:text|textbf|textit|textrm|mathrm|mathbf|mathit|mathsf|mathtt|mbox|boldsymbol"
                       r"|operatorname|bm|emph|textnormal)\s*\{([^{}]*)\}")
_UNITS = (
    r"(?:sq(?:uare)?\.?\s*|cubic\s*)?(?:cm|mm|km|kg|mg|ml|mL|sec|secs|hr|hrs|min|mins|ft|in|yd|mi|oz|lb|lbs|mph|kmh"
    r"|inch(?:es)?|feet|foot|yards?|miles?|met(?:er|re)s?|centimet(?:er|re)s?|millimet(?:er|re)s?"
    r"|kilomet(?:er|re)s?|grams?|kilograms?|pounds?|ounces?|lit(?:er|re)s?|seconds?|minutes?|hours?"
    r"|days?|weeks?|months?|years?|dollars?|cents?|euros?|units?|degrees?|radians?|rad|deg"
    r"|percent|people|persons?|students?|cookies|apples|marbles|ways|times|points?|books?|cups?"
    r"|USD|EUR|GBP|usd|eur|gbp|rupees?|yuan|yen)"
)
_UNIT_AFTER_NUMBER = re.compile(
    r"(?<=[\d}.)\s])\s*" + _UNITS + r"(?:\s*\^\s*\{?[23]\}?)?(?:\s*/\s*(?:" + _UNITS + r"|[shm]))?(?![a-zA-Z])")
# one-letter units only apart from the number and at the end: "5m" may be 5 times m, "5 m" is not
_LETTER_UNIT_AT_END = re.compile(r"(?<=[\d}])\s+[mshglL](?:\s*\^\s*\{?[23]\}?)?(?:\s*/\s*[sh])?\s*$")
_TRAILING_WORDS = re.compile(r"\s+[a-zA-Z]{3,}(?:\s+[a-zA-Z]+)*\.?$")
_OVERLINE = re.compile(r"(\d*)\.(\d*)\\overline\{(\d+)\}")
_THOUSANDS = re.compile(r"(?<![\d.])(?!0\D)\d{1,3}(?:(?:,|\{,\}|\\,| |')\d{3})+(?:\.\d+)?(?![\d])")
# thousands grouped by dots or spaces with a decimal comma (1.234,5  1 234,5), or several dot groups
_EUROPEAN = re.compile(r"(?<![\d.,])(?!0\D)\d{1,3}(?:(?:\.\d{3})+|(?: \d{3})+),\d+(?![\d.,])"
                       r"|(?<![\d.,])(?!0\D)\d{1,3}(?:\.\d{3}){2,}(?![\d.,])")
_DECIMAL_COMMA = re.compile(r"(-?\d+),(\d+)")
_DOUBLE_ESCAPED = re.compile(r"(?<!\\)\\\\(?:[a-zA-Z]{2,}|[{}$%])")
_MIXED = re.compile(r"(?<![\d.,/^_{])(-?)(\d+)\s+(\d+)\s*/\s*(\d+)(?![\d.]|\s*[/^])")
_CURRENCY_FIRST = re.compile(r"^(?:USD|EUR|GBP|Rs\.?|INR)\s*(?=-?\d)")
_CHOICE = re.compile(r"^\(?([A-Ea-e])\)?$|^\(([A-E])\)[\s:.]")  # "(C) 12" is choice C
_NUMBER_WORDS = {w: str(k) for k, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
    "sixteen seventeen eighteen nineteen twenty".split())}
_TEXT_ANSWER = re.compile(r"[A-Za-z]+(?:[ '-][A-Za-z]+)*")


def _repeating(m: re.Match) -> str:
    whole, fixed, rep = m.group(1) or "0", m.group(2), m.group(3)
    value = Fraction(int(whole)) + Fraction(int(fixed or 0), 10 ** len(fixed))
    value += Fraction(int(rep), (10 ** len(rep) - 1) * 10 ** len(fixed))
    return rf"\frac{{{value.numerator}}}{{{value.denominator}}}"


def _mixed(m: re.Match) -> str:
    sign, whole, num, den = m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4))
    if not 0 < num < den:  # "12 5/3" is not a mixed number
        return m.group()
    return rf"{sign}({whole}+\frac{{{num}}}{{{den}}})"


def normalize(s: str) -> str:
    if _DOUBLE_ESCAPED.search(s):
        s = s.replace("\\\\", "\\")
    s = _UNICODE_RE.sub(lambda m: _UNICODE[m.group()], s)
    s = s.replace("\\\\", r" \rowbreak ")  # matrix row break; protects it from the spacing rules
    s = s.strip().strip("$").strip()
    if s.startswith(r"\(") and s.endswith(r"\)") or s.startswith(r"\[") and s.endswith(r"\]"):
        s = s[2:-2]
    s = re.sub(r"\\(?:boxed|fbox)\s*", "", s)  # \boxed{\boxed{8}}: the braces stay as a group
    s = s.replace(r"\dfrac", r"\frac").replace(r"\tfrac", r"\frac").replace(r"\cfrac", r"\frac")
    s = s.replace(r"\$", "").replace("$", "").replace("**", "")  # currency, markdown bold
    s = re.sub(r"\\%|%|\\percent\b", "", s)
    s = re.sub(r"\^\s*\{?\s*\\circ\s*\}?|\\circ|\\degree|\^\s*\{\s*\}", "", s)
    s = re.sub(r"(?<=\d)\s*(?:\{\s*,\s*\}|,\\!)\s*(?=\d{3})", ",", s)  # 1{,}000 and 11,\! 111
    s = _DROP.sub(" ", s)
    s = re.sub(r"\\(?:ldots|cdots|dots)", "", s)
    for _ in range(3):  # nested wrappers, innermost first
        s = _WRAPPERS.sub(lambda m: f" {m.group(1)} ", s)
    s = re.sub(r"\\(?:sin|cos|tan|ln|log|exp)\b", lambda m: m.group() + " ", s)
    s = _OVERLINE.sub(_repeating, s)

    s = _CURRENCY_FIRST.sub("", s)
    s = _EUROPEAN.sub(lambda m: m.group().replace(".", "").replace(" ", "").replace(",", "."), s)
    if not re.search(r"[(\[\\{}]", s) or re.fullmatch(r"[^,]*\d\\,\d{3}[^,]*", s):
        s = _THOUSANDS.sub(lambda m: re.sub(r"\{,\}|\\,|,| |'", "", m.group()), s)
    if re.search(r"\d", s):
        s = re.sub(r"(?<=\S)\s*\(\s*[A-Za-z]{3,}(?: [A-Za-z]+)*\s*\)\s*$", "", s)  # 3 (three), not f(y)
        s = _LETTER_UNIT_AT_END.sub("", _UNIT_AFTER_NUMBER.sub(" ", s).rstrip())
        s = s.strip()
        m = _TRAILING_WORDS.search(s)  # "12 students": words after a plain number
        if m and re.search(r"\d", s[:m.start()]) and not re.search(r"[a-zA-Z\\]", s[:m.start()]):
            s = s[:m.start()]
    s = _MIXED.sub(_mixed, s)
    s = re.sub(r"^\s*(?:x \\in )?(?:the set of )?all real numbers\s*$", r"\\mathbb{R}", s, flags=re.IGNORECASE)
    s = re.sub(r"(?<![\\a-zA-Z])or(?![a-zA-Z])|(?<=\d)or(?=[A-Z])", r" \\lor ", s)  # 1orW(x) too
    s = re.sub(r"(?<![\\a-zA-Z])(?:and)(?![a-zA-Z])", ",", s)
    s = s.replace(r"\{,\}", ",").replace("\\ ", " ")
    s = re.sub(r"\s+", " ", s).strip().rstrip(".").strip()
    return s


def text_key(s: str) -> str:
    """Loose key for answers that are not mathematics (words, choices, odd notation)."""
    s = _WRAPPERS.sub(lambda m: m.group(1), s)
    return re.sub(r"[\s${}\\.]|\\text", "", s).lower()


def parse_answer(raw: str):
    """Raw answer text -> AST. Raises ParseError; text answers become ("text", key)."""
    if len(raw) > MAX_ANSWER_CHARS:
        raise ParseError("answer too long")
    s = normalize(raw)
    m = _CHOICE.match(s)
    if m and (len(s) > 1 or s.isupper()):
        return ("text", (m.group(1) or m.group(2)).lower())
    if s.lower() in _NUMBER_WORDS:
        return ("num", _NUMBER_WORDS[s.lower()])
    if _TEXT_ANSWER.fullmatch(s) and (len(s) >= 3 and re.search(r"[a-zA-Z]{3}", s) or " " in s):
        return ("text", s.lower())
    m = _DECIMAL_COMMA.fullmatch(s)
    if m:  # 1,5: the decimal 1.5 or the list 1, 5 (thousands like 1,500 were joined above)
        return ("amb", ("num", f"{m.group(1)}.{m.group(2)}") if not m.group(1).startswith("-")
                else ("neg", ("num", f"{m.group(1)[1:]}.{m.group(2)}")), parse_latex(s))
    return parse_latex(s)
