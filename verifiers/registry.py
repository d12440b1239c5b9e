"""Name → verifier registry: a dict, plus lazy entry-point discovery (group ``rlvr.verifiers``).

Built-ins are listed as import strings so that ``import verifiers`` stays cheap (no sympy, no
sandbox) and a verifier's heavy imports happen only when a job asks for it. Installed packages
add verifiers with ``[project.entry-points."rlvr.verifiers"] name = "pkg.module:Class"``; a name
that is already taken is refused, whoever registers it (:func:`register` raises; discovery logs the
refused entry point, keeps the first owner and lists it in :func:`refused`). HTTP-registered verifiers
are not in this dict: a spec pinning ``version`` is built as the sandboxed ``python`` verifier.
"""
from __future__ import annotations

import importlib
import logging
import threading
from importlib.metadata import entry_points
from typing import Any, Callable, Union

from .base import Verifier

ENTRY_POINT_GROUP = "rlvr.verifiers"

# name -> "module:attr" (not yet imported) or the loaded class/factory
_BUILTINS: dict[str, str] = {
    "math": "verifiers.math:MathVerifier",
    "code": "verifiers.code:CodeVerifier",
    "format": "verifiers.text:FormatVerifier",
    "string_check": "verifiers.text:StringCheckVerifier",
    "exact": "verifiers.text:StringCheckVerifier",  # alias: the same class under a second name
    "multiple_choice": "verifiers.text:MultipleChoiceVerifier",
    "length_penalty": "verifiers.text:LengthPenaltyVerifier",
    "multi": "verifiers.multi:MultiVerifier",
    "python": "verifiers.remote:SandboxedVerifier",
    "text_similarity": "verifiers.similarity:TextSimilarityVerifier",
    "countdown": "verifiers.countdown:CountdownVerifier",
    "reasoning_gym": "verifiers.reasoning_gym:ReasoningGymVerifier",
}
# A spec that pins ``version`` names an HTTP-registered verifier: its source (filled in by the service,
# see service/jobs/stored_verifiers.py) runs in this sandboxed verifier, never in the calling process.
STORED = "python"
log = logging.getLogger("rlvr.verifiers")

Factory = Callable[..., Verifier]
_registry: dict[str, Union[str, Factory]] = dict(_BUILTINS)
_origins: dict[str, str] = {name: "builtin" for name in _BUILTINS}
_discovered = False
_lock = threading.Lock()
_refused: list[dict[str, str]] = []  # entry points refused at discovery (duplicate names, bad targets)


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
        origin = f"entry point {ep.value} ({ep.dist.name if ep.dist else '?'})"
        try:
            register(ep.name, ep.value, origin=origin)
        except DuplicateVerifierError as e:
            # One plugin claiming a taken name must neither replace the first owner nor hide every
            # other plugin: refuse it, say so, and carry on.
            log.warning("refused %s: %s", origin, e)
            _refused.append({"name": ep.name, "origin": origin, "reason": str(e)})


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


def get_verifier(name: str, config: dict[str, Any] | None = None, version: int | None = None) -> Verifier:
    """Build the verifier registered as ``name`` with its own config dict.

    With ``version``, ``name`` is an HTTP-registered verifier pinned to that version, whose stored source
    the service has put in ``config["source"]``; it is built as the sandboxed ``python`` verifier.
    """
    if version is not None:
        config = dict(config or {})
        if not config.get("source"):
            raise UnknownVerifierError(
                f"verifier {name!r} v{version} is HTTP-registered and its source was not resolved; "
                "the service fills it in (service.jobs.stored_verifiers.resolve_job_spec) before scoring")
        return _resolve(STORED)({**config, "stored_name": name, "stored_version": version})
    return _resolve(name)(config or {})


def verifier_class(name: str) -> Factory:
    return _resolve(name)


def available() -> list[str]:
    _discover()
    return sorted(_registry)


def is_registered(name: str) -> bool:
    _discover()
    return name in _registry


def refused() -> list[dict[str, str]]:
    """Entry points refused at discovery, with the reason (for listings and logs)."""
    _discover()
    return list(_refused)


def describe(name: str) -> dict[str, Any]:
    """``{name, version, description, config_schema, origin}`` for ``name`` (imports it)."""
    factory = _resolve(name)
    config = getattr(factory, "Config", None)
    schema = config.model_json_schema() if hasattr(config, "model_json_schema") else {}
    return {"name": name, "version": str(getattr(factory, "version", "")),
            "description": str(getattr(factory, "description", "") or (factory.__doc__ or "").strip()),
            "config_schema": schema, "origin": _origins.get(name, "?")}
