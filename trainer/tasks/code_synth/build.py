"""From specs to problems: the catalogue of every spec, the example shown in a prompt, the hidden cases
that tell a spec from its rivals, and the two problem forms (a function with asserts, a stdin/stdout program
with tests)."""
from __future__ import annotations

import random
from functools import lru_cache
from typing import Any, Callable

from . import level1, level2, level3
from .blocks import Spec

N_HIDDEN = 8    # asserts per function problem, edge cases included (the issue asks for 6-10)
N_STDIO = 5     # stdin/stdout tests per program problem (4-6)
MIN_SHOWN = 5   # printed forms shorter than this ([], 0, 'a', [3]) can occur in any prompt by chance


# -- problems ----------------------------------------------------------------------------------------------
@lru_cache(maxsize=1)
def catalogue() -> tuple[Spec, ...]:
    """Every spec, levels 1-3; names are unique (they are the problems' identities)."""
    specs = tuple(level1.specs() + level2.specs() + level3.specs())
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise AssertionError(f"duplicate problem names: {sorted(n for n in set(names) if names.count(n) > 1)}")
    return specs


def _expected(spec: Spec, args: tuple) -> Any:
    # Copies, so a reference never changes the arguments we print (items are ints and strings: shallow is enough).
    return spec.ref(*(list(a) if isinstance(a, list) else a for a in args))


def _shown(printed: str, prompt: str) -> bool:
    return len(printed) >= MIN_SHOWN and printed in prompt


def _pick_example(spec: Spec, rng: random.Random) -> tuple:
    """A short input whose output shows the behaviour (list and string arguments have two or more items;
    the output is not empty, zero or False, nor equal to an argument): the shortest of a few such draws,
    which keeps prompts short and leaves room for the hidden cases."""
    found: list[tuple] = []
    for _ in range(100):
        args = spec.draw(rng)
        out = _expected(spec, args)
        if (out not in (None, [], "", 0, False) and all(out != a for a in args)
                and all(len(a) >= 2 for a in args if isinstance(a, (list, str)))):
            found.append(args)
            if len(found) == 4:
                break
    return min(found or [spec.draw(rng)], key=lambda a: len(repr(a)) + len(repr(_expected(spec, a))))


N_PROBES = 32  # shared inputs per signature, to find specs that random tests would not tell apart


def _outputs(spec: Spec, probes: list[tuple]) -> tuple[str, ...]:
    out = []
    for args in probes:
        try:
            out.append(repr(_expected(spec, args)))
        except Exception:  # outside this spec's domain (an empty list for largest_element)
            out.append("!")
    return tuple(out)


@lru_cache(maxsize=1)
def _rivals() -> dict[str, tuple[Spec, ...]]:
    """For each spec, the specs its hidden tests must tell it from explicitly: its neighbours in its family
    with the same signature (add_2 and add_4 for add_3: the off-by-one programs) and any spec with the
    same signature that differs from it on at most half of a shared set of probe inputs
    (count_letter_i and count_words_containing_i differ only on words with two i's). Random tests separate
    the rest."""
    groups: dict[tuple, list[Spec]] = {}
    for s in catalogue():
        groups.setdefault((s.params, s.ret), []).append(s)
    out: dict[str, list[Spec]] = {}
    for sig, group in groups.items():
        rng = random.Random(f"code_synth/probes/{sig}")
        draws = (rng.choice(group).draw(rng) for _ in range(20 * N_PROBES))
        # Small numbers only: another spec's domain (digit sums up to 100000) is costly for primes_below_n.
        probes = [a for a in draws if all(not isinstance(x, int) or x <= 200 for x in a)][:N_PROBES]
        prints = {s.name: _outputs(s, probes) for s in group}
        close = {(a, b) for a in prints for b in prints
                 if a != b and sum(x != y for x, y in zip(prints[a], prints[b])) * 2 <= len(probes)}
        for s in group:
            family = [t for t in group if t.family == s.family]
            i = family.index(s)
            near = family[max(i - 1, 0):i] + family[i + 1:i + 2]
            out[s.name] = near + [t for t in group if (s.name, t.name) in close and t not in near]
    return {k: tuple(v) for k, v in out.items()}


def _differs(rival: Spec, args: tuple, out: Any) -> bool:
    try:
        return repr(_expected(rival, args)) != repr(out)
    except Exception:  # outside the rival's domain (kth_largest_3 of two elements): it cannot pass this case
        return True


def _hidden_cases(spec: Spec, rng: random.Random, n: int, example: tuple, prompt: str,
                  show: Callable[[tuple, Any], list[str]]) -> list[tuple[tuple, Any]]:
    """``n`` distinct cases: the spec's edge cases, cases that tell it from its rivals (``_rivals``), then
    random ones. None is the example or shows in the prompt (``show`` gives a case's printed forms), and
    together they separate behaviours: no output is expected in more than half of them (a constant answer
    such as [] or False fails), and some output differs from the first argument (returning it fails)."""
    cases: list[tuple[tuple, Any]] = []
    seen = {repr(example)}

    def fits(args: tuple, out: Any) -> bool:
        return (repr(args) not in seen and not any(_shown(p, prompt) for p in show(args, out))
                and sum(repr(o) == repr(out) for _, o in cases) < (n + 1) // 2)

    def take(args: tuple, out: Any) -> None:
        seen.add(repr(args))
        cases.append((args, out))

    for args in spec.edges:
        if fits(args, out := _expected(spec, args)):
            take(args, out)
    left = [r for r in _rivals()[spec.name] if not any(_differs(r, a, o) for a, o in cases)]
    for _ in range(10):  # each round adds the draw that tells it from the most rivals still left
        if not left:
            break
        draws = [(a, _expected(spec, a)) for a in (spec.draw(rng) for _ in range(20))]
        scored = [(sum(_differs(r, a, o) for r in left), a, o) for a, o in draws if fits(a, o)]
        best = max(scored, key=lambda x: x[0], default=(0, None, None))
        if best[0]:
            take(best[1], best[2])
            left = [r for r in left if not _differs(r, best[1], best[2])]
    # A rival no draw tells apart computes the same function on this spec's inputs (balanced_parentheses
    # and balanced_all_brackets on strings of parentheses): it is a correct answer here, not a rival.
    if len(cases) > n:
        raise AssertionError(f"{spec.name}: needs {len(cases)} cases to tell it from its rivals")
    for _ in range(2000):
        if len(cases) == n:
            return cases
        args = spec.draw(rng)
        if not fits(args, out := _expected(spec, args)):
            continue
        if len(cases) == n - 1:
            outs = [o for _, o in cases] + [out]
            if len({repr(o) for o in outs}) < 2 or all(o == a[0] for (a, _), o in zip(cases + [(args, out)], outs)):
                continue
        take(args, out)
    raise AssertionError(f"{spec.name}: could not draw {n} separating cases")  # a generator too narrow


def _call(spec: Spec, args: tuple) -> str:
    return f"{spec.name}({', '.join(map(repr, args))})"


def _function_cases(spec: Spec, seed: int) -> tuple[tuple, str, list[tuple[tuple, Any]]]:
    """(the example, the prompt, the hidden cases) of a function problem."""
    rng = random.Random(f"code_synth/{seed}/fn/{spec.name}")
    example = _pick_example(spec, rng)
    prompt = (f"Write a Python function `{spec.signature}` that {spec.does}. "
              f"For example, `{_call(spec, example)}` returns `{_expected(spec, example)!r}`.")

    def printed(args: tuple, out: Any) -> list[str]:
        return [repr(a) for a in args] + ([] if isinstance(out, bool) else [repr(out)])
    return example, prompt, _hidden_cases(spec, rng, N_HIDDEN, example, prompt, printed)


def _function_problem(spec: Spec, seed: int) -> dict:
    example, prompt, cases = _function_cases(spec, seed)
    test = "def check(candidate):\n" + "".join(
        f"    assert candidate({', '.join(map(repr, args))}) == {out!r}\n" for args, out in cases)
    return {"id": f"synth-fn/{spec.name}", "prompt": prompt, "solution": spec.solution,
            "reference": {"entry_point": spec.name, "test": test, "difficulty": spec.level, "family": spec.family}}


N_PUBLIC = 3  # public tests of a repair problem: the prompt's example and two more


def public_test(name: str, seed: int = 0) -> str:
    """The public tests of function problem ``name`` (code repair: their failures are shown to the model):
    the prompt's example and two more cases drawn apart from the hidden ones, as a check whose assertion
    messages say the call, what it returned and what was expected. Hidden tests stay hidden: no public case
    is one of them."""
    spec = next(s for s in catalogue() if s.name == name)
    example, _, hidden_cases = _function_cases(spec, seed)
    hidden = {repr(a) for a, _ in hidden_cases}
    cases, seen = [(example, _expected(spec, example))], hidden | {repr(example)}
    draw = random.Random(f"code_synth/{seed}/public/{spec.name}")
    for _ in range(200):
        if len(cases) == N_PUBLIC:
            break
        args = spec.draw(draw)
        if repr(args) not in seen:
            seen.add(repr(args))
            cases.append((args, _expected(spec, args)))
    lines = []
    for args, out in cases:
        call = _call(spec, args)
        lines.append(f"    got = candidate({', '.join(map(repr, args))})\n"
                     f"    assert got == {out!r}, {call!r} + ' returned ' + repr(got) + ', expected ' "
                     f"+ {repr(out)!r}\n")
    return "def check(candidate):\n" + "".join(lines)


def function_problems(seed: int = 0) -> list[dict]:
    """One function problem per spec (1,000+), in an order shuffled by ``seed`` so that any prefix mixes
    families and levels; ``seed`` also draws every example and hidden test."""
    problems = [_function_problem(s, seed) for s in catalogue()]
    random.Random(f"code_synth/{seed}/order/fn").shuffle(problems)
    return problems


# -- stdin/stdout programs: the same behaviours, read from stdin and printed -------------------------------
STDIO_IN = {"list[int]": ("the list {p} (one line of integers separated by spaces)", "list(map(int, input().split()))",
                          lambda v: " ".join(map(str, v))),
            "list[str]": ("the word list {p} (one line of words separated by spaces)", "input().split()",
                          " ".join),
            "str": ("the string {p} (one line of text)", "input()", str),
            "int": ("the integer {p}", "int(input())", str)}
STDIO_OUT = {"list[int]", "list[str]", "int", "str", "bool", "int | None"}


def stdio_compatible(spec: Spec) -> bool:
    return all(t in STDIO_IN for _, t in spec.params) and spec.ret in STDIO_OUT


def _stdin(spec: Spec, args: tuple) -> str:
    return "".join(STDIO_IN[t][2](a) + "\n" for (_, t), a in zip(spec.params, args))


def _stdout(spec: Spec, out: Any) -> str:
    return (" ".join(map(str, out)) if spec.ret.startswith("list") else str(out)) + "\n"


def _program(spec: Spec) -> str:
    reads = "".join(f"{p} = {STDIO_IN[t][1]}\n" for p, t in spec.params)
    call = f"{spec.name}({', '.join(p for p, _ in spec.params)})"
    return spec.solution + "\n\n" + reads + (f"print(*{call})\n" if spec.ret.startswith("list") else f"print({call})\n")


def _stdio_problem(spec: Spec, seed: int) -> dict:
    rng = random.Random(f"code_synth/{seed}/io/{spec.name}")
    example = _pick_example(spec, rng)
    inputs = [STDIO_IN[t][0].format(p=p) for p, t in spec.params]
    reads = (f"reads {inputs[0]} from standard input" if len(inputs) == 1 else
             f"reads {len(inputs)} lines from standard input, first {', then '.join(inputs)},")
    fmt = " Print the elements on one line, separated by spaces." if spec.ret.startswith("list") else ""
    prompt = (f"Write a Python program that {reads} and prints {spec.does.removeprefix('returns ')}.{fmt}\n\n"
              f"Example input:\n```\n{_stdin(spec, example)}```\n"
              f"Example output:\n```\n{_stdout(spec, _expected(spec, example))}```")

    def printed(args: tuple, out: Any) -> list[str]:
        return [_stdin(spec, args).strip()] + ([] if isinstance(out, bool) else [_stdout(spec, out).strip()])
    cases = _hidden_cases(spec, rng, N_STDIO, example, prompt, printed)
    tests = [{"stdin": _stdin(spec, args), "stdout": _stdout(spec, out)} for args, out in cases]
    return {"id": f"synth-io/{spec.name}", "prompt": prompt, "solution": _program(spec),
            "reference": {"tests": tests, "difficulty": spec.level, "family": spec.family}}


def stdio_problems(seed: int = 0) -> list[dict]:
    """A stdin/stdout program problem for every spec whose arguments and result print as lines (plain
    lists, strings, numbers, booleans; not dicts or nested lists), shuffled by ``seed``."""
    problems = [_stdio_problem(s, seed) for s in catalogue() if stdio_compatible(s)]
    random.Random(f"code_synth/{seed}/order/io").shuffle(problems)
    return problems
