"""The ``math`` verifier (see verifier.py). Importing this package does not import sympy."""
from .verifier import MathConfig, MathVerifier

__all__ = ["MathConfig", "MathVerifier"]
