"""Procedural Python function-synthesis problems (issue 15): small list / string / number tasks at three
levels of difficulty, each with hidden unit tests, as function problems and as stdin/stdout programs.

Level 1 is one operation a small instruct model can sometimes write in one line (double every element,
reverse a string, sum a list); level 2 composes two (filter then map, map then aggregate, splits and joins,
rotations, digit arithmetic, simple conditionals); level 3 composes two or three with conditions and state
(compound filters, running windows, runs, frequencies, fizzbuzz-like rules, ciphers, number bases). A family
is a template with parameters ("add k to every element" for k in 1..30), so the count comes from real
variety: each problem has its own function name, behaviour, prompt and tests.

Trust: expected outputs come from OUR reference callables (``Spec.ref``, run here on the host) over inputs
drawn from ``random.Random`` seeded per problem; model code only ever runs in the sandbox, through the
``code`` verifier. ``solution`` is the same function written separately as source (for tests and few-shot
examples; the tests check it against the hidden tests through the real verifier). Hidden tests live in
``reference`` only: the prompt shows one example and never a hidden input or a hidden non-trivial output.
Standard library only, deterministic in the seed (string seeds to ``random.Random`` hash with SHA-512, not
with Python's per-process hash).

Layout: ``blocks`` holds ``Spec`` and the generators and pieces every family shares; ``level1``, ``level2``
and ``level3`` hold the families of each level; ``build`` turns specs into problems (catalogue, prompt
example, hidden cases that tell rivals apart, the function and stdin/stdout forms). Imports run one way:
levels -> blocks, build -> levels and blocks, this file -> build.
"""
from __future__ import annotations

from .blocks import Spec
from .build import N_HIDDEN, N_STDIO, catalogue, function_problems, public_test, stdio_compatible, stdio_problems

__all__ = ["N_HIDDEN", "N_STDIO", "Spec", "catalogue", "function_problems", "public_test", "stdio_compatible",
           "stdio_problems"]
