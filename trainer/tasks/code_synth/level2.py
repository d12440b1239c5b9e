"""Level 2: two operations composed (filter then map, map then aggregate, splits and joins, rotations, digit
arithmetic, simple conditionals)."""
from __future__ import annotations

import math
import random

from .blocks import (
    INTS,
    MAPS,
    NONNEG,
    PREDS,
    PRIMES,
    SMALL,
    WORDS,
    Spec,
    _is_prime,
    _kname,
    _spec,
    biased,
    ints,
    mixed,
    num,
    sentence,
    text,
    with_word,
    wordlist,
)


def same_len(rng: random.Random) -> tuple[list[int], list[int]]:
    n = rng.randint(1, 6)
    return [rng.randint(-5, 9) for _ in range(n)], [rng.randint(-5, 9) for _ in range(n)]


def anagram_pair(rng: random.Random) -> tuple[str, str]:
    a = text(rng)
    b = "".join(rng.sample(a, len(a))) if rng.random() < 0.5 else text(rng)
    return a, b


def specs() -> list[Spec]:
    # The order is part of the output: the catalogue's order decides every seed's shuffle and each spec's
    # neighbours in its family (its rivals), so reordering these would change every problem set.
    return _maps_and_aggregates() + _list_ops() + _strings() + _words() + _numbers()


def _maps_and_aggregates() -> list[Spec]:
    """Filter then map, filter then aggregate, map then aggregate."""
    S: list[Spec] = []
    L = "xs: list[int] -> list[int]"
    more_maps = [("add_2_to", "increased by 2", "x + 2", lambda x: x + 2),
                 ("add_3_to", "increased by 3", "x + 3", lambda x: x + 3),
                 ("multiply_by_10", "multiplied by 10", "x * 10", lambda x: x * 10),
                 ("subtract_5_from", "decreased by 5", "x - 5", lambda x: x - 5)]
    for pname, pwords, psrc, p in PREDS:
        for verb, mwords, msrc, m in MAPS + more_maps:
            S.append(_spec("filter_map", 2, f"{verb}_the_{pname}", L, f"returns a new list of the elements of xs "
                           f"that are {pwords}, each {mwords}, in their original order",
                           lambda xs, p=p, m=m: list(map(m, filter(p, xs))), f"return [{msrc} for x in xs if {psrc}]"))
        S.append(_spec("filter_sum", 2, f"sum_of_{pname}", "xs: list[int] -> int", "returns the sum of the "
                       f"elements of xs that are {pwords} (0 if there are none)",
                       lambda xs, p=p: sum(filter(p, xs)), f"return sum(x for x in xs if {psrc})"))
        S.append(_spec("filter_max", 2, f"largest_of_the_{pname}", "xs: list[int] -> int | None", "returns the "
                       f"largest element of xs that is {pwords}, or None if there is none",
                       lambda xs, p=p: max(filter(p, xs), default=None),
                       f"found = [x for x in xs if {psrc}]\nreturn max(found) if found else None"))
    agg = [("sum_of_squares", "int", "returns the sum of the squares of the elements of xs",
            lambda xs: sum(x ** 2 for x in xs), "return sum(x * x for x in xs)", INTS, None),
           ("sum_of_absolute_values", "int", "returns the sum of the absolute values of the elements of xs",
            lambda xs: sum(map(abs, xs)), "return sum(abs(x) for x in xs)", INTS, None),
           ("largest_absolute_value", "int", "returns the largest absolute value among the elements of the "
            "non-empty list xs", lambda xs: sorted(map(abs, xs))[-1], "return max(abs(x) for x in xs)", INTS, []),
           ("count_distinct", "int", "returns how many different values occur in xs",
            lambda xs: len(dict.fromkeys(xs)), "return len(set(xs))", SMALL, None),
           ("mean_rounded_down", "int", "returns the average of the non-empty list xs, rounded down to an "
            "integer (use //)", lambda xs: sum(xs) // len(xs), "return sum(xs) // len(xs)", INTS, []),
           ("spread", "int", "returns the largest element of the non-empty list xs minus its smallest element",
            lambda xs: sorted(xs)[-1] - sorted(xs)[0], "return max(xs) - min(xs)", INTS, []),
           ("sum_at_even_indices", "int", "returns the sum of the elements of xs at even positions (indices 0, "
            "2, 4, ...)", lambda xs: sum(x for i, x in enumerate(xs) if i % 2 == 0), "return sum(xs[::2])", INTS, None),
           ("sum_at_odd_indices", "int", "returns the sum of the elements of xs at odd positions (indices 1, "
            "3, 5, ...)", lambda xs: sum(x for i, x in enumerate(xs) if i % 2), "return sum(xs[1::2])", INTS, None)]
    for k in range(3, 8):  # (mod 2 would be count_odds)
        agg.append((f"sum_of_remainders_mod_{k}", "int", f"returns the sum of the remainders of the elements of "
                    f"xs divided by {k}", lambda xs, k=k: sum(x - k * (x // k) for x in xs),
                    f"return sum(x % {k} for x in xs)", NONNEG, None))
        agg.append((f"sum_after_adding_{k - 1}", "int", f"returns the sum of the elements of xs after adding "
                    f"{k - 1} to each of them", lambda xs, k=k: sum(xs) + (k - 1) * len(xs),
                    f"return sum(x + {k - 1} for x in xs)", INTS, None))
    for k in range(1, 6):
        agg.append((f"sum_of_first_{k}", "int", f"returns the sum of the first {k} elements of xs (of all of "
                    "them if xs is shorter)", lambda xs, k=k: sum(xs[i] for i in range(min(k, len(xs)))),
                    f"return sum(xs[:{k}])", INTS, None))
        agg.append((f"sum_of_last_{k}", "int", f"returns the sum of the last {k} elements of xs (of all of "
                    "them if xs is shorter)", lambda xs, k=k: sum(xs) - sum(xs[:max(len(xs) - k, 0)]),
                    f"return sum(xs[-{k}:])", INTS, None))
    for name, ret, does, fn, body, gen, edges in agg:
        S.append(_spec("map_aggregate", 2, name, f"xs: list[int] -> {ret}", does, fn, body, gen, edges))
    return S


def _list_ops() -> list[Spec]:
    """Reordering, running values, rotations, slices, positions, clamps, two lists."""
    S: list[Spec] = []
    L = "xs: list[int] -> list[int]"

    def running(op):
        def f(xs):
            out = []
            for x in xs:
                out.append(op(out[-1], x) if out else x)
            return out
        return f
    lists = [("dedupe_keeping_order", "returns xs without repeated values: only the first occurrence of each "
              "value is kept, in the original order", lambda xs: list(dict.fromkeys(xs)),
              "seen = []\nfor x in xs:\n    if x not in seen:\n        seen.append(x)\nreturn seen", SMALL),
             ("reverse_list", "returns a new list with the elements of xs in reverse order",
              lambda xs: list(reversed(xs)), "return xs[::-1]", INTS),
             ("sort_ascending", "returns a new list with the elements of xs sorted from smallest to largest",
              lambda xs: sorted(xs, key=lambda x: x), "return sorted(xs)", INTS),
             ("sort_descending", "returns a new list with the elements of xs sorted from largest to smallest",
              lambda xs: sorted(xs)[::-1], "return sorted(xs, reverse=True)", INTS),
             ("running_sums", "returns a list whose i-th element is the sum of xs[0] through xs[i]",
              running(lambda a, x: a + x), "out, total = [], 0\nfor x in xs:\n    total += x\n    out.append(total)"
              "\nreturn out", INTS),
             ("running_maximum", "returns a list whose i-th element is the largest of xs[0] through xs[i]",
              running(lambda a, x: a if a > x else x), "return [max(xs[:i + 1]) for i in range(len(xs))]", INTS),
             ("pairwise_differences", "returns the list of xs[i + 1] - xs[i] for each pair of neighbouring "
              "elements (empty if xs has fewer than two elements)", lambda xs: [b - a for a, b in zip(xs, xs[1:])],
              "return [xs[i + 1] - xs[i] for i in range(len(xs) - 1)]", INTS),
             ("unique_sorted_descending", "returns the different values of xs, each once, from largest to smallest",
              lambda xs: sorted(dict.fromkeys(xs))[::-1], "return sorted(set(xs), reverse=True)", SMALL),
             ("zero_out_negatives", "returns a new list with every negative element of xs replaced by 0",
              lambda xs: [x if x > 0 else 0 for x in xs], "return [max(x, 0) for x in xs]", INTS),
             ("halve_evens", "returns a new list where every even element of xs is halved (//) and every odd "
              "element is unchanged", lambda xs: [x >> 1 if x % 2 == 0 else x for x in xs],
              "return [x // 2 if x % 2 == 0 else x for x in xs]", INTS)]
    for name, does, fn, body, gen in lists:
        S.append(_spec("list_ops", 2, name, L, does, fn, body, gen))
    S.append(_spec("list_ops", 2, "count_rises", "xs: list[int] -> int", "returns how many elements of xs are "
                   "greater than the element just before them", lambda xs: sum(b > a for a, b in zip(xs, xs[1:])),
                   "return sum(1 for i in range(1, len(xs)) if xs[i] > xs[i - 1])"))
    S.append(_spec("list_ops", 2, "index_of_largest", "xs: list[int] -> int", "returns the index of the first "
                   "occurrence of the largest element of the non-empty list xs",
                   lambda xs: min(i for i, x in enumerate(xs) if x == max(xs)), "return xs.index(max(xs))", SMALL, []))
    S.append(_spec("list_ops", 2, "even_odd_labels", "xs: list[int] -> list[str]", "returns a new list with "
                   "'even' for every even element of xs and 'odd' for every odd one",
                   lambda xs: [("even", "odd")[x % 2] for x in xs],
                   "return ['even' if x % 2 == 0 else 'odd' for x in xs]"))
    S.append(_spec("list_ops", 2, "signs", L, "returns a new list with 1 for every positive element of xs, -1 "
                   "for every negative one and 0 for every zero", lambda xs: [(x > 0) - (x < 0) for x in xs],
                   "return [1 if x > 0 else -1 if x < 0 else 0 for x in xs]", ints(-3, 3)))
    for k in range(1, 5):
        S.append(_spec("rotate", 2, f"rotate_left_by_{k}", L, f"returns xs rotated left by {k}: the result of "
                       f"moving the first element to the end, {k} times", lambda xs, k=k: [xs[(i + k) % len(xs)]
                       for i in range(len(xs))],
                       f"if not xs:\n    return []\nk = {k} % len(xs)\nreturn xs[k:] + xs[:k]"))
        S.append(_spec("rotate", 2, f"rotate_right_by_{k}", L, f"returns xs rotated right by {k}: the result of "
                       f"moving the last element to the front, {k} times", lambda xs, k=k: [xs[(i - k) % len(xs)]
                       for i in range(len(xs))], f"if not xs:\n    return []\nk = {k} % len(xs)\n"
                       "return xs[len(xs) - k:] + xs[:len(xs) - k]"))
    for k in range(1, 6):
        S.append(_spec("slice", 2, f"first_{k}_elements", L, f"returns a new list of the first {k} elements of xs "
                       "(all of xs if it is shorter)", lambda xs, k=k: [x for i, x in enumerate(xs) if i < k],
                       f"return xs[:{k}]"))
        S.append(_spec("slice", 2, f"drop_first_{k}", L, f"returns a new list of the elements of xs after the "
                       f"first {k} (empty if xs has at most {k} elements)", lambda xs, k=k: [x for i, x in
                       enumerate(xs) if i >= k], f"return xs[{k}:]"))
    for k in range(2, 5):
        S.append(_spec("slice", 2, f"every_{k}th_element", L, f"returns a new list of every {k}-th element of xs, "
                       f"starting with the first (indices 0, {k}, {2 * k}, ...)",
                       lambda xs, k=k: [x for i, x in enumerate(xs) if i % k == 0], f"return xs[::{k}]"))
    for k in range(0, 10):
        S.append(_spec("index_of_k", 2, f"index_of_{k}", "xs: list[int] -> int", f"returns the index of the first "
                       f"occurrence of {k} in xs, or -1 if {k} does not occur",
                       lambda xs, k=k: next((i for i, x in enumerate(xs) if x == k), -1),
                       f"for i, x in enumerate(xs):\n    if x == {k}:\n        return i\nreturn -1", SMALL))
    for k in range(0, 6):
        S.append(_spec("positions_of_k", 2, f"positions_of_{k}", L, f"returns the list of the indices at which "
                       f"{k} occurs in xs, in increasing order",
                       lambda xs, k=k: [i for i in range(len(xs)) if xs[i] == k],
                       f"return [i for i, x in enumerate(xs) if x == {k}]", ints(0, 6, (1, 9))))
        S.append(_spec("double_above_k", 2, f"double_values_above_{k}", L, "returns a new list where every "
                       f"element of xs greater than {k} is doubled and every other element is unchanged",
                       lambda xs, k=k: [x + x * (x > k) for x in xs], f"return [x * 2 if x > {k} else x for x in xs]"))
    for k in range(3, 9):
        S.append(_spec("first_index_above", 2, f"first_index_above_{k}", "xs: list[int] -> int", "returns the "
                       f"index of the first element of xs greater than {k}, or -1 if there is none",
                       lambda xs, k=k: next((i for i, x in enumerate(xs) if x > k), -1),
                       f"for i, x in enumerate(xs):\n    if x > {k}:\n        return i\nreturn -1", ints(0, 12)))
    for k in range(2, 7):
        S.append(_spec("zero_multiples", 2, f"zero_multiples_of_{k}", L, "returns a new list where every element "
                       f"of xs divisible by {k} is replaced by 0", lambda xs, k=k: [x * (x % k != 0) for x in xs],
                       f"return [0 if x % {k} == 0 else x for x in xs]"))
    for lo, hi in [(0, 10), (0, 5), (1, 9), (-5, 5), (2, 8)]:
        nm = f"{_kname(lo)}_and_{hi}"
        S.append(_spec("clamp", 2, f"clamp_between_{nm}", L, f"returns a new list where every element of xs "
                       f"below {lo} is replaced by {lo} and every element above {hi} is replaced by {hi}",
                       lambda xs, lo=lo, hi=hi: [sorted((lo, x, hi))[1] for x in xs],
                       f"return [min(max(x, {lo}), {hi}) for x in xs]"))
        S.append(_spec("between", 2, f"keep_between_{nm}", L, f"returns a new list of the elements of xs that are "
                       f"at least {lo} and at most {hi}, in their original order",
                       lambda xs, lo=lo, hi=hi: [x for x in xs if x in range(lo, hi + 1)],
                       f"return [x for x in xs if {lo} <= x <= {hi}]"))
        S.append(_spec("between", 2, f"count_between_{nm}", "xs: list[int] -> int", "returns how many elements "
                       f"of xs are at least {lo} and at most {hi}",
                       lambda xs, lo=lo, hi=hi: sum(lo <= x <= hi for x in xs),
                       f"return len([x for x in xs if {lo} <= x <= {hi}])"))
    for k in range(1, 6):
        S.append(_spec("at_least_k", 2, f"raise_to_at_least_{k}", L, f"returns a new list where every element of "
                       f"xs smaller than {k} is replaced by {k}", lambda xs, k=k: [k if x < k else x for x in xs],
                       f"return [max(x, {k}) for x in xs]"))
        S.append(_spec("at_most_k", 2, f"cap_at_{k + 4}", L, f"returns a new list where every element of xs "
                       f"larger than {k + 4} is replaced by {k + 4}",
                       lambda xs, k=k + 4: [k if x > k else x for x in xs],
                       f"return [min(x, {k + 4}) for x in xs]"))
    for a, b in [(0, 1), (1, 0), (2, 5), (5, 2), (3, 9), (9, 3), (7, 0), (4, 8)]:
        S.append(_spec("replace_value", 2, f"replace_{a}s_with_{b}s", L, f"returns a new list where every {a} in "
                       f"xs is replaced by {b}", lambda xs, a=a, b=b: [b if x == a else x for x in xs],
                       f"return [{b} if x == {a} else x for x in xs]", SMALL))
    P = "xs: list[int], ys: list[int]"
    pairs = [("elementwise_sum", "list[int]", "returns the list of xs[i] + ys[i] for every position i (xs and ys "
              "have the same length)",
              lambda xs, ys: list(map(sum, zip(xs, ys))), "return [a + b for a, b in zip(xs, ys)]"),
             ("dot_product", "int", "returns the sum of xs[i] * ys[i] over every position i (xs and ys have the "
              "same length)", lambda xs, ys: sum(xs[i] * ys[i] for i in range(len(xs))),
              "return sum(a * b for a, b in zip(xs, ys))"),
             ("elementwise_max", "list[int]", "returns the list of the larger of xs[i] and ys[i] for every position "
              "i (xs and ys have the same length)", lambda xs, ys: list(map(max, xs, ys)),
              "return [max(a, b) for a, b in zip(xs, ys)]"),
             ("count_matches", "int", "returns how many positions i have xs[i] == ys[i] (xs and ys have the same "
              "length)", lambda xs, ys: sum(map(int.__eq__, xs, ys)),
              "return sum(1 for a, b in zip(xs, ys) if a == b)")]
    for name, ret, does, fn, body in pairs:
        gen = same_len if name != "count_matches" else (
            lambda rng: tuple(map(lambda xs: [x % 3 for x in xs], same_len(rng))))
        S.append(_spec("two_lists", 2, name, f"{P} -> {ret}", does, fn, body, gen))
    return S


def _strings() -> list[Spec]:
    """Words and characters of a string."""
    S: list[Spec] = []
    T, SEP = "s: str -> str", " (words are separated by single spaces)"
    strs = [("reverse_each_word", T, "returns s with the letters of every word reversed, keeping the words in "
             "their order" + SEP, lambda s: " ".join(w[::-1] for w in s.split(" ")),
             "return ' '.join(w[::-1] for w in s.split(' '))", sentence, None),
            ("reverse_word_order", T, "returns s with its words in reverse order" + SEP,
             lambda s: " ".join(reversed(s.split(" "))), "return ' '.join(s.split(' ')[::-1])", sentence, None),
            ("capitalize_each_word", T, "returns s with the first letter of every word in upper case" + SEP,
             lambda s: " ".join(w[:1].upper() + w[1:] for w in s.split(" ")),
             "return ' '.join(w.capitalize() for w in s.split(' '))", sentence, None),
            ("acronym", T, "returns the first letters of the words of s, upper-cased and joined together" + SEP,
             lambda s: "".join(w[0] for w in s.split()).upper(), "return ''.join(w[0].upper() for w in s.split())",
             sentence, None),
            ("longest_word", T, "returns the longest word of the non-empty string s (the first one if several are "
             "equally long)" + SEP, lambda s: max(s.split(), key=len),
             "best = ''\nfor w in s.split():\n    if len(w) > len(best):\n        best = w"
             "\nreturn best", sentence, []),
            ("shortest_word", T, "returns the shortest word of the non-empty string s (the first one if several "
             "are equally short)" + SEP, lambda s: min(s.split(), key=len),
             "words = s.split()\nbest = words[0]\nfor w in words:\n    if len(w) < len(best):\n        best = w"
             "\nreturn best", sentence, []),
            ("unique_characters", T, "returns s with only the first occurrence of each character kept",
             lambda s: "".join(dict.fromkeys(s)), "out = ''\nfor c in s:\n    if c not in out:\n        out += c"
             "\nreturn out", sentence, None),
            ("every_other_character", T, "returns the characters of s at even positions (0, 2, 4, ...) joined "
             "together", lambda s: "".join(c for i, c in enumerate(s) if i % 2 == 0), "return s[::2]", text, None),
            ("remove_vowels", T, "returns s with every vowel (a, e, i, o, u) removed",
             lambda s: "".join(c for c in s if c not in "aeiou"),
             "return ''.join(c for c in s if c not in 'aeiou')", sentence, None),
            ("double_each_character", T, "returns s with every character written twice",
             lambda s: "".join(c + c for c in s), "return ''.join(c * 2 for c in s)", text, None),
            ("sort_letters", T, "returns the characters of s sorted alphabetically, joined together",
             lambda s: "".join(sorted(s)), "return ''.join(sorted(s))", text, None),
            ("count_uppercase", "s: str -> int", "returns how many upper-case letters s contains",
             lambda s: sum(c != c.lower() for c in s), "return sum(1 for c in s if c.isupper())", mixed, None),
            ("capitalize_first", T, "returns s with its first character in upper case and the rest unchanged",
             lambda s: s[:1].upper() + s[1:], "return s[:1].upper() + s[1:]", mixed, None),
            ("vowels_per_word", "s: str -> list[int]", "returns the number of vowels (a, e, i, o, u) in each word "
             "of s, in order" + SEP, lambda s: [sum(c in "aeiou" for c in w) for w in s.split()],
             "return [sum(1 for c in w if c in 'aeiou') for w in s.split()]", sentence, None),
            ("dedupe_words", T, "returns s with repeated words removed, keeping the first occurrence of each"
             + SEP, lambda s: " ".join(dict.fromkeys(s.split(" "))) if s else "",
             "out = []\nfor w in s.split():\n    if w not in out:\n        out.append(w)\nreturn ' '.join(out)",
             lambda rng: " ".join(rng.choice(WORDS[:8]) for _ in range(rng.randint(1, 7))), None)]
    for name, sig, does, fn, body, gen, edges in strs:
        S.append(_spec("string_ops", 2, name, sig, does, fn, body, gen, edges))
    S.append(_spec("string_ops", 2, "is_anagram", "a: str, b: str -> bool", "returns True if b uses exactly the "
                   "same letters as a, each the same number of times (in any order), otherwise False",
                   lambda a, b: sorted(a) == sorted(b), "return sorted(a) == sorted(b)", anagram_pair, [("", "")]))
    for k in range(2, 7):
        S.append(_spec("count_long_words", 2, f"count_words_longer_than_{k}", "s: str -> int", "returns how many "
                       f"words of s have more than {k} letters" + SEP,
                       lambda s, k=k: sum(len(w) > k for w in s.split()),
                       f"return len([w for w in s.split() if len(w) > {k}])", sentence))
    for c, what in [("*", "stars"), ("#", "hashes"), ("-", "dashes"), ("_", "underscores"), (".", "dots")]:
        S.append(_spec("replace_vowels", 2, f"replace_vowels_with_{what}", T, f"returns s with every vowel (a, e, "
                       f"i, o, u) replaced by '{c}'", lambda s, c=c: "".join(c if x in "aeiou" else x for x in s),
                       f"return ''.join('{c}' if ch in 'aeiou' else ch for ch in s)", sentence))
    for c in "aeiou":
        S.append(_spec("words_with_letter", 2, f"count_words_containing_{c}", "s: str -> int", "returns how many "
                       f"words of s contain the letter '{c}'" + SEP,
                       lambda s, c=c: len([w for w in s.split() if c in w]),
                       f"return sum(1 for w in s.split() if '{c}' in w)", sentence))
    return S


def _words() -> list[Spec]:
    """Sorting and counting lists of words."""
    S: list[Spec] = []
    W = "words: list[str]"
    S.append(_spec("word_list_ops", 2, "sort_words_alphabetically", f"{W} -> list[str]", "returns a new list "
                   "with the words in words sorted alphabetically",
                   lambda ws: sorted(ws, key=str), "return sorted(words)"))
    S.append(_spec("word_list_ops", 2, "sort_words_by_length", f"{W} -> list[str]", "returns a new list with the "
                   "words in words sorted from shortest to longest; words of equal length keep their original order",
                   lambda ws: [w for n in range(20) for w in ws if len(w) == n], "return sorted(words, key=len)"))
    for c in "abcdst":
        S.append(_spec("word_list_ops", 2, f"count_words_starting_with_{c}", f"{W} -> int", "returns how many "
                       f"words in words start with the letter '{c}'", lambda ws, c=c: [w[0] for w in ws].count(c),
                       f"return sum(1 for w in words if w.startswith('{c}'))",
                       biased(wordlist, lambda rng, c=c: [with_word(lambda w: w[0] == c)(rng)] + wordlist(rng))))
    return S


def _numbers() -> list[Spec]:
    """Digits, factorials, Fibonacci, divisors, primes, binary, gcd and lcm, powers."""
    S: list[Spec] = []
    N = "n: int"
    digits = num(0, 100000)
    nums = [("sum_of_digits", "int", "returns the sum of the digits of the non-negative integer n",
             lambda n: sum(map(int, str(n))),
             "total = 0\nwhile n > 0:\n    total += n % 10\n    n //= 10\nreturn total",
             digits, None),
            ("count_digits", "int", "returns how many digits the non-negative integer n has (0 has one digit)",
             lambda n: len(str(n)), "return len(str(n))", digits, None),
            ("reverse_digits", "int", "returns the integer whose digits are the digits of the non-negative integer "
             "n in reverse order (leading zeros of the result are dropped)", lambda n: int("".join(reversed(str(n)))),
             "return int(str(n)[::-1])", biased(digits, lambda rng: 10 * rng.randint(1, 999)), None),
            ("digits_of", "list[int]", "returns the list of the digits of the non-negative integer n, from left to "
             "right", lambda n: [ord(c) - 48 for c in str(n)], "return [int(c) for c in str(n)]", digits, None),
            ("factorial", "int", "returns n! = 1 * 2 * ... * n (1 when n is 0)", math.factorial,
             "result = 1\nfor i in range(2, n + 1):\n    result *= i\nreturn result", num(0, 12), None),
            ("fibonacci", "int", "returns the n-th Fibonacci number, where F(0) = 0, F(1) = 1 and F(n) = F(n - 1) "
             "+ F(n - 2)", lambda n: round(((1 + 5 ** 0.5) / 2) ** n / 5 ** 0.5),
             "a, b = 0, 1\nfor _ in range(n):\n    a, b = b, a + b\nreturn a", num(0, 30), None),
            ("count_divisors", "int", "returns how many positive integers divide the positive integer n",
             lambda n: sum(n % d == 0 for d in range(1, n + 1)),
             "return len([d for d in range(1, n + 1) if n % d == 0])",
             num(1, 120), [1]),
            ("divisors_of", "list[int]", "returns the list of the positive divisors of the positive integer n, in "
             "increasing order", lambda n: [d for d in range(1, n + 1) if not n % d],
             "return [d for d in range(1, n + 1) if n % d == 0]", num(1, 100), [1]),
            ("is_prime", "bool", "returns True if n is a prime number, otherwise False", _is_prime,
             "if n < 2:\n    return False\n"
             "for d in range(2, n):\n    if n % d == 0:\n        return False\nreturn True",
             biased(num(0, 100), lambda rng: rng.choice(PRIMES)), [0, 1]),
            ("is_perfect_square", "bool", "returns True if the non-negative integer n is the square of an integer, "
             "otherwise False", lambda n: math.isqrt(n) ** 2 == n,
             "r = 0\nwhile r * r < n:\n    r += 1\nreturn r * r == n",
             biased(num(0, 400), lambda rng: rng.randint(0, 20) ** 2), None),
            ("is_power_of_two", "bool", "returns True if the non-negative integer n is a power of two (1, 2, 4, 8, "
             "...), otherwise False", lambda n: n > 0 and bin(n).count("1") == 1,
             "if n < 1:\n    return False\nwhile n % 2 == 0:\n    n //= 2\nreturn n == 1",
             biased(num(0, 1100), lambda rng: 2 ** rng.randint(0, 10)), None),
            ("to_binary", "str", "returns the binary representation of the non-negative integer n as a string of 0s "
             "and 1s, without a prefix ('0' for 0)", lambda n: format(n, "b"), "return bin(n)[2:]", num(0, 300), None),
            ("count_ones_in_binary", "int", "returns how many 1s the binary representation of the non-negative "
             "integer n has", lambda n: format(n, "b").count("1"), "return bin(n).count('1')", num(0, 300), None)]
    for name, ret, does, fn, body, gen, edges in nums:
        S.append(_spec("number_ops", 2, name, f"{N} -> {ret}", does, fn, body, gen, edges))
    S.append(_spec("number_ops", 2, "gcd_of", "a: int, b: int -> int", "returns the greatest common divisor of the "
                   "positive integers a and b", math.gcd, "while b:\n    a, b = b, a % b\nreturn a",
                   lambda rng: (lambda g: (g * rng.randint(1, 12), g * rng.randint(1, 12)))(rng.randint(1, 9)), []))
    S.append(_spec("number_ops", 2, "lcm_of", "a: int, b: int -> int", "returns the least common multiple of the "
                   "positive integers a and b", lambda a, b: a * b // math.gcd(a, b),
                   "m = a\nwhile m % b != 0:\n    m += a\nreturn m",
                   lambda rng: (rng.randint(1, 20), rng.randint(1, 20)), []))
    for k in range(2, 10):
        S.append(_spec("multiples_below", 2, f"sum_of_multiples_of_{k}_below_n", f"{N} -> int", "returns the sum of "
                       f"the positive multiples of {k} that are less than n", lambda n, k=k: sum(range(k, n, k)),
                       f"return sum(i for i in range(1, n) if i % {k} == 0)", num(0, 100)))
        S.append(_spec("multiples_up_to", 2, f"count_multiples_of_{k}_up_to_n", f"{N} -> int", "returns how many of "
                       f"the numbers 1, 2, ..., n are divisible by {k}", lambda n, k=k: len(range(k, n + 1, k)),
                       f"return n // {k}", num(0, 100)))
    for b in range(2, 6):
        S.append(_spec("power", 2, f"power_of_{b}", f"{N} -> int", f"returns {b} raised to the power n",
                       lambda n, b=b: math.prod([b] * n), f"return {b} ** n", num(0, 12)))
    return S
