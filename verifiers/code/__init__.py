"""Code verifier: runs model-written programs in :mod:`sandbox` and judges them apart from them (tests in the
jail too, never in this process)."""
from .verifier import CodeVerifier, FunctionReference, StdioReference, parse_reference

__all__ = ["CodeVerifier", "FunctionReference", "StdioReference", "parse_reference"]
