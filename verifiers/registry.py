"""Name → verifier registry: a dict, plus lazy entry-point discovery (group ``rlvr.verifiers``).

Built-ins are listed as import strings so that ``import verifiers`` stays cheap (no sympy, no
sandbox) and a verifier's heavy imports happen only when a job asks for it. Installed packages
add verifiers with ``[project.entry-points."rlvr.verifiers"] name = "pkg.module:Class"``; a name
that is already taken is refused, whoever registers it.
"""
from __future__ import annotations

import importlib
import threading
from importlib.metadata import entry_points
from typing import Any, Callable, Union

from .base import Verifier

ENTRY_POINT_GROUP = "rlvr.verifiers"

# name -> "module:attr" (not yet imported) or the loaded class/factory
_BUILTINS: dict[str, str] = {
    "math": "verifiers.math:MathVerifier",
    "code": "verifiers.code:CodeVerifier",
}

Factory = Callable[..., Verifier]
_registry: dict[str, Union[str, Factory]] = dict(_BUILTINS)
_origins: dict[str, str] = {name: "builtin" for name in _BUILTINS}
_discovered = False
_lock = threading.Lock()


class DuplicateVerifierError(ValueError):
    pass


class UnknownVerifierError(KeyError):
    def __str__(self) -> str:  # KeyError quotes its message; we want a plain sentence
        return str(self.args[0])


def register(name: str, factory: Union[str, Factory], *, origin: str = "code") -> None:
    """Register ``factory`` (a class, a callable returning a verifier, or "module:attr") as ``name``."""
    with _lock:
        if name in _registry:
            raise DuplicateVerifierError(
                f"verifier {name!r} is already registered (by {_origins.get(name, '?')}); "
                f"pick another name. Known: {', '.join(sorted(_registry))}"
            )
        _registry[name] = factory
        _origins[name] = origin


def _discover() -> None:
    global _discovered
    if _discovered:
        return
    with _lock:
        if _discovered:
            return
        _discovered = True
        eps = entry_points(group=ENTRY_POINT_GROUP)
    for ep in eps:
        register(ep.name, ep.value, origin=f"entry point {ep.value} ({ep.dist.name if ep.dist else '?'})")


def _resolve(name: str) -> Factory:
    _discover()
    try:
        target = _registry[name]
    except KeyError:
        raise UnknownVerifierError(
            f"unknown verifier {name!r}; known: {', '.join(sorted(_registry))}"
        ) from None
    if isinstance(target, str):
        module, _, attr = target.partition(":")
        target = getattr(importlib.import_module(module), attr)
        _registry[name] = target
    return target


def get_verifier(name: str, config: dict[str, Any] | None = None) -> Verifier:
    """Build the verifier registered as ``name`` with its own config dict."""
    return _resolve(name)(config or {})


def verifier_class(name: str) -> Factory:
    return _resolve(name)


def available() -> list[str]:
    _discover()
    return sorted(_registry)


def is_registered(name: str) -> bool:
    _discover()
    return name in _registry
