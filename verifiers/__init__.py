"""Verifiers: turn (completion, reference) into a :class:`Verdict`. Never imports service/trainer."""
from .base import BaseVerifier, Status, Verdict, Verifier, VerifierConfig
from .registry import available, get_verifier, is_registered, register

__all__ = [
    "BaseVerifier", "Status", "Verdict", "Verifier", "VerifierConfig",
    "available", "get_verifier", "is_registered", "register",
]
