"""Typed plain values across the jail boundary: the only thing a candidate can hand back to the judge.

``encode`` turns a value into JSON that keeps its exact type (list vs tuple, int vs float vs bool, NaN,
sets, dict keys); anything that is not exactly one of these builtin types (including subclasses, so an
``int`` whose ``__eq__`` says yes to everything) becomes an opaque marker. ``decode`` rebuilds plain
values and turns an opaque marker into :class:`Opaque`, which refuses to be compared, hashed or tested:
a check that touches it fails. Standard library only: this file's source also runs inside the jail.
"""
import base64
import math

MAX_DEPTH = 64


class OpaqueValueUsed(BaseException):
    """A BaseException, so a check's own ``except Exception`` cannot swallow it."""


class Opaque:
    """Stands in for a returned object of a non-plain type. Any use of it raises (and is remembered in
    ``Opaque.refused``, so a check that catches the error still fails)."""

    __slots__ = ("type_name",)
    refused = False

    def __init__(self, type_name):
        object.__setattr__(self, "type_name", type_name)

    def _refuse(self, *a, **k):
        Opaque.refused = True
        raise OpaqueValueUsed(f"the candidate returned a non-plain {self.type_name} object")

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __bool__ = __hash__ = __len__ = _refuse
    __iter__ = __contains__ = __getitem__ = __add__ = __radd__ = __sub__ = __rsub__ = _refuse
    __mul__ = __rmul__ = __truediv__ = __float__ = __int__ = __index__ = __abs__ = __neg__ = _refuse
    __str__ = __format__ = __getattr__ = __call__ = __round__ = __mod__ = __rtruediv__ = _refuse

    def __repr__(self):
        return f"<opaque {self.type_name}>"


def encode(v, depth=0):
    t = type(v)
    if v is None or t is bool or t is str:
        return v
    if t is int:
        return v if -(1 << 53) < v < (1 << 53) else {"i": hex(v)}  # big ints as hex: no digit limit
    if t is float:
        return {"f": repr(v)} if not math.isfinite(v) else v
    if depth > MAX_DEPTH:
        return {"o": "nested too deep"}
    if t is list:
        return [encode(x, depth + 1) for x in v]
    if t is tuple:
        return {"t": [encode(x, depth + 1) for x in v]}
    if t is dict:
        return {"d": [[encode(k, depth + 1), encode(x, depth + 1)] for k, x in v.items()]}
    if t is set or t is frozenset:
        return {"s" if t is set else "fs": [encode(x, depth + 1) for x in v]}
    if t is bytes:
        return {"b": base64.b64encode(v).decode()}
    if t is complex:
        return {"c": [encode(v.real), encode(v.imag)]}
    return {"o": f"{t.__module__}.{t.__qualname__}"[:200]}


def decode(j, depth=0):
    if depth > MAX_DEPTH + 2:
        raise ValueError("value nested too deep")
    t = type(j)
    if j is None or t is bool or t is str or t is int or t is float:
        return j
    if t is list:
        return [decode(x, depth + 1) for x in j]
    if t is dict and len(j) == 1:
        (tag, x), = j.items()
        if tag == "i" and type(x) is str:
            return int(x, 16)
        if tag == "f" and x in ("nan", "inf", "-inf"):
            return float(x)
        if tag == "t" and type(x) is list:
            return tuple(decode(y, depth + 1) for y in x)
        if tag == "d" and type(x) is list:
            return {decode(k, depth + 1): decode(y, depth + 1) for k, y in x}
        if tag == "s" and type(x) is list:
            return {decode(y, depth + 1) for y in x}
        if tag == "fs" and type(x) is list:
            return frozenset(decode(y, depth + 1) for y in x)
        if tag == "b" and type(x) is str:
            return base64.b64decode(x, validate=True)
        if tag == "c" and type(x) is list and len(x) == 2:
            return complex(decode(x[0]), decode(x[1]))
        if tag == "o" and type(x) is str:
            return Opaque(x)
    raise ValueError(f"not an encoded value: {str(j)[:100]}")
