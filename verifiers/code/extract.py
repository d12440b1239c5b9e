"""Find the program in a completion: a fenced code block if there is one, else the plain text."""
from __future__ import annotations

import ast
import re

_FENCE = re.compile(r"^[ \t]*```[ \t]*([\w+#.-]*)[^\n]*\n(.*?)(?:^[ \t]*```[ \t]*$|\Z)", re.S | re.M)
_PY_TAGS = {"python", "py", "python3", "py3"}


def extract_code(completion: str, entry_point: str | None = None) -> str:
    """The code to run.

    Among fenced blocks, python-tagged ones win over untagged ones (other languages are ignored); with an
    ``entry_point``, blocks that define it win; among the rest, the longest (models often add a short
    usage example after the solution). An unclosed fence (a truncated generation) runs to the end.
    Without any fence the whole completion is the code.
    """
    blocks = [(tag.lower(), body) for tag, body in _FENCE.findall(completion)]
    if not blocks:
        return completion.strip("\n")
    pool = [b for t, b in blocks if t in _PY_TAGS] or [b for t, b in blocks if not t]
    if not pool:
        return ""
    if entry_point:
        defining = [b for b in pool if re.search(rf"\bdef\s+{re.escape(entry_point)}\s*\(", b)]
        pool = defining or pool
    return max(pool, key=len).strip("\n")


def defines(code: str, name: str) -> bool:
    """Whether ``code`` parses and defines ``name`` at top level."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # nested too deep, NUL bytes: not a definition
        return False
    return any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name for n in tree.body)


def assemble(code: str, prompt: str, entry_point: str) -> str:
    """Join a HumanEval-style ``prompt`` and the extracted code into one program.

    A completion that defines the entry point is a whole solution: the prompt goes first (its imports and
    helpers stay available; the new definition replaces the stub). Otherwise the completion is the body
    that continues the prompt, as in HumanEval's canonical solutions.
    """
    if not prompt:
        return code
    if defines(code, entry_point):
        return prompt.rstrip("\n") + "\n\n\n" + code + "\n"
    return prompt + code + "\n"
