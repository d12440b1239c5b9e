"""The ``math`` verifier. Importing this package does not import sympy.

    verifier.py   MathVerifier and its config: the pipeline, verify / verify_batch
    extract.py    final answer out of a completion (boxes, "answer is", "####", last statement)
    normalize.py  answer text -> normalised LaTeX (units, %, thousands, Unicode) -> AST
    latex.py      small linear-time LaTeX parser producing a tuple AST (no sympy, no antlr)
    structure.py  answer shapes: sets, tuples, intervals, inequalities, equations, +-, ratios,
                  matrix arithmetic
    exact.py      exact (fraction) equality without sympy; decimal tolerance rules shared with sympy
    symbolic.py   AST -> sympy and sympy equality (only ever imported in a worker process)
    worker.py     killable sympy worker processes: the hard time budget
    forkserver.py the process the workers are forked from (sympy imported once; fast replacement)
"""
from .verifier import MathConfig, MathVerifier

__all__ = ["MathConfig", "MathVerifier"]
