"""Level 3: two or three operations with conditions and state (compound filters, running windows, runs,
frequencies, fizzbuzz-like rules, ciphers, number bases)."""
from __future__ import annotations

import math
import random
import string
from typing import Callable

from .blocks import (
    INTS,
    MAPS,
    PREDS,
    SMALL,
    WORDS,
    Spec,
    _kname,
    _primes_upto,
    _spec,
    biased,
    ints,
    mixed,
    num,
    sentence,
    text,
)


def runs(rng: random.Random) -> str:
    return "".join(rng.choice("abcd") * rng.randint(1, 4) for _ in range(rng.randint(1, 5)))


def brackets(pairs: str) -> Callable[[random.Random], str]:
    def balanced(rng: random.Random, depth: int) -> str:
        out = ""
        while len(out) < 8 and rng.random() < 0.6:
            i = 2 * rng.randrange(len(pairs) // 2)
            out += pairs[i] + (balanced(rng, depth + 1) if depth < 3 else "") + pairs[i + 1]
        return out

    def gen(rng: random.Random) -> str:
        s = balanced(rng, 0) or pairs[:2]
        if rng.random() < 0.5:  # break it (or not: the reference decides)
            i = rng.randrange(len(s))
            s = s[:i] + s[i + 1:] if rng.random() < 0.5 else s[:i] + rng.choice(pairs) + s[i:]
        return s
    return gen


def _balanced(s: str, pairs: str) -> bool:
    depth_stack = ""
    for c in s:
        if c in pairs[0::2]:
            depth_stack += pairs[pairs.index(c) + 1]
        elif not depth_stack or depth_stack[-1] != c:
            return False
        else:
            depth_stack = depth_stack[:-1]
    return depth_stack == ""


def _rle(s: str) -> str:
    import itertools
    return "".join(f"{c}{len(list(g))}" for c, g in itertools.groupby(s))


def _shift(s: str, k: int) -> str:
    abc = string.ascii_lowercase
    return s.translate(str.maketrans(abc, abc[k % 26:] + abc[:k % 26]))


def _base(n: int, k: int) -> str:
    return str(n) if n < k else _base(n // k, k) + str(n % k)


def specs() -> list[Spec]:
    # The order is part of the output: the catalogue's order decides every seed's shuffle and each spec's
    # neighbours in its family (its rivals), so reordering these would change every problem set.
    return _filters_and_windows() + _sequences() + _strings() + _numbers()


def _filters_and_windows() -> list[Spec]:
    """Compound filters, map then filter, fizzbuzz, windows and chunks."""
    S: list[Spec] = []
    L, NUM = "xs: list[int] -> list[int]", "xs: list[int] -> int"
    gerund = {"double": "doubling", "triple": "tripling", "square": "squaring", "negate": "negating",
              "add_1_to": "adding_1", "add_5_to": "adding_5", "add_10_to": "adding_10",
              "subtract_1_from": "subtracting_1", "halve": "halving"}
    for pname, pwords, psrc, p in PREDS:
        for verb, mwords, msrc, m in MAPS:
            S.append(_spec("filter_map_sum", 3, f"sum_of_{pname}_after_{gerund[verb]}", NUM, "returns the sum of the "
                           f"elements of xs that are {pwords}, after each of them is {mwords} (0 if there are none)",
                           lambda xs, p=p, m=m: sum(map(m, filter(p, xs))),
                           f"return sum({msrc} for x in xs if {psrc})"))
    thresholds = [(f"above_{k}", f"greater than {k}", f"x > {k}", lambda x, k=k: x > k)
                  for k in (0, 2, 4, 6, 8, 10, 12)]
    thresholds += [(f"below_{k}", f"less than {k}", f"x < {k}", lambda x, k=k: x < k) for k in (0, 3, 5, 10)]
    for parity, psrc, p in [("even", "x % 2 == 0", lambda x: x % 2 == 0), ("odd", "x % 2 == 1", lambda x: x % 2 == 1)]:
        for conj in ("and", "or"):
            for tname, twords, tsrc, t in thresholds:
                words, src = f"{parity} {conj} {twords}", f"{psrc} {conj} {tsrc}"
                ok = (lambda x, p=p, t=t: p(x) and t(x)) if conj == "and" else (lambda x, p=p, t=t: p(x) or t(x))
                nm = f"{parity}_{conj}_{tname}"
                S.append(_spec("compound_filter", 3, f"keep_{nm}", L, f"returns a new list of the elements of xs "
                               f"that are {words}, in their original order", lambda xs, ok=ok: list(filter(ok, xs)),
                               f"return [x for x in xs if {src}]"))
                S.append(_spec("compound_count", 3, f"count_{nm}", NUM, f"returns how many elements of xs are {words}",
                               lambda xs, ok=ok: len(list(filter(ok, xs))), f"return sum(1 for x in xs if {src})"))
                S.append(_spec("compound_sum", 3, f"sum_{nm}", NUM, f"returns the sum of the elements of xs that are "
                               f"{words} (0 if there are none)", lambda xs, ok=ok: sum(filter(ok, xs)),
                               f"return sum(x for x in xs if {src})"))
    # Map, then filter the results: maps that are not monotone (or thresholds no filter above uses), so the
    # filter does not simply move before the map (doubles > 10 would be double_the_values_above_5 again).
    for noun, mwords, msrc, m, ks in [("squares", "squared", "x * x", lambda x: x * x, (10, 20, 30, 50)),
                                      ("absolute_values", "replaced by its absolute value", "abs(x)",
                                      abs, (3, 5, 8, 12)),
                                      ("remainders_mod_7", "taken modulo 7 (x % 7)", "x % 7", lambda x: x % 7, (2, 4)),
                                      ("remainders_mod_5", "taken modulo 5 (x % 5)", "x % 5", lambda x: x % 5, (1, 3)),
                                      ("negations", "negated", "-x", lambda x: -x, (3, -5, -10))]:
        for k in ks:
            S.append(_spec("map_filter", 3, f"{noun}_that_are_greater_than_{_kname(k)}", L, "returns a new list of "
                           f"the elements of xs each {mwords}, keeping only the results that are greater than {k}, in "
                           "their original order", lambda xs, m=m, k=k: [y for y in map(m, xs) if y > k],
                           f"return [{msrc} for x in xs if {msrc} > {k}]", ints(-15, 30)))
    for a, b in [(3, 5), (2, 3), (3, 7), (2, 5), (4, 6), (5, 7), (2, 7), (3, 4)]:
        S.append(_spec("fizzbuzz", 3, f"fizzbuzz_{a}_{b}", "n: int -> list[str]", "returns a list of strings for "
                       f"the numbers 1 to n in order: 'FizzBuzz' for a number divisible by both {a} and {b}, 'Fizz' "
                       f"for one divisible by {a} only, 'Buzz' for one divisible by {b} only, and the number itself "
                       "(as a string) otherwise", lambda n, a=a, b=b: ["Fizz" * (i % a == 0) + "Buzz" * (i % b == 0)
                                                                        or str(i) for i in range(1, n + 1)],
                       f"out = []\nfor i in range(1, n + 1):\n    if i % {a} == 0 and i % {b} == 0:\n"
                       f"        out.append('FizzBuzz')\n    elif i % {a} == 0:\n        out.append('Fizz')\n"
                       f"    elif i % {b} == 0:\n        out.append('Buzz')\n    else:\n        out.append(str(i))\n"
                       "return out", num(1, 40)))
    for k in range(2, 5):
        S.append(_spec("windows", 3, f"window_sums_{k}", L, f"returns the sums of every {k} consecutive elements "
                       f"of xs, from left to right (empty if xs has fewer than {k} elements)",
                       lambda xs, k=k: [sum(w) for w in zip(*(xs[j:] for j in range(k)))],
                       f"return [sum(xs[i:i + {k}]) for i in range(len(xs) - {k - 1})]"))
        S.append(_spec("windows", 3, f"window_maxima_{k}", L, f"returns the largest of every {k} consecutive "
                       f"elements of xs, from left to right (empty if xs has fewer than {k} elements)",
                       lambda xs, k=k: [max(w) for w in zip(*(xs[j:] for j in range(k)))],
                       f"return [max(xs[i:i + {k}]) for i in range(len(xs) - {k - 1})]"))
        S.append(_spec("windows", 3, f"chunk_sums_{k}", L, f"splits xs into consecutive groups of {k} elements "
                       "(the last group may be shorter) and returns the list of the groups' sums",
                       lambda xs, k=k: [sum(xs[i * k:i * k + k]) for i in range((len(xs) + k - 1) // k)],
                       f"return [sum(xs[i:i + {k}]) for i in range(0, len(xs), {k})]"))
        S.append(_spec("windows", 3, f"chunks_of_{k}", "xs: list[int] -> list[list[int]]", "returns xs split into "
                       f"consecutive groups of {k} elements (the last group may be shorter), as a list of lists",
                       lambda xs, k=k: [xs[i * k:i * k + k] for i in range((len(xs) + k - 1) // k)],
                       f"return [xs[i:i + {k}] for i in range(0, len(xs), {k})]"))
        S.append(_spec("windows", 3, f"best_window_sum_{k}", NUM, f"returns the largest sum of {k} consecutive "
                       f"elements of xs (xs has at least {k} elements)",
                       lambda xs, k=k: max(sum(w) for w in zip(*(xs[j:] for j in range(k)))),
                       f"return max(sum(xs[i:i + {k}]) for i in range(len(xs) - {k - 1}))", ints(-9, 20, (k, 8)), []))
        S.append(_spec("kth_largest", 3, f"kth_largest_{k}", NUM, f"returns the {k}-th largest element of xs, "
                       f"counting repeated values separately (xs has at least {k} elements)",
                       lambda xs, k=k: sorted(xs)[len(xs) - k], f"return sorted(xs, reverse=True)[{k - 1}]",
                       ints(0, 9, (k, 8)), []))
    return S


def _sequences() -> list[Spec]:
    """Runs, frequencies, pairs, tallies and merges of lists."""
    S: list[Spec] = []
    L, NUM = "xs: list[int] -> list[int]", "xs: list[int] -> int"

    def longest_run(xs: list[int], ok: Callable[[int, int], bool]) -> int:
        best = cur = 0
        for i, x in enumerate(xs):
            cur = cur + 1 if i and ok(xs[i - 1], x) else 1
            best = max(best, cur)
        return best
    seq = [("longest_equal_run", NUM, "returns the length of the longest run of equal neighbouring elements in xs "
            "(0 for an empty list)", lambda xs: longest_run(xs, int.__eq__),
            "best = cur = 0\nfor i in range(len(xs)):\n    cur = cur + 1 if i > 0 and xs[i] == xs[i - 1] else 1\n"
            "    best = max(best, cur)\nreturn best", ints(0, 2, (1, 10)), None),
           ("longest_increasing_run", NUM, "returns the length of the longest run of consecutive elements of xs in "
            "which each element is greater than the one before it (0 for an empty list, 1 if no element is)",
            lambda xs: longest_run(xs, int.__lt__), "best = cur = 0\nfor i in range(len(xs)):\n"
            "    cur = cur + 1 if i > 0 and xs[i] > xs[i - 1] else 1\n    best = max(best, cur)\nreturn best",
            ints(0, 9, (1, 10)), None),
           ("elements_appearing_once", L, "returns the elements of xs that occur exactly once in xs, in their "
            "original order", lambda xs: [x for x in xs if sum(y == x for y in xs) == 1],
            "return [x for x in xs if xs.count(x) == 1]", SMALL, None),
           ("repeated_values", L, "returns the values that occur more than once in xs, each listed once, in the "
            "order of their first occurrence", lambda xs: [x for x in dict.fromkeys(xs) if xs.count(x) > 1],
            "out = []\nfor x in xs:\n    if xs.count(x) > 1 and x not in out:\n        out.append(x)\nreturn out",
            SMALL, None),
           ("most_frequent", NUM, "returns the value that occurs most often in the non-empty list xs (the smallest "
            "such value if there is a tie)", lambda xs: sorted(xs, key=lambda x: (-xs.count(x), x))[0],
            "best = None\nfor x in sorted(set(xs)):\n    if best is None or xs.count(x) > xs.count(best):\n"
            "        best = x\nreturn best", SMALL, []),
           ("second_largest", "xs: list[int] -> int | None", "returns the second largest distinct value in xs, or "
            "None if xs has fewer than two distinct values", lambda xs: max(x for x in xs if x < max(xs))
            if len(set(xs)) > 1 else None, "values = sorted(set(xs))\nreturn values[-2] if len(values) >= 2 else None",
            biased(INTS, lambda rng: [rng.randint(0, 5)] * rng.randint(1, 3)), None)]
    for name, sig, does, fn, body, gen, edges in seq:
        S.append(_spec("sequence", 3, name, sig, does, fn, body, gen, edges))
    for t in range(5, 13):
        S.append(_spec("pair_sums", 3, f"count_pairs_summing_to_{t}", NUM, "returns how many pairs of positions "
                       f"i < j have xs[i] + xs[j] == {t}", lambda xs, t=t: sum(xs[i] + xs[j] == t for j in
                       range(len(xs)) for i in range(j)), f"count = 0\nfor i in range(len(xs)):\n"
                       f"    for j in range(i + 1, len(xs)):\n        if xs[i] + xs[j] == {t}:\n            count += 1"
                       "\nreturn count", ints(0, 10)))
    for k in range(0, 6):
        S.append(_spec("tally", 3, f"tally_around_{k}", L, f"returns [a, b, c] where a is how many elements of xs "
                       f"are less than {k}, b how many are equal to {k} and c how many are greater than {k}",
                       lambda xs, k=k: [sum(x < k for x in xs), xs.count(k), sum(x > k for x in xs)],
                       f"a = b = c = 0\nfor x in xs:\n    if x < {k}:\n        a += 1\n    "
                       f"elif x == {k}:\n        b += 1"
                       "\n    else:\n        c += 1\nreturn [a, b, c]", SMALL))
    for lo, hi in [(0, 10), (0, 5), (1, 9), (-5, 5), (2, 8)]:
        S.append(_spec("clamped_sum", 3, f"clamped_sum_{_kname(lo)}_to_{hi}", NUM, "returns the sum of the elements "
                       f"of xs after replacing each element below {lo} by {lo} and each element above {hi} by {hi}",
                       lambda xs, lo=lo, hi=hi: sum(sorted((lo, x, hi))[1] for x in xs),
                       f"return sum(min(max(x, {lo}), {hi}) for x in xs)"))
    two = "xs: list[int], ys: list[int] -> list[int]"
    pair_gen = lambda rng: (ints(0, 9, (0, 5))(rng), ints(0, 9, (0, 5))(rng))  # noqa: E731
    S.append(_spec("two_lists", 3, "interleave", two, "returns a list that alternates the elements of xs and ys, "
                   "starting with the first element of xs; once one list runs out, the rest of the other follows",
                   lambda xs, ys: [v for pair in zip(xs, ys) for v in pair] + xs[len(ys):] + ys[len(xs):],
                   "out = []\nfor i in range(max(len(xs), len(ys))):\n    if i < len(xs):\n        out.append(xs[i])\n"
                   "    if i < len(ys):\n        out.append(ys[i])\nreturn out", pair_gen))
    S.append(_spec("two_lists", 3, "merge_sorted", two, "takes two lists sorted in increasing order and returns "
                   "one list with all their elements, sorted in increasing order", lambda xs, ys: sorted(xs + ys),
                   "out, i, j = [], 0, 0\nwhile i < len(xs) and j < len(ys):\n    if xs[i] <= ys[j]:\n"
                   "        out.append(xs[i])\n        i += 1\n    else:\n        out.append(ys[j])\n        j += 1\n"
                   "return out + xs[i:] + ys[j:]", lambda rng: tuple(sorted(v) for v in pair_gen(rng))))
    return S


def _strings() -> list[Spec]:
    """Encodings, counts, ciphers, word rules and brackets."""
    S: list[Spec] = []
    T, SEP = "s: str -> str", " (words are separated by single spaces)"
    strs = [("run_length_encode", T, "returns the run-length encoding of s: every run of equal neighbouring "
             "characters becomes the character followed by the length of the run", _rle,
             "out, i = '', 0\nwhile i < len(s):\n    j = i\n    while j < len(s) and s[j] == s[i]:\n        j += 1\n"
             "    out += s[i] + str(j - i)\n    i = j\nreturn out", runs),
            ("word_counts", "s: str -> dict[str, int]", "returns a dict that maps every word of s to how many times "
             "it occurs in s" + SEP, lambda s: {w: s.split().count(w) for w in s.split()},
             "counts = {}\nfor w in s.split():\n    counts[w] = counts.get(w, 0) + 1\nreturn counts",
             lambda rng: " ".join(rng.choice(WORDS[:6]) for _ in range(rng.randint(1, 7)))),
            ("letter_counts", "s: str -> dict[str, int]", "returns a dict that maps every character of s to how many "
             "times it occurs in s", lambda s: {c: s.count(c) for c in s},
             "counts = {}\nfor c in s:\n    counts[c] = counts.get(c, 0) + 1\nreturn counts", text),
            ("alternate_case", T, "returns s with the characters at even positions (0, 2, 4, ...) in upper case and "
             "those at odd positions in lower case", lambda s: "".join((c.lower(), c.upper())[i % 2 == 0]
                                                                       for i, c in enumerate(s)),
             "return ''.join(c.upper() if i % 2 == 0 else c.lower() for i, c in enumerate(s))", mixed),
            ("order_words_by_length", T, "returns s with its words reordered from shortest to longest; words of "
             "equal length keep their original order" + SEP, lambda s: " ".join(sorted(s.split(" "), key=len)),
             "return ' '.join(sorted(s.split(' '), key=len))", sentence),
            ("count_same_first_last", "s: str -> int", "returns how many words of s start and end with the same "
             "letter" + SEP, lambda s: sum(w[0] == w[-1] for w in s.split()),
             "return sum(1 for w in s.split() if w[0] == w[-1])",
             lambda rng: " ".join(rng.choice(("level", "noon", "radar", "dad") + WORDS)
             for _ in range(rng.randint(1, 6)))),
            ("most_common_letter", T, "returns the character that occurs most often in the non-empty string s (the "
             "alphabetically first one if there is a tie)", lambda s: min(s, key=lambda c: (-s.count(c), c)),
             "best = ''\nfor c in sorted(set(s)):\n    if best == '' or s.count(c) > s.count(best):\n        best = c\n"
             "return best", text),
            ("pig_latin", T, "returns s with every word changed by moving its first letter to its end and adding "
             "'ay'" + SEP, lambda s: " ".join(w[1:] + w[0] + "ay" for w in s.split(" ")) if s else "",
             "return ' '.join(w[1:] + w[0] + 'ay' for w in s.split())", sentence),
            ("vowel_consonant_counts", "s: str -> list[int]", "returns [v, c] where v is how many vowels (a, e, i, "
             "o, u) s contains and c how many other letters it contains",
             lambda s: [sum(ch in "aeiou" for ch in s), sum(ch.isalpha() and ch not in "aeiou" for ch in s)],
             "v = sum(1 for ch in s if ch in 'aeiou')\nc = sum(1 for ch in s if ch.isalpha()) - v\nreturn [v, c]",
             sentence)]
    for name, sig, does, fn, body, gen in strs:
        edges = [] if name == "most_common_letter" else None
        S.append(_spec("string_rules", 3, name, sig, does, fn, body, gen, edges))
    for k in (1, 2, 3, 5, 7, 13):
        S.append(_spec("caesar", 3, f"caesar_shift_{k}", T, f"returns s with every lower-case letter moved {k} "
                       "places forward in the alphabet, wrapping around from 'z' to 'a'; other characters stay "
                       "unchanged", lambda s, k=k: _shift(s, k), "out = ''\nfor c in s:\n    if 'a' <= c <= 'z':\n"
                       f"        out += chr((ord(c) - ord('a') + {k}) % 26 + ord('a'))\n    else:\n        out += c\n"
                       "return out", sentence))
        if k != 13:  # 13 back is 13 forward
            S.append(_spec("caesar", 3, f"caesar_unshift_{k}", T, f"returns s with every lower-case letter moved "
                           f"{k} places back in the alphabet, wrapping around from 'a' to 'z'; other characters stay "
                           "unchanged", lambda s, k=k: _shift(s, -k), "out = ''\nfor c in s:\n    if c.islower():\n"
                           f"        out += chr((ord(c) - 97 - {k}) % 26 + 97)\n    "
                           f"else:\n        out += c\nreturn out",
                           sentence))
    for k in range(2, 6):
        S.append(_spec("word_rules", 3, f"shout_words_longer_than_{k}", T, f"returns s with every word that has more "
                       f"than {k} letters in upper case and the other words unchanged" + SEP,
                       lambda s, k=k: " ".join(w.upper() if len(w) > k else w for w in s.split(" ")),
                       f"return ' '.join(w.upper() if len(w) > {k} else w for w in s.split(' '))", sentence))
        S.append(_spec("word_rules", 3, f"spin_words_longer_than_{k + 1}", T, "returns s with every word that has "
                       f"more than {k + 1} letters reversed and the other words unchanged" + SEP,
                       lambda s, k=k + 1: " ".join(w[::-1] if len(w) > k else w for w in s.split(" ")),
                       f"return ' '.join(w[::-1] if len(w) > {k + 1} else w for w in s.split(' '))", sentence))
        S.append(_spec("word_rules", 3, f"join_words_longer_than_{k}", T, f"returns the words of s that have more "
                       f"than {k} letters, joined with '-' (an empty string if there are none)" + SEP,
                       lambda s, k=k: "-".join(w for w in s.split() if len(w) > k),
                       f"return '-'.join(w for w in s.split() if len(w) > {k})", sentence))
        S.append(_spec("word_rules", 3, f"censor_words_longer_than_{k + 1}", T, "returns s with every word that has "
                       f"more than {k + 1} letters replaced by as many '*' characters as it has letters" + SEP,
                       lambda s, k=k + 1: " ".join("*" * len(w) if len(w) > k else w for w in s.split(" ")),
                       f"return ' '.join('*' * len(w) if len(w) > {k + 1} else w for w in s.split(' '))", sentence))
    for c in "aeiou":
        S.append(_spec("word_rules", 3, f"uppercase_words_containing_{c}", T, "returns s with every word that "
                       f"contains the letter '{c}' in upper case and the other words unchanged" + SEP,
                       lambda s, c=c: " ".join(w.upper() if c in w else w for w in s.split(" ")),
                       f"return ' '.join(w.upper() if '{c}' in w else w for w in s.split(' '))", sentence))
    # One family each: on strings of parentheses only, a checker for all three kinds is a correct answer.
    for name, pairs, chars in [("parentheses", "()", "( and )"), ("round_and_square", "()[]", "(, ), [ and ]"),
                               ("all_brackets", "()[]{}", "(, ), [, ], { and }")]:
        closing = ", ".join(f"{pairs[i + 1]!r}: {pairs[i]!r}" for i in range(0, len(pairs), 2))
        S.append(_spec(f"brackets_{name}", 3, f"balanced_{name}", "s: str -> bool", "returns True if the brackets "
                       "in s are balanced (every opening bracket is closed by the matching closing bracket, in the "
                       f"right order), otherwise False; s contains only the characters {chars}",
                       lambda s, pairs=pairs: _balanced(s, pairs),
                       f"closing = {{{closing}}}\nstack = []\nfor c in s:\n    if c in closing:\n"
                       "        if not stack or stack.pop() != closing[c]:\n            return False\n    else:\n"
                       "        stack.append(c)\nreturn not stack", brackets(pairs)))
    return S


def _numbers() -> list[Spec]:
    """Digit roots, Collatz, primes, divisibility, bases, digit sums."""
    S: list[Spec] = []
    N = "n: int"
    nums = [("digital_root", "int", "returns the digital root of the non-negative integer n: replace n by the sum "
             "of its digits, again and again, until a single digit remains", lambda n: 1 + (n - 1) % 9 if n else 0,
             "while n >= 10:\n    n = sum(int(c) for c in str(n))\nreturn n", num(0, 100000), None),
            ("collatz_steps", "int", "returns how many steps it takes to reach 1 from the positive integer n, where "
             "a step replaces n by n // 2 if n is even and by 3 * n + 1 if it is odd", None,
             "steps = 0\nwhile n != 1:\n    n = n // 2 if n % 2 == 0 else 3 * n + 1\n    steps += 1\nreturn steps",
             num(1, 60), [1]),
            ("collatz_sequence", "list[int]", "returns the list of the values visited from the positive integer n "
             "down to 1 (both included), where each next value is n // 2 if n is even and 3 * n + 1 if it is odd",
             None, "out = [n]\n"
             "while n != 1:\n    n = n // 2 if n % 2 == 0 else 3 * n + 1\n    out.append(n)\nreturn out",
             num(1, 30), [1]),
            ("primes_below_n", "list[int]", "returns the list of the prime numbers less than n, in increasing order",
             lambda n: _primes_upto(n - 1), "return [p for p in range(2, n) if all(p % d for d in "
             "range(2, p))]", num(0, 60), None),
            ("sum_of_primes_up_to_n", "int", "returns the sum of the prime numbers that are at most n",
             lambda n: sum(_primes_upto(n)), "return sum(p for p in range(2, n + 1) if "
             "all(p % d for d in range(2, p)))", num(0, 100), None),
            ("is_abundant_number", "bool", "returns True if the sum of the positive divisors of the positive "
             "integer n that are smaller than n is greater than n, otherwise False",
             lambda n: sum(d for d in range(1, n // 2 + 1) if n % d == 0) > n,
             "return sum(d for d in range(1, n) if n % d == 0) > n", num(1, 200), [1]),
            ("nth_prime", "int", "returns the n-th prime number, counting the primes 2, 3, 5, 7, ... from n = 1",
             lambda n: _primes_upto(200)[n - 1],
             "count, p = 0, 1\nwhile count < n:\n    p += 1\n    "
             "if all(p % d for d in range(2, p)):\n        count += 1\n"
             "return p", num(1, 40), []),
            ("sum_of_even_digits", "int", "returns the sum of the even digits of the non-negative integer n",
             lambda n: sum(int(c) for c in str(n) if c in "02468"),
             "return sum(int(c) for c in str(n) if int(c) % 2 == 0)",
             num(0, 1000000), None),
            ("sum_of_odd_digits", "int", "returns the sum of the odd digits of the non-negative integer n",
             lambda n: sum(int(c) for c in str(n) if c in "13579"),
             "return sum(int(c) for c in str(n) if int(c) % 2 == 1)",
             num(0, 1000000), None)]

    def collatz(n: int) -> list[int]:
        out = [n]
        while out[-1] > 1:
            out.append(out[-1] * 3 + 1 if out[-1] & 1 else out[-1] >> 1)
        return out
    for name, ret, does, fn, body, gen, edges in nums:
        fn = fn or ((lambda n: len(collatz(n)) - 1) if name == "collatz_steps" else collatz)
        family = "collatz" if name.startswith("collatz") else "number_rules"
        S.append(_spec(family, 3, name, f"{N} -> {ret}", does, fn, body, gen, edges))
    for a, b in [(2, 3), (3, 5), (2, 5), (3, 7), (4, 6)]:
        S.append(_spec("divisibility", 3, f"count_divisible_by_{a}_or_{b}", f"{N} -> int", "returns how many of the "
                       f"numbers 1, 2, ..., n are divisible by {a} or by {b} (or both)",
                       lambda n, a=a, b=b: n // a + n // b - n // math.lcm(a, b),
                       f"return sum(1 for i in range(1, n + 1) if i % {a} == 0 or i % {b} == 0)", num(0, 100)))
    for a, b in [(2, 3), (3, 2), (2, 4), (3, 5), (5, 4), (4, 6)]:
        S.append(_spec("divisibility", 3, f"count_divisible_by_{a}_not_{b}", f"{N} -> int", "returns how many of "
                       f"the numbers 1, 2, ..., n are divisible by {a} but not by {b}",
                       lambda n, a=a, b=b: n // a - n // math.lcm(a, b),
                       f"return sum(1 for i in range(1, n + 1) if i % {a} == 0 and i % {b} != 0)", num(0, 100)))
    for k in range(3, 10):
        S.append(_spec("base_k", 3, f"to_base_{k}", f"{N} -> str", f"returns the non-negative integer n written in "
                       f"base {k}, as a string of digits ('0' for 0)", lambda n, k=k: _base(n, k),
                       f"if n == 0:\n    return '0'\ndigits = ''\nwhile n > 0:\n    digits = str(n % {k}) + digits\n"
                       f"    n //= {k}\nreturn digits", num(0, 500)))
    for k in (2, 4, 5, 7):  # (3 would count the multiples of 3)
        S.append(_spec("digit_sums", 3, f"count_digit_sums_divisible_by_{k}", f"{N} -> int", "returns how many of "
                       f"the numbers 1, 2, ..., n have a digit sum divisible by {k}",
                       lambda n, k=k: sum(sum(map(int, str(i))) % k == 0 for i in range(1, n + 1)),
                       f"return sum(1 for i in range(1, n + 1) if sum(int(c) for c in str(i)) % {k} == 0)",
                       num(0, 200)))
    return S
