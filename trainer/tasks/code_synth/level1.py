"""Level 1: one operation a small instruct model can sometimes write in one line (double every element,
reverse a string, sum a list), over lists of integers, strings, word lists and numbers."""
from __future__ import annotations

import math

from .blocks import (
    INTS,
    NONNEG,
    PREDS,
    PROD,
    SMALL,
    Spec,
    _kname,
    _spec,
    biased,
    ints,
    mixed,
    num,
    palindrome,
    sentence,
    text,
    with_word,
    wordlist,
)


def specs() -> list[Spec]:
    # The order is part of the output: the catalogue's order decides every seed's shuffle and each spec's
    # neighbours in its family (its rivals), so reordering these would change every problem set.
    return _lists() + _strings() + _words() + _numbers() + _framing()


def _lists() -> list[Spec]:
    """Maps, filters, counts and aggregates of one list of integers."""
    S: list[Spec] = []
    L = "xs: list[int] -> list[int]"
    maps = [("add_k", "add_{k}_to_each", "{k} added to every element of xs", "x + {k}", lambda x, k: x + k,
             range(1, 31), INTS),
            ("subtract_k", "subtract_{k}_from_each", "{k} subtracted from every element of xs", "x - {k}",
             lambda x, k: x - k, range(1, 21), INTS),
            ("multiply_k", "multiply_each_by_{k}", "every element of xs multiplied by {k}", "x * {k}",
             lambda x, k: x * k, range(2, 16), INTS),
            ("mod_k", "remainders_mod_{k}", "the remainder of every element of xs divided by {k}", "x % {k}",
             lambda x, k: x - k * (x // k), range(2, 11), NONNEG),
            ("floordiv_k", "divide_each_by_{k}", "every element of xs divided by {k}, rounded down (//)",
             "x // {k}", lambda x, k: int(x / k), range(2, 11), NONNEG),
            ("map", "square_each", "every element of xs squared", "x * x", lambda x, k: x * x, [0], INTS),
            ("map", "negate_each", "every element of xs negated", "-x", lambda x, k: -x, [0], INTS),
            ("map", "absolute_values", "the absolute value of every element of xs", "abs(x)",
             lambda x, k: x if x >= 0 else -x, [0], INTS)]
    for fam, name, words, src, fn, ks, gen in maps:
        for k in ks:
            S.append(_spec(fam, 1, name.format(k=k), L, "returns a new list with " + words.format(k=k),
                           lambda xs, fn=fn, k=k: [fn(x, k) for x in xs], f"return [{src.format(k=k)} for x in xs]",
                           gen))
    filters = [("greater_than_k", "keep_greater_than_{k}", "greater than {k}", "x > {k}", lambda x, k: x > k,
                [k for k in range(-5, 21) if k != 0], ints(-9, 30)),
               ("less_than_k", "keep_less_than_{k}", "less than {k}", "x < {k}", lambda x, k: x < k,
                range(1, 16), INTS),
               ("multiples_k", "keep_multiples_of_{k}", "divisible by {k}", "x % {k} == 0",
                lambda x, k: x % k == 0, range(3, 14), INTS),
               ("remove_k", "remove_every_{k}", "not equal to {k}", "x != {k}", lambda x, k: not x == k,
                range(0, 10), SMALL)]
    for fam, name, words, src, fn, ks, gen in filters:
        for k in ks:
            S.append(_spec(fam, 1, name.format(k=_kname(k)), L,
                           f"returns a new list of the elements of xs that are {words.format(k=k)}, in their "
                           "original order", lambda xs, fn=fn, k=k: [x for x in xs if fn(x, k)],
                           f"return [x for x in xs if {src.format(k=k)}]", gen))
    for pname, pwords, src, fn in PREDS:  # (keep_multiples_of_3 and the thresholds are families above)
        if pname in ("evens", "odds", "positives", "negatives"):
            S.append(_spec("filter", 1, f"keep_{pname}", L, f"returns a new list of the elements of xs that "
                           f"are {pwords}, in their original order", lambda xs, fn=fn: list(filter(fn, xs)),
                           f"return [x for x in xs if {src}]"))
        S.append(_spec("count", 1, f"count_{pname}", "xs: list[int] -> int",
                       f"returns how many elements of xs are {pwords}", lambda xs, fn=fn: len(list(filter(fn, xs))),
                       f"return len([x for x in xs if {src}])"))
    for k in range(0, 10):
        S.append(_spec("count_k", 1, f"count_occurrences_of_{k}", "xs: list[int] -> int",
                       f"returns how many times {k} occurs in xs", lambda xs, k=k: sum(x == k for x in xs),
                       f"return xs.count({k})", SMALL))
        S.append(_spec("contains_k", 1, f"contains_{k}", "xs: list[int] -> bool",
                       f"returns True if {k} occurs in xs, otherwise False", lambda xs, k=k: any(x == k for x in xs),
                       f"return {k} in xs", ints(0, 12, (1, 5))))
    agg = [("sum_list", "int", "returns the sum of the elements of xs (0 for an empty list)", sum,
            "return sum(xs)", INTS, None),
           ("product_of_list", "int", "returns the product of the elements of xs (1 for an empty list)",
            math.prod, "result = 1\nfor x in xs:\n    result *= x\nreturn result",
            PROD, None),
           ("largest_element", "int", "returns the largest element of the non-empty list xs", lambda xs: sorted(xs)[-1],
            "return max(xs)", INTS, []),
           ("smallest_element", "int", "returns the smallest element of the non-empty list xs",
            lambda xs: sorted(xs)[0], "return min(xs)", INTS, []),
           ("list_length", "int", "returns the number of elements in xs", lambda xs: sum(1 for _ in xs),
            "return len(xs)", INTS, None),
           ("first_element", "int", "returns the first element of the non-empty list xs", lambda xs: xs[:1][0],
            "return xs[0]", INTS, []),
           ("last_element", "int", "returns the last element of the non-empty list xs",
            lambda xs: xs[len(xs) - 1], "return xs[-1]", INTS, []),
           ("all_positive", "bool", "returns True if every element of xs is greater than 0, otherwise False "
            "(True for an empty list)", lambda xs: not [x for x in xs if x <= 0], "return all(x > 0 for x in xs)",
            biased(INTS, ints(1, 20)), None),
           ("any_negative", "bool", "returns True if at least one element of xs is less than 0, otherwise False",
            lambda xs: bool([x for x in xs if x < 0]), "return any(x < 0 for x in xs)", biased(INTS, NONNEG), None)]
    for name, ret, does, fn, body, gen, edges in agg:
        S.append(_spec("aggregate", 1, name, f"xs: list[int] -> {ret}", does, fn, body, gen, edges))
    return S


def _strings() -> list[Spec]:
    """One string in, one operation."""
    S: list[Spec] = []
    T = "s: str -> str"
    strs = [("reverse_string", T, "returns s reversed", lambda s: "".join(reversed(s)), "return s[::-1]", text),
            ("to_uppercase", T, "returns s with every letter in upper case", str.upper, "return s.upper()", text),
            ("to_lowercase", T, "returns s with every letter in lower case", str.lower, "return s.lower()", mixed),
            ("swap_case", T, "returns s with upper-case letters made lower-case and lower-case letters made "
             "upper-case", lambda s: "".join(c.lower() if c.isupper() else c.upper() for c in s),
             "return s.swapcase()", mixed),
            ("string_length", "s: str -> int", "returns the number of characters in s", lambda s: sum(1 for _ in s),
             "return len(s)", sentence),
            ("count_vowels", "s: str -> int", "returns how many vowels (a, e, i, o, u) s contains",
             lambda s: sum(s.count(v) for v in "aeiou"), "return sum(1 for c in s if c in 'aeiou')", sentence),
            ("is_palindrome", "s: str -> bool", "returns True if s reads the same forwards and backwards, "
             "otherwise False", lambda s: list(s) == list(reversed(s)), "return s == s[::-1]", palindrome),
            ("count_words", "s: str -> int", "returns the number of words in s (words are separated by spaces)",
             lambda s: len(s.split(" ")) if s else 0, "return len(s.split())", sentence),
            ("split_into_words", "s: str -> list[str]", "returns the list of the words in s, in order (words "
             "are separated by spaces)", lambda s: [w for w in s.split(" ") if w], "return s.split()", sentence)]
    for name, sig, does, fn, body, gen in strs:
        S.append(_spec("string", 1, name, sig, does, fn, body, gen))
    for c in "abdeilmnorstu":
        S.append(_spec("count_letter", 1, f"count_letter_{c}", "s: str -> int",
                       f"returns how many times the letter '{c}' occurs in s",
                       lambda s, c=c: len([x for x in s if x == c]), f"return s.count('{c}')", sentence))
    for c in "aeiou":
        S.append(_spec("contains_letter", 1, f"contains_letter_{c}", "s: str -> bool", f"returns True if the letter "
                       f"'{c}' occurs in s, otherwise False",
                       lambda s, c=c: s.find(c) >= 0, f"return '{c}' in s", text))
    for a, b in ["ae", "ea", "io", "ou", "sz", "td"]:
        S.append(_spec("replace_letter", 1, f"replace_{a}_with_{b}", T, f"returns s with every '{a}' replaced "
                       f"by '{b}'", lambda s, a=a, b=b: "".join(b if x == a else x for x in s),
                       f"return s.replace('{a}', '{b}')", sentence))
    for sep, what in [("_", "underscores"), ("-", "dashes"), ("", "nothing")]:
        name = "remove_spaces" if not sep else f"replace_spaces_with_{what}"
        does = "returns s with every space removed" if not sep else f"returns s with every space replaced by '{sep}'"
        S.append(_spec("replace_letter", 1, name, T, does, lambda s, sep=sep: sep.join(s.split(" ")),
                       f"return s.replace(' ', '{sep}')", sentence))
    for c in "aeiost":
        S.append(_spec("remove_letter", 1, f"remove_letter_{c}", T, f"returns s with every '{c}' removed",
                       lambda s, c=c: "".join(x for x in s if x != c), f"return s.replace('{c}', '')", text))
    for k in range(2, 6):
        S.append(_spec("repeat_k", 1, f"repeat_{k}_times", T, f"returns s repeated {k} times, with nothing in "
                       "between", lambda s, k=k: "".join([s] * k), f"return s * {k}", text))
    for x in ["ing", "ed", "er", "ly", "ness", "ful"]:
        S.append(_spec("suffix", 1, f"add_suffix_{x}", T, f"returns s with '{x}' added at the end",
                       lambda s, x=x: f"{s}{x}", f"return s + '{x}'", text))
    for x in ["un", "re", "pre", "dis", "non", "over"]:
        S.append(_spec("prefix", 1, f"add_prefix_{x}", T, f"returns s with '{x}' added at the start",
                       lambda s, x=x: f"{x}{s}", f"return '{x}' + s", text))
    for c in "abcdgrst":
        S.append(_spec("starts_with", 1, f"starts_with_{c}", "s: str -> bool", f"returns True if s starts with "
                       f"the letter '{c}', otherwise False", lambda s, c=c: s[:1] == c, f"return s.startswith('{c}')",
                       biased(text, with_word(lambda w, c=c: w[0] == c))))
    for c in "dekrnty":
        S.append(_spec("ends_with", 1, f"ends_with_{c}", "s: str -> bool", f"returns True if s ends with the "
                       f"letter '{c}', otherwise False", lambda s, c=c: s[-1:] == c, f"return s.endswith('{c}')",
                       biased(text, with_word(lambda w, c=c: w[-1] == c))))
    for k in range(1, 6):
        S.append(_spec("first_k_chars", 1, f"first_{k}_characters", T, f"returns the first {k} characters of s "
                       "(all of s if it is shorter)", lambda s, k=k: "".join(list(s)[:k]), f"return s[:{k}]", text))
        S.append(_spec("last_k_chars", 1, f"last_{k}_characters", T, f"returns the last {k} characters of s "
                       "(all of s if it is shorter)", lambda s, k=k: s[max(len(s) - k, 0):], f"return s[-{k}:]", text))
    return S


def _words() -> list[Spec]:
    """Lists of words."""
    S: list[Spec] = []
    W = "words: list[str]"
    S.append(_spec("words", 1, "word_lengths", f"{W} -> list[int]", "returns a new list with the length of "
                   "every word in words", lambda ws: [sum(1 for _ in w) for w in ws], "return [len(w) for w in words]"))
    S.append(_spec("words", 1, "uppercase_words", f"{W} -> list[str]", "returns a new list with every word in "
                   "words in upper case", lambda ws: list(map(str.upper, ws)), "return [w.upper() for w in words]"))
    S.append(_spec("words", 1, "total_letters", f"{W} -> int", "returns the total number of letters in all the "
                   "words in words", lambda ws: len("".join(ws)), "return sum(len(w) for w in words)"))
    for k in range(1, 8):
        S.append(_spec("words_longer_k", 1, f"words_longer_than_{k}", f"{W} -> list[str]", "returns a new list "
                       f"of the words in words that have more than {k} letters, in their original order",
                       lambda ws, k=k: [w for w in ws if len(w) >= k + 1],
                       f"return [w for w in words if len(w) > {k}]"))
    for c in "abcdst":
        S.append(_spec("words_starting", 1, f"words_starting_with_{c}", f"{W} -> list[str]", "returns a new list "
                       f"of the words in words that start with the letter '{c}', in their original order",
                       lambda ws, c=c: [w for w in ws if w[0] == c],
                       f"return [w for w in words if w.startswith('{c}')]",
                       biased(wordlist, lambda rng, c=c: [with_word(lambda w: w[0] == c)(rng)] + wordlist(rng))))
    for sep, what in [(" ", "spaces"), ("-", "dashes"), (", ", "commas"), ("_", "underscores"), ("", "nothing")]:
        S.append(_spec("join_words", 1, f"join_with_{what}", f"{W} -> str", "returns the words in words joined "
                       f"into one string with '{sep}' between neighbouring words",
                       lambda ws, sep=sep: ws[0] + "".join(sep + w for w in ws[1:]) if ws else "",
                       f"return '{sep}'.join(words)"))
    return S


def _numbers() -> list[Spec]:
    """One integer in: divisibility, unit conversions, small formulas."""
    S: list[Spec] = []
    N = "n: int"
    for k in range(2, 13):
        S.append(_spec("divisible_k", 1, f"is_divisible_by_{k}", f"{N} -> bool", f"returns True if n is divisible "
                       f"by {k}, otherwise False", lambda n, k=k: (n // k) * k == n, f"return n % {k} == 0",
                       biased(num(0, 100), lambda rng, k=k: k * rng.randint(1, 12))))
    units = [("hours_to_minutes", "hours", "minutes", 60), ("yards_to_feet", "yards", "feet", 3),
             ("days_to_hours", "days", "hours", 24), ("weeks_to_days", "weeks", "days", 7),
             ("feet_to_inches", "feet", "inches", 12), ("meters_to_centimeters", "meters", "centimeters", 100),
             ("kilograms_to_grams", "kilograms", "grams", 1000), ("pounds_to_ounces", "pounds", "ounces", 16)]
    for name, a, b, f in units:
        S.append(_spec("unit_conversion", 1, name, f"{N} -> int", f"returns the number of {b} in n {a}",
                       lambda n, f=f: sum([n] * f), f"return n * {f}"))
    nums = [("square_number", "int", "returns n multiplied by itself", lambda n: n ** 2, "return n * n"),
            ("last_digit", "int", "returns the last digit of the non-negative integer n", lambda n: int(str(n)[-1]),
             "return n % 10"),
            ("sum_up_to_n", "int", "returns 1 + 2 + ... + n (0 when n is 0)", lambda n: n * (n + 1) // 2,
             "return sum(range(n + 1))"),
            ("cube_number", "int", "returns n multiplied by itself three times", lambda n: n ** 3, "return n * n * n"),
            ("is_odd", "bool", "returns True if n is odd, otherwise False", lambda n: n % 2 != 0, "return n % 2 == 1")]
    for name, ret, does, fn, body in nums:
        S.append(_spec("number", 1, name, f"{N} -> {ret}", does, fn, body))
    return S


def _framing() -> list[Spec]:
    """Strings wrapped in brackets, and a sentence's first and last word."""
    S: list[Spec] = []
    T = "s: str -> str"
    for what, a, b in [("parentheses", "(", ")"), ("square_brackets", "[", "]"), ("curly_braces", "{", "}"),
                       ("angle_brackets", "<", ">"), ("stars", "*", "*"), ("quotes", '"', '"')]:
        S.append(_spec("wrap", 1, f"wrap_in_{what}", T, f"returns s with '{a}' added at the start and '{b}' at "
                       "the end", lambda s, a=a, b=b: "".join([a, s, b]), f"return {a!r} + s + {b!r}", text))
    S.append(_spec("string", 1, "first_word", T, "returns the first word of s (s has at least one word; words "
                   "are separated by spaces)", lambda s: s.partition(" ")[0], "return s.split()[0]", sentence, []))
    S.append(_spec("string", 1, "last_word", T, "returns the last word of s (s has at least one word; words "
                   "are separated by spaces)", lambda s: s.rpartition(" ")[2], "return s.split()[-1]", sentence, []))
    return S
