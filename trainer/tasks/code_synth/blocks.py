"""The vocabulary every problem family is written in: ``Spec`` (one problem's behaviour) and ``_spec`` that
builds one from a signature string, the argument generators that draw inputs, the word list, the predicates
and maps the list families share, and the prime helpers two levels' references use.

Names with a leading underscore are shared inside this package only; the package's public API is in
``__init__``.
"""
from __future__ import annotations

import bisect
import random
import string
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable

WORDS = ("apple", "banana", "cherry", "dog", "cat", "sun", "moon", "star", "tree", "river", "stone", "house",
         "bird", "fish", "green", "blue", "red", "light", "night", "table", "chair", "book", "pen", "cup", "milk",
         "bread", "rain", "snow", "wind", "fire", "water", "road", "car", "train", "boat", "city", "town",
         "door", "garden", "flower", "grass", "leaf", "cloud", "sky", "day", "music", "song", "dance", "game",
         "ball", "kite", "lamp", "desk", "paper", "letter", "story", "dream", "smile", "happy", "quick", "slow",
         "tall", "small", "big", "old", "new", "cold", "warm", "sweet", "salt", "sand", "sea", "ice", "egg",
         "owl", "ant", "idea", "orange", "echo", "level", "noon", "radar", "yes", "glass", "bus", "tea", "a", "ox",
         "go", "up", "umbrella", "elephant", "mountain", "computer", "holiday", "butterfly", "kiwi", "bikini",
         "museum", "ukulele")
PRIMES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71, 73, 79, 83, 89, 97)

# -- argument generators: rng -> one value ---------------------------------------------------------------
def ints(lo: int, hi: int, n: tuple[int, int] = (1, 8)) -> Callable[[random.Random], list[int]]:
    return lambda rng: [rng.randint(lo, hi) for _ in range(rng.randint(*n))]


INTS, NONNEG, SMALL, PROD = ints(-9, 20), ints(0, 40), ints(0, 9, (3, 9)), ints(-4, 6, (1, 6))


def num(lo: int, hi: int) -> Callable[[random.Random], int]:
    return lambda rng: rng.randint(lo, hi)


def text(rng: random.Random) -> str:  # a word, or a made-up lower-case string
    if rng.random() < 0.6:
        return rng.choice(WORDS)
    return "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(2, 9)))


def sentence(rng: random.Random) -> str:  # words repeat sometimes, which dedupe/frequency tasks need
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 6)))


def wordlist(rng: random.Random) -> list[str]:
    return sentence(rng).split()


def mixed(rng: random.Random) -> str:
    return "".join(c.upper() if rng.random() < 0.4 else c for c in text(rng))


def palindrome(rng: random.Random) -> str:
    w = text(rng)
    return w + w[::-1][rng.randint(0, 1):] if rng.random() < 0.5 else w


def biased(base: Callable, good: Callable) -> Callable:  # half the draws from ``good`` (rare positives)
    return lambda rng: good(rng) if rng.random() < 0.5 else base(rng)


def with_word(pred: Callable[[str], bool]) -> Callable[[random.Random], str]:
    pool = [w for w in WORDS if pred(w)]
    return lambda rng: rng.choice(pool)


DEFAULT_GEN = {"list[int]": INTS, "str": text, "int": num(0, 60), "list[str]": wordlist}
EMPTY = {"list[int]": [], "str": "", "int": 0, "list[str]": []}


@dataclass(frozen=True)
class Spec:
    """One problem's behaviour: the trusted ``ref`` decides the expected outputs; ``body`` is the solution."""
    family: str
    level: int
    name: str
    params: tuple[tuple[str, str], ...]       # (argument, type)
    ret: str
    does: str                                 # "returns ...", naming the arguments
    ref: Callable[..., Any]
    body: str
    draw: Callable[[random.Random], tuple]    # one random argument tuple
    edges: tuple[tuple, ...]                  # argument tuples tested every time (empty inputs)

    @property
    def signature(self) -> str:
        return f"{self.name}({', '.join(f'{p}: {t}' for p, t in self.params)}) -> {self.ret}"

    @property
    def solution(self) -> str:
        return f"def {self.signature}:\n" + "".join(f"    {line}\n" for line in self.body.splitlines())


def _spec(family: str, level: int, name: str, sig: str, does: str, ref: Callable, body: str,
          gen: Callable | None = None, edges: list | None = None) -> Spec:
    """``sig`` is "xs: list[int] -> int". One argument: ``gen`` draws its value and ``edges`` lists values
    (default: the empty value; ``[]`` for tasks that need a non-empty input). Several: tuples."""
    params_src, ret = sig.split(" -> ")
    params = tuple(tuple(p.split(": ")) for p in params_src.split(", "))
    if len(params) == 1:
        g = gen or DEFAULT_GEN[params[0][1]]
        draw = lambda rng, g=g: (g(rng),)  # noqa: E731
        edge_args = [(e,) for e in (edges if edges is not None else [EMPTY[params[0][1]]])]
    else:
        draw = gen
        edge_args = [tuple(e) for e in (edges if edges is not None else [tuple(EMPTY[t] for _, t in params)])]
    return Spec(family, level, name, params, ret, does, ref, body, draw, tuple(edge_args))


def _kname(k: int) -> str:
    return f"minus_{-k}" if k < 0 else str(k)


# Shared building blocks of the list families: (name part, words, source in x, trusted callable).
PREDS = [("evens", "even", "x % 2 == 0", lambda x: x % 2 == 0),
         ("odds", "odd", "x % 2 == 1", lambda x: x % 2 != 0),
         ("positives", "positive", "x > 0", lambda x: x > 0),
         ("negatives", "negative", "x < 0", lambda x: x < 0),
         ("values_above_2", "greater than 2", "x > 2", lambda x: x > 2),
         ("values_above_5", "greater than 5", "x > 5", lambda x: x > 5),
         ("values_above_10", "greater than 10", "x > 10", lambda x: x > 10),
         ("multiples_of_3", "divisible by 3", "x % 3 == 0", lambda x: x % 3 == 0),
         ("multiples_of_5", "divisible by 5", "x % 5 == 0", lambda x: x % 5 == 0)]
MAPS = [("double", "doubled", "x * 2", lambda x: 2 * x), ("triple", "tripled", "x * 3", lambda x: 3 * x),
        ("square", "squared", "x * x", lambda x: x ** 2), ("negate", "negated", "-x", lambda x: 0 - x),
        ("add_1_to", "increased by 1", "x + 1", lambda x: x + 1),
        ("add_5_to", "increased by 5", "x + 5", lambda x: x + 5),
        ("add_10_to", "increased by 10", "x + 10", lambda x: x + 10),
        ("subtract_1_from", "decreased by 1", "x - 1", lambda x: x - 1),
        ("halve", "halved with // (rounded down)", "x // 2", lambda x: (x - x % 2) // 2)]


# -- primes: trial division for the simple references, a cached sieve where inputs get large -------------
def _is_prime(n: int) -> bool:
    return n > 1 and all(n % d for d in range(2, int(n ** 0.5) + 1))


@lru_cache(maxsize=None)
def _sieve(limit: int) -> list[int]:
    is_prime = bytearray([1]) * limit
    is_prime[:2] = b"\0\0"
    for i in range(2, int(limit ** 0.5) + 1):
        if is_prime[i]:
            is_prime[i * i::i] = bytes(len(range(i * i, limit, i)))
    return [i for i, f in enumerate(is_prime) if f]


def _primes_upto(n: int) -> list[int]:
    """The primes <= n, from a sieve cached per power of two: the references also run on other specs'
    inputs (digits up to a million) while rivals are compared, where trial division would be slow."""
    if n < 2:
        return []
    primes = _sieve(1 << (n + 1).bit_length())
    return primes[:bisect.bisect_right(primes, n)]
