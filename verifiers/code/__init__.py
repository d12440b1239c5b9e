"""Code verifier: runs model-written programs in :mod:`sandbox` and judges them outside the jail."""
from .verifier import CodeVerifier, FunctionReference, StdioReference, parse_reference

__all__ = ["CodeVerifier", "FunctionReference", "StdioReference", "parse_reference"]
