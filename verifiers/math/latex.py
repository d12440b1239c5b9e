"""LaTeX answer text -> small tuple AST, in pure Python (no sympy, no backtracking).

Why our own parser: sympy's ``parse_latex`` needs one exact antlr4 runtime (4.11) that clashes with
other packages, and an ANTLR parse costs milliseconds; answers are short, so a hand-written Pratt
parser that runs in linear time with a depth cap is both faster and safe to run in the caller's
process. The AST is nested tuples so that it is hashable (cache keys) and cheap to pickle to the
sympy worker:

    ("num", "0.75")  ("sym", "x")  ("const", "pi"|"inf")  ("neg", a)  ("add"|"sub"|"mul"|"div"|"pow", a, b)
    ("func", name, arg)  ("log", base|None, arg)  ("root", n, x)  ("binom", n, k)  ("pm", a, b)
    ("rel", (ops...), (exprs...))  ("seq", kind, items)  with kind "list" | "or" | "set"
    ("tuple", items, open, close)  ("union", items)  ("matrix", rows)  ("text", s)  ("reals",)
    ("ratio", items) for a:b(:c)   ("sum"|"prod", var, lo, hi, body) for \\sum_{k=lo}^{hi} body
    ("amb", decimal, list) for a lone "1,5" (made in normalize.py, not here)

``;`` separates groups when the groups themselves are comma lists (``p=5,q=2;p=7,q=2`` is two
solutions); otherwise it is a comma.
"""
from __future__ import annotations

import re

MAX_DEPTH = 60  # deeper nesting is not a real answer; refusing it keeps recursion bounded
# and the tree the loops build (1+1+...+1 is a chain as deep as it is long): every walk over an AST
# in this package and in sympy recurses, so a tree deeper than this is refused as not an answer
MAX_TREE_DEPTH = 200


class ParseError(ValueError):
    pass


_TOKEN = re.compile(
    r"(?P<num>\d+\.\d+|\d+\.(?!\d)|\.\d+|\d+)"
    r"|(?P<cmd>\\[a-zA-Z]+|\\[{}|])"
    r"|(?P<letter>[a-zA-Z])"
    r"|(?P<op><=|>=|!=|[-+*/^_=<>!(),;:\[\]{}|&])"
    r"|(?P<ws>\s+)"
)

_FUNCS = {
    "sin", "cos", "tan", "sec", "csc", "cot", "arcsin", "arccos", "arctan", "sinh", "cosh", "tanh",
    "exp", "ln", "log", "sqrt", "floor", "ceil",
}
_GREEK = {
    "alpha", "beta", "gamma", "delta", "epsilon", "varepsilon", "zeta", "eta", "theta", "vartheta",
    "iota", "kappa", "lambda", "mu", "nu", "xi", "rho", "sigma", "tau", "phi", "varphi", "chi",
    "psi", "omega", "Gamma", "Delta", "Theta", "Lambda", "Sigma", "Phi", "Psi", "Omega",
}
_REL = {"=": "=", "<": "<", ">": ">", "<=": "<=", ">=": ">=", "!=": "!=",
        r"\le": "<=", r"\leq": "<=", r"\leqslant": "<=", r"\ge": ">=", r"\geq": ">=",
        r"\geqslant": ">=", r"\lt": "<", r"\gt": ">", r"\ne": "!=", r"\neq": "!=",
        r"\approx": "~", r"\in": "in"}
_MUL = {"*": "mul", r"\cdot": "mul", r"\times": "mul", "/": "div", r"\div": "div"}
# operators and relations we do not model: an answer using them is not read as a product of symbols
_OPERATORS = {
    "cap", "setminus", "to", "rightarrow", "Rightarrow", "leftarrow", "Leftarrow", "leftrightarrow",
    "Leftrightarrow", "implies", "iff", "mid", "wedge", "land", "vee", "subset", "subseteq", "supset",
    "supseteq", "perp", "parallel", "equiv", "sim", "simeq", "cong", "propto", "mapsto", "circ", "oplus",
    "otimes", "ni", "notin", "forall", "exists", "neg", "lnot", "pmod", "bmod", "mod", "over", "choose",
    "int", "iint", "oint", "lim", "partial", "nabla", "prime", "dots", "ldots", "cdots", "vdots", "ddots",
    "quad", "qquad", "hline", "newline", "label", "tag", "nonumber", "not", "of",
}
_MATRIX_ENVS = {"pmatrix", "bmatrix", "matrix", "Bmatrix", "vmatrix", "smallmatrix", "array"}


def tokenize(s: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    while pos < len(s):
        m = _TOKEN.match(s, pos)
        if not m:
            raise ParseError(f"unexpected character {s[pos]!r}")
        pos = m.end()
        if m.lastgroup != "ws":
            out.append((m.lastgroup, m.group()))
    return out


class _Parser:
    def __init__(self, tokens: list[tuple[str, str]]):
        self.toks = tokens
        self.i = 0
        self.depth = 0

    # -- token helpers ---------------------------------------------------------------------------
    def peek(self, k: int = 0) -> str | None:
        j = self.i + k
        return self.toks[j][1] if j < len(self.toks) else None

    def kind(self) -> str | None:
        return self.toks[self.i][0] if self.i < len(self.toks) else None

    def take(self, expected: str | None = None) -> str:
        tok = self.peek()
        if tok is None or (expected is not None and tok != expected):
            raise ParseError(f"expected {expected or 'more input'}, got {tok!r}")
        self.i += 1
        return tok

    def enter(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise ParseError("nesting too deep")

    # -- grammar ---------------------------------------------------------------------------------
    def parse(self):
        node = self.seq(stop=())
        if self.peek() is not None:
            raise ParseError(f"unexpected {self.peek()!r}")
        return node

    def seq(self, stop):
        """Comma/semicolon/"or" separated items; one item is returned bare."""
        groups, kind = [[self.rel()]], "list"
        while self.peek() in (",", ";", r"\lor"):
            sep = self.take()
            if sep == r"\lor":
                kind = "or"
            if self.peek() is None or self.peek() in stop:
                break  # trailing separator
            if sep == ";":
                groups.append([])
            groups[-1].append(self.rel())
        if len(groups) > 1 and any(len(g) > 1 for g in groups):  # p=5,q=2; p=7,q=2
            items = [g[0] if len(g) == 1 else ("seq", "list", tuple(g)) for g in groups]
        else:
            items = [x for g in groups for x in g]
        return items[0] if len(items) == 1 else ("seq", kind, tuple(items))

    def rel(self):
        exprs, ops = [self.ratio()], []
        while self.peek() in _REL:
            ops.append(_REL[self.take()])
            exprs.append(self.ratio())
        return exprs[0] if not ops else ("rel", tuple(ops), tuple(exprs))

    def ratio(self):
        """a:b (and a:b:c), binding looser than arithmetic and tighter than relations."""
        items = [self.expr(0)]
        while self.peek() == ":":
            self.take()
            items.append(self.expr(0))
        return items[0] if len(items) == 1 else ("ratio", tuple(items))

    def expr(self, min_prec: int):
        self.enter()
        tok = self.peek()
        if tok in ("-", "+", r"\pm", r"\mp"):
            self.take()
            operand = self.expr(25)  # binds looser than ^ so that -x^2 = -(x^2)
            left = {"-": ("neg", operand), "+": operand}.get(tok, ("pm", ("num", "0"), operand))
        else:
            left = self.postfix(self.primary())
        while True:
            tok = self.peek()
            if tok == r"\cup" and min_prec <= 5:
                self.take()
                right = self.expr(6)
                items = left[1] if left[0] == "union" else (left,)
                left = ("union", items + (right,))
            elif tok in ("+", "-", r"\pm", r"\mp") and min_prec <= 10:
                self.take()
                right = self.expr(11)
                left = {"+": ("add", left, right), "-": ("sub", left, right)}.get(tok, ("pm", left, right))
            elif tok in _MUL and min_prec <= 20:
                self.take()
                left = (_MUL[tok], left, self.expr(21))
            elif self.starts_primary() and min_prec <= 20:
                if self.kind() == "num" and self.toks[self.i - 1][0] == "num":
                    raise ParseError("two numbers side by side")  # "12 5" is not 60
                is_frac = tok == r"\frac"
                right = self.postfix(self.primary())
                if is_frac and right[0] == "div" and _is_int(right[1]) and _is_int(right[2]) and (
                        _is_int(left) or left[0] == "neg" and _is_int(left[1])):
                    # mixed number 2\frac{1}{2} = 5/2 (MATH convention); -2\frac{1}{2} = -5/2
                    left = ("add", left, right) if _is_int(left) else ("neg", ("add", left[1], right))
                else:
                    left = ("mul", left, right)
            else:
                break
        self.depth -= 1
        return left

    def starts_primary(self) -> bool:
        k, tok = self.kind(), self.peek()
        if k in ("num", "letter"):
            return True
        if k == "cmd":
            return tok not in _REL and tok not in _MUL and tok not in (
                r"\pm", r"\mp", r"\cup", r"\lor", r"\}", r"\rangle", r"\end", r"\rfloor", r"\rceil", r"\|")
        return tok in ("(", "{", "[")

    def postfix(self, node):
        while True:
            tok = self.peek()
            if tok == "^":
                self.take()
                node = ("pow", node, self.script())
            elif tok == "!":
                self.take()
                node = ("func", "factorial", node)
            else:
                return node

    def script(self):
        """Argument of ^ or _: a braced group, or one token (a run of digits counts as one)."""
        if self.peek() == "{":
            return self.group()
        if self.peek() == "-":
            self.take()
            return ("neg", self.script())
        return self.primary()

    def group(self):
        self.enter()
        self.take("{")
        node = self.seq(stop=("}",))
        self.take("}")
        self.depth -= 1
        return node

    def arg(self, split_digits: bool = True):
        """Argument of \\frac, \\sqrt...: braced group or a single token. ``\\frac12`` is 1/2 as in
        TeX, but ``\\sqrt 10`` is read as sqrt(10): that is what people mean when they write it."""
        if self.peek() == "{":
            return self.group()
        tok = self.peek()
        if split_digits and self.kind() == "num" and tok.isdigit() and len(tok) > 1:
            self.toks[self.i] = ("num", tok[1:])
            return ("num", tok[0])
        return self.primary()

    def primary(self):
        self.enter()
        node = self._primary()
        self.depth -= 1
        return node

    def _primary(self):
        k, tok = self.kind(), self.peek()
        if tok is None:
            raise ParseError("unexpected end of answer")
        if k == "num":
            self.take()
            return ("num", tok.rstrip(".") or "0")
        if k == "letter":
            self.take()
            name = tok
            if self.peek() == "_":  # x_1, a_{n}: one symbol
                self.take()
                sub = self.peek()
                if sub == "{":
                    self.take()
                    parts = []
                    while self.peek() not in ("}", None):
                        parts.append(self.take())
                    self.take("}")
                    sub = "".join(parts)
                else:
                    self.take()
                name = f"{tok}_{sub}"
            return ("sym", name)
        if tok == "{":
            return self.group()
        if tok in ("(", "["):
            return self.bracket()
        if tok == "|":
            self.take()
            inner = self.expr(0)
            self.take("|")
            return ("func", "abs", inner)
        if k != "cmd":
            raise ParseError(f"unexpected {tok!r}")
        self.take()
        name = tok[1:]
        if name == "frac":
            return ("div", self.arg(), self.arg())
        if name == "binom":
            return ("binom", self.arg(), self.arg())
        if name == "sqrt":
            if self.peek() == "[":
                self.take()
                n = self.expr(0)
                self.take("]")
                return ("root", n, self.arg(split_digits=False))
            return ("func", "sqrt", self.arg(split_digits=False))
        if name in ("pi",):
            return ("const", "pi")
        if name in ("infty", "inf"):
            return ("const", "inf")
        if name in ("emptyset", "varnothing"):
            return ("seq", "set", ())
        if name == "mathbb":
            if self.arg() == ("sym", "R"):
                return ("reals",)
            raise ParseError("unsupported \\mathbb")
        if name in _GREEK:
            return ("sym", name)
        if name == "{":
            if self.peek() == r"\}":
                self.take()
                return ("seq", "set", ())
            inner = self.seq(stop=(r"\}",))
            self.take(r"\}")
            return ("seq", "set", inner[2] if inner[0] == "seq" else (inner,))
        if name in ("lvert", "vert", "|"):
            inner = self.expr(0)
            self.take({"lvert": r"\rvert"}.get(name, tok))
            return ("func", "abs", inner)
        if name in ("lfloor", "lceil"):
            inner = self.expr(0)
            self.take(r"\rfloor" if name == "lfloor" else r"\rceil")
            return ("func", name[1:], inner)
        if name == "langle":
            inner = self.seq(stop=(r"\rangle",))
            self.take(r"\rangle")
            return ("tuple", inner[2] if inner[0] == "seq" else (inner,), "(", ")")
        if name == "begin":
            return self.matrix()
        if name in ("sum", "prod"):
            return self.big_operator(name)
        if name in _FUNCS:
            return self.function(name)
        if name in _OPERATORS or name in ("end", "right", "rangle", "rfloor", "rceil", "rvert"):
            raise ParseError(f"unsupported command {tok}")
        return ("sym", tok)  # \\ell, \\hbar, \\zzz: a name we do not know is a symbol

    def function(self, name: str):
        base = power = None
        if name == "log" and self.peek() == "_":
            self.take()
            base = self.script()
        if self.peek() == "^":  # \sin^2 x
            self.take()
            power = self.script()
        if self.peek() == "(":
            arg = self.bracket()
        else:  # \sin 2x: the argument runs over an implicit product
            arg = self.postfix(self.primary())
            while self.kind() in ("num", "letter"):
                arg = ("mul", arg, self.postfix(self.primary()))
        node = ("log", base, arg) if name == "log" else ("func", name, arg)
        return ("pow", node, power) if power is not None else node

    def big_operator(self, name: str):
        """\\sum_{k=0}^{n} body: the body runs over a product (\\sum_k a_k b_k), not over a + or -."""
        self.take("_")
        lower = self.script()
        if lower[0] != "rel" or lower[1] != ("=",) or lower[2][0][0] != "sym":
            raise ParseError(f"\\{name} needs a lower limit k=...")
        self.take("^")
        upper = self.script()
        body = self.expr(20)
        return (name, lower[2][0][1], lower[2][1], upper, body)

    def env_name(self) -> str:
        """{pmatrix}: letters arrive as single tokens; join them."""
        self.take("{")
        parts = []
        while self.peek() != "}":
            parts.append(self.take())
        self.take("}")
        return "".join(parts)

    def bracket(self):
        """(..), [..], (..], [..): grouping, tuple or interval depending on content."""
        self.enter()
        opener = self.take()
        inner = self.seq(stop=(")", "]"))
        closer = self.take()
        if closer not in (")", "]"):
            raise ParseError(f"expected a closing bracket, got {closer!r}")
        self.depth -= 1
        if inner[0] == "seq" and inner[1] == "list":
            return ("tuple", inner[2], opener, closer)
        if opener == "(" and closer == ")" or opener == "[" and closer == "]":
            return inner
        raise ParseError("mismatched brackets around one item")

    def matrix(self):
        env = self.env_name()
        if env not in _MATRIX_ENVS:
            raise ParseError(f"unsupported environment {env}")
        if env == "array" and self.peek() == "{":  # column spec {cc}
            self.env_name()
        rows, row = [], []
        while True:
            row.append(self.expr(0))
            tok = self.take()
            if tok == "&":
                continue
            rows.append(tuple(row))
            row = []
            if tok == r"\end":
                self.env_name()
                break
            if tok != r"\\":
                raise ParseError(f"unexpected {tok!r} in matrix")
            if self.peek() == r"\end":  # trailing \\ before \end
                self.take()
                self.env_name()
                break
        if len({len(r) for r in rows}) != 1:
            raise ParseError("ragged matrix")
        return ("matrix", tuple(rows))


def _is_int(node) -> bool:
    return node[0] == "num" and node[1].isdigit()


def parse_latex(s: str):
    """Parse a normalised answer string (see normalize.py) into the tuple AST."""
    # \\ (matrix row break) is tokenised as two "\" which the regex does not know: pre-mark it.
    tokens = tokenize(s.replace("\\\\", " \\rowbreak "))
    tokens = [("op", "\\\\") if t == ("cmd", r"\rowbreak") else t for t in tokens]
    if not tokens:
        raise ParseError("empty answer")
    tree = _Parser(tokens).parse()
    if _depth(tree) > MAX_TREE_DEPTH:
        raise ParseError("expression nested too deep")
    return tree


def _depth(tree) -> int:
    """Depth of the AST, without recursion (a chain 1+1+...+1 is as deep as it is long)."""
    deepest, stack = 0, [(tree, 1)]
    while stack:
        node, d = stack.pop()
        deepest = max(deepest, d)
        stack.extend((c, d + 1) for c in node if isinstance(c, tuple))
    return deepest
