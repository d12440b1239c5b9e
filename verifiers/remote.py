"""The ``python`` verifier: user-written ``verify(completion, reference, **fields)`` run ONLY in the sandbox.

HTTP-registered verifiers (``POST /v1/verifiers``) and inline ``{"name": "python", "config": {"source":
...}}`` specs both land here. This process never parses, compiles, imports or execs the source: each
(completion, reference) pair is one sandbox run of :data:`HARNESS` (a fixed program of ours) that reads
the source and the pair as JSON on stdin, execs the source in the jail, calls ``verify`` and prints one
JSON line. One run per pair means a verifier that hangs on one completion times out on that one only.

``verify`` returns a number (the score), ``None`` (nothing to judge: unparseable), or a dict
``{"score": float, "status"?: "correct"|"wrong"|"unparseable", "reason"?: str, "sub_scores"?: {str: float},
"details"?: {...}}``. Without a status, a score at or above ``correct_threshold`` is ``correct``.

Error taxonomy (``Verdict.details["error_kind"]``): ``runtime_error`` (the source or ``verify`` raised,
exited, crashed, or ran out of memory/output), ``timeout`` (wall or CPU budget), ``invalid_return``
(not a number/None/dict of the shape above, NaN, or not JSON), ``unparseable`` (the verifier said so),
``sandbox_error`` (our infrastructure, not the verifier). The jail's stdout is judged here as untrusted
bytes: whatever the source prints cannot make a malformed answer count.
"""
from __future__ import annotations

import json
import math
from typing import Any, Literal, Sequence

from pydantic import Field

from .base import BaseVerifier, Status, Verdict, VerifierConfig

MAX_SOURCE_CHARS = 200_000

# Runs inside the jail (its Python, stdlib only). Prints go to stderr so that stdout carries
# only our answer line; the host still treats that line as untrusted.
HARNESS = r'''
import json, os, sys, traceback
req = json.loads(sys.stdin.buffer.read())
_out = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
sys.stdout = sys.stderr
def _answer(d):
    _out.write("\n" + json.dumps(d, allow_nan=False) + "\n")
    _out.flush()
    os._exit(0)
def _failure(kind, e):
    tb = traceback.format_exception(type(e), e, e.__traceback__)
    _answer({"kind": kind, "type": type(e).__name__, "message": str(e)[:1000],
             "trace": "".join(l for l in tb if "<verifier>" in l or not l.startswith("  File"))[-2000:]})
ns = {"__name__": "rlvr_verifier", "__builtins__": __builtins__}
try:
    exec(compile(req["source"], "<verifier>", "exec"), ns)
except BaseException as e:
    _failure("load_error", e)
fn = ns.get("verify")
if not callable(fn):
    _answer({"kind": "load_error", "type": "NameError",
             "message": "the source defines no function verify(completion, reference, **fields)"})
if req.get("check_only"):
    _answer({"kind": "loaded"})
try:
    value = fn(req["completion"], req["reference"], **req["fields"])
except BaseException as e:
    _failure("exception", e)
try:
    _answer({"kind": "return", "value": value})
except (TypeError, ValueError, RecursionError) as e:
    _answer({"kind": "unserializable", "type": type(value).__name__, "message": str(e)[:300]})
'''

ERROR_KINDS = ("runtime_error", "timeout", "invalid_return", "unparseable", "sandbox_error")
_USER_STATUSES = {"correct": Status.correct, "wrong": Status.wrong, "unparseable": Status.unparseable}
_DICT_KEYS = {"score", "status", "reason", "sub_scores", "details"}


class PythonConfig(VerifierConfig):
    source: str = Field(..., min_length=1, max_length=MAX_SOURCE_CHARS,
                        description="Python defining verify(completion, reference, **fields) -> float | dict | None.")
    fields: dict[str, Any] = Field(default_factory=dict, description="Extra keyword arguments for verify.")
    timeout_s: float = Field(5.0, gt=0, le=60, description="Wall-clock budget per completion.")
    memory_mb: int = Field(256, ge=32, le=4096)
    correct_threshold: float = Field(1.0, allow_inf_nan=False,
                                     description="Score at or above this is `correct` (no status given).")
    backend: Literal["local", "docker"] = "local"
    # Set by the service for HTTP-registered verifiers (which name and version this source is).
    stored_name: str | None = None
    stored_version: int | None = Field(None, ge=1, le=2**31 - 1)


def _error(kind: str, reason: str, **details: Any) -> Verdict:
    status = {"timeout": Status.timeout, "unparseable": Status.unparseable}.get(kind, Status.error)
    return Verdict(0.0, status, reason[:1000], {"error_kind": kind, **details})


def _number(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def judge_value(value: Any, threshold: float) -> Verdict:
    """Turn what ``verify`` returned (already JSON-decoded, untrusted) into a Verdict."""
    if value is None:
        return _error("unparseable", "verify returned None (nothing to judge)")
    if isinstance(value, bool):
        value = float(value)
    score = _number(value)
    if score is not None:
        return Verdict(score, Status.correct if score >= threshold - 1e-9 else Status.wrong, f"score {score:.4g}")
    if not isinstance(value, dict):
        return _error("invalid_return", f"verify returned {type(value).__name__}; expected a number, None or a dict")
    extra = set(value) - _DICT_KEYS
    if extra:
        return _error("invalid_return", f"unexpected keys {sorted(extra)[:5]}; allowed: {sorted(_DICT_KEYS)}")
    score = _number(value.get("score"))
    if score is None:
        return _error("invalid_return", "dict['score'] must be a finite number")
    status_name = value.get("status")
    if status_name is not None and status_name not in _USER_STATUSES:
        return _error("invalid_return", f"dict['status'] must be one of {sorted(_USER_STATUSES)}")
    subs = value.get("sub_scores", {})
    if not isinstance(subs, dict) or any(not isinstance(k, str) or _number(v) is None for k, v in subs.items()):
        return _error("invalid_return", "dict['sub_scores'] must map names to finite numbers")
    details = value.get("details", {})
    if not isinstance(details, dict):
        return _error("invalid_return", "dict['details'] must be a dict")
    reason = value.get("reason", "")
    if status_name is None:
        status = Status.correct if score >= threshold - 1e-9 else Status.wrong
    else:
        status = _USER_STATUSES[status_name]
    out = {**details, "sub_scores": {k: float(v) for k, v in subs.items()}} if subs else dict(details)
    if status is Status.unparseable:
        out["error_kind"] = "unparseable"
    return Verdict(score, status, str(reason)[:1000] or f"score {score:.4g}", out)


def _answer_line(stdout: bytes) -> Any:
    for line in reversed(stdout.decode("utf-8", "replace").splitlines()):
        if line.strip():
            try:
                ans = json.loads(line)
            except (ValueError, RecursionError):
                return None
            return ans if isinstance(ans, dict) else None
    return None


def judge_run(result: Any, threshold: float) -> Verdict:
    """Map one sandbox ``Result`` of :data:`HARNESS` onto a Verdict (with ``elapsed_s`` from the host)."""
    from sandbox import Status as Run

    t = {"elapsed_s": result.wall_s}
    tail = result.stderr[-1500:].decode("utf-8", "replace")
    if result.status is Run.sandbox_error:
        return _error("sandbox_error", f"sandbox error: {result.reason}", **t)
    if result.status is Run.timeout:
        return _error("timeout", f"verifier ran out of time: {result.reason}", **t)
    if result.status is not Run.ok:
        return _error("runtime_error", f"verifier {result.status.value}: {result.reason}", stderr_tail=tail, **t)
    ans = _answer_line(result.stdout)
    if ans is None:
        return _error("runtime_error", "verifier exited without an answer", stderr_tail=tail, **t)
    kind = ans.get("kind")
    if kind in ("exception", "load_error"):
        where = "verify raised" if kind == "exception" else "loading the source failed"
        return _error("runtime_error", f"{where}: {ans.get('type')}: {ans.get('message')}",
                      trace=str(ans.get("trace", ""))[:2000], **t)
    if kind == "unserializable":
        return _error("invalid_return",
                      f"verify returned {ans.get('type')}, which is not JSON: {ans.get('message')}", **t)
    if kind == "loaded":
        return Verdict(0.0, Status.correct, "source loads and defines verify", t)
    if kind != "return":
        return _error("runtime_error", "verifier printed an answer of unknown shape", **t)
    v = judge_value(ans.get("value"), threshold)
    return Verdict(v.score, v.status, v.reason, {**v.details, **t})


class SandboxedVerifier(BaseVerifier):
    name = "python"
    version = "1"
    description = ("Your own Python `verify(completion, reference, **fields)` (source in the config, or an "
                   "HTTP-registered verifier), run only inside the sandbox with a time budget per completion.")
    batches = True  # verify_batch is its own (the scorer reads per-call times from verdicts)
    Config = PythonConfig
    config: PythonConfig

    def _limits(self):
        from sandbox import Limits

        c = self.config
        return Limits(wall_s=c.timeout_s, memory_mb=c.memory_mb, max_output_bytes=256 * 1024)

    def _stdin(self, completion: str, reference: Any, fields: dict[str, Any], check_only: bool = False) -> bytes:
        return json.dumps({"source": self.config.source, "completion": completion, "reference": reference,
                           "fields": fields, "check_only": check_only}, default=str).encode()

    def run_items(self, items: Sequence[tuple[str, Any, dict[str, Any]]]) -> list[Verdict]:
        """Score (completion, reference, extra fields) triples; fields add to the config's ``fields``."""
        import sandbox

        if not items:
            return []
        jobs = [(HARNESS, self._stdin(c, r, {**self.config.fields, **f})) for c, r, f in items]
        results = sandbox.run_many(jobs, self._limits(), self.config.backend)
        return [judge_run(r, self.config.correct_threshold) for r in results]

    def check_loads(self) -> Verdict:
        """One sandbox run that only loads the source: ``correct`` or the runtime_error/timeout it hit."""
        import sandbox

        res = sandbox.run(HARNESS, self._stdin("", None, {}, check_only=True), self._limits(), self.config.backend)
        return judge_run(res, self.config.correct_threshold)

    def verify(self, completion: str, reference: Any) -> Verdict:
        return self.run_items([(completion, reference, {})])[0]

    def sandbox_seconds(self, reference: Any) -> float:
        import sandbox

        return sandbox.run_cost(self.config.timeout_s)  # one run per completion

    def verify_batch(self, completions: Sequence[str], references: Sequence[Any]) -> list[Verdict]:
        if len(completions) != len(references):
            raise ValueError(f"{len(completions)} completions but {len(references)} references")
        return self.run_items([(c, r, {}) for c, r in zip(completions, references)])
