"""/v1/verifiers: list every verifier, register sandboxed Python verifiers (versioned), dry-run any verifier.

Registered sources are text to this process: they are checked, golden-tested and dry-run only through
``verifiers.remote`` (one sandbox run per completion), never parsed, imported or executed here.

Tenancy: a registered verifier is its owner's; others see it only if it was registered with
``public: true``, and then only its interface (name, versions, description, config schema). Anything
that runs a verifier goes through the tenant's fair share (service/access/fairshare.py).
"""
from __future__ import annotations

import datetime as dt
import time
from typing import Annotated, Any, Literal

from fastapi import Depends, HTTPException, Query, Request, status
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, ValidationError

import sandbox
from verifiers import Status, Verdict, available, get_verifier, is_registered
from verifiers.base import sandbox_seconds
from verifiers.registry import describe, refused
from verifiers.remote import MAX_SOURCE_CHARS, SandboxedVerifier

from ..access.fairshare import check_budget
from ..access.keys import Scope
from ..deps import FairShareDep, ScopeDep
from ..http.guard import api_router
from ..jobs.schemas import RunResult, result_of
from ..jobs.stored_verifiers import VerifierNotFound, VerifierStore, pin_and_resolve
from ..store.tables import StoredVerifier

router = api_router(prefix="/v1/verifiers", tags=["verifiers"])
MAX_ITEMS = 32  # per request: each python item is one sandbox run of up to timeout_s


def get_verifier_store(request: Request) -> VerifierStore:
    vs = getattr(request.app.state, "verifier_store", None)
    if vs is None:  # one per app (tests build several apps on different databases)
        vs = request.app.state.verifier_store = VerifierStore(request.app.state.store.engine)
    return vs


VerifierStoreDep = Annotated[VerifierStore, Depends(get_verifier_store)]


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StoredConfig(_In):
    """Defaults a registered verifier runs with; a job's `config` for it may override them."""

    timeout_s: float = Field(5.0, gt=0, le=60, description="Wall-clock budget per completion.")
    memory_mb: int = Field(256, ge=32, le=4096)
    correct_threshold: float = Field(1.0, allow_inf_nan=False,
                                     description="Score at or above this is `correct` (no status given).")
    fields: dict[str, Any] = Field(default_factory=dict, description="Extra keyword arguments for verify.")


class GoldenCase(_In):
    completion: str = Field(..., max_length=100_000)
    reference: Any = None
    fields: dict[str, Any] = Field(default_factory=dict)
    expected_score: float = Field(..., allow_inf_nan=False)
    expected_status: Literal["correct", "wrong", "unparseable"] | None = None
    tolerance: float = Field(1e-6, ge=0, le=1)


class RegisterIn(_In):
    name: str = Field(..., pattern=r"^[A-Za-z][A-Za-z0-9_.\-]{0,127}$")
    source: str = Field(..., min_length=1, max_length=MAX_SOURCE_CHARS,
                        description="Python defining verify(completion, reference, **fields) -> float | dict | None.")
    description: str = Field("", max_length=2000, pattern=r"^[^\x00]*$")
    config: StoredConfig = Field(default_factory=StoredConfig)
    golden: list[GoldenCase] = Field(..., min_length=1, max_length=MAX_ITEMS,
                                     description="Examples with expected scores; all must pass to register.")
    public: bool = Field(False, description="Let every tenant use this version and see its interface (name, "
                         "description, config schema) — never its source, config, golden cases or owner. "
                         "Default: private to your tenant.")


class RunItem(_In):
    completion: str = Field(..., max_length=100_000)
    reference: Any = None
    fields: dict[str, Any] = Field(default_factory=dict, description="Only for Python verifiers.")


class RunIn(_In):
    items: list[RunItem] = Field(..., min_length=1, max_length=MAX_ITEMS)
    config: dict[str, Any] = Field(default_factory=dict)
    version: int | None = Field(None, ge=1, le=2**31 - 1, description="HTTP-registered verifiers: default the latest.")


def _stored_entry(row: StoredVerifier, versions: list[int], scope: Scope) -> dict[str, Any]:
    """What ``scope`` may know of a stored verifier: its interface, plus — for its owner (and admin
    scopes) — what it is made of."""
    out = {"name": row.name, "version": str(row.version), "versions": versions, "kind": "http",
           "public": row.public, "description": row.description, "config_schema": StoredConfig.model_json_schema(),
           "created_at": row.created_at.isoformat() if isinstance(row.created_at, dt.datetime) else None}
    if scope.sees(row.tenant):
        out |= {"origin": "POST /v1/verifiers", "sha256": row.sha256, "config": row.config, "golden": row.golden,
                "source": row.source}
        if scope.all_tenants:
            out["tenant"] = row.tenant
    return out


@router.get("")
def list_verifiers(vs: VerifierStoreDep, scope: ScopeDep) -> dict[str, Any]:
    """Every verifier this caller may use: built-ins, plugins (entry points) and HTTP-registered ones
    (its own and public ones), each with version, config JSON schema and description. Plugins refused
    at discovery are listed under `refused`."""
    data = []
    for name in available():
        try:
            d = describe(name)
        except Exception as e:  # a broken plugin must not hide the others
            d = {"name": name, "version": "", "description": "", "config_schema": {}, "origin": "?",
                 "error": f"{type(e).__name__}: {e}"[:500]}
        d["kind"] = "builtin" if d["origin"] == "builtin" else "plugin"
        data.append(d)
    for row in vs.latest_all(scope):
        entry = _stored_entry(row, vs.versions(row.name, scope), scope)
        data.append({k: v for k, v in entry.items() if k not in ("source", "golden", "config")})
    return {"data": data, "refused": refused()}


@router.get("/{name}")
def get_verifier_info(name: str, vs: VerifierStoreDep, scope: ScopeDep,
                      version: int | None = Query(None, ge=1, le=2**31 - 1)) -> dict[str, Any]:
    if is_registered(name) and version is None:
        try:
            return describe(name)
        except Exception as e:  # a plugin that fails to import: say which and why
            raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE,
                                f"verifier {name!r} could not be loaded: {type(e).__name__}: {e}"[:1000]) from None
    try:
        row = vs.get(name, version, scope)
    except VerifierNotFound as e:  # another tenant's private verifier reads exactly like a missing one
        raise HTTPException(status.HTTP_404_NOT_FOUND, str(e)) from None
    return _stored_entry(row, vs.versions(name, scope), scope)


@router.post("", status_code=status.HTTP_201_CREATED)
async def register_verifier(body: RegisterIn, vs: VerifierStoreDep, scope: ScopeDep,
                            fair: FairShareDep) -> dict[str, Any]:
    """Register (or add the next version of) a sandboxed Python verifier. 422 listing failing golden cases."""
    check_budget((len(body.golden) + 1) * sandbox.run_cost(body.config.timeout_s), fair.budget_s, ("body", "golden"),
                 "golden cases (+1 load check)")
    return await fair.run(scope.tenant, _register, body, vs, scope)


def _register(body: RegisterIn, vs: VerifierStore, scope: Scope) -> dict[str, Any]:
    if is_registered(body.name):
        raise HTTPException(status.HTTP_409_CONFLICT, f"name {body.name!r} is taken by a built-in or plugin "
                                                      "verifier; pick another `name`")
    owner = vs.owner(body.name)
    if owner is not None and not scope.sees(owner):  # names are global; say nothing about whose it is
        raise HTTPException(status.HTTP_409_CONFLICT, f"verifier name {body.name!r} is taken; pick another `name`")
    verifier = SandboxedVerifier({**body.config.model_dump(), "source": body.source})
    loaded = verifier.check_loads()
    kind = loaded.details.get("error_kind")
    if kind == "sandbox_error":
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, f"the sandbox is unavailable: {loaded.reason}")
    if kind is not None:
        raise HTTPException(422, [
            {"loc": ["body", "source"], "type": "verifier_load_failed", "msg": loaded.reason,
             "trace": str(loaded.details.get("trace", ""))}])
    verdicts = verifier.run_items([(g.completion, g.reference, g.fields) for g in body.golden])
    failures = []
    for i, (g, v) in enumerate(zip(body.golden, verdicts)):
        if v.details.get("error_kind") == "sandbox_error":
            raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, f"the sandbox is unavailable: {v.reason}")
        problems = []
        if v.status in (Status.error, Status.timeout):
            problems.append(f"{v.details.get('error_kind', v.status.value)}: {v.reason}")
        elif abs(v.score - g.expected_score) > g.tolerance:
            problems.append(f"score {v.score} != expected {g.expected_score} (tolerance {g.tolerance})")
        if g.expected_status and v.status.value != g.expected_status and not problems:
            problems.append(f"status {v.status.value} != expected {g.expected_status}")
        if problems:
            failures.append({"loc": ["body", "golden", i], "type": "golden_failed", "msg": "; ".join(problems),
                             "expected": {"score": g.expected_score, "status": g.expected_status},
                             "got": result_of(v, 0.0).model_dump(mode="json")})
    if failures:  # an HTTPException, so the reply keeps what each case got (validation errors carry only msg)
        raise HTTPException(422, failures)
    row = vs.create(body.name, body.source, description=body.description, config=body.config.model_dump(),
                    golden=[g.model_dump(mode="json") for g in body.golden], tenant=owner or scope.tenant,
                    public=body.public)
    return {"name": row.name, "version": row.version, "sha256": row.sha256, "description": row.description,
            "public": row.public, "golden_passed": len(body.golden), "created_at": row.created_at.isoformat()}


@router.post("/{name}/run")
async def dry_run(name: str, body: RunIn, vs: VerifierStoreDep, scope: ScopeDep, fair: FairShareDep) -> dict[str, Any]:
    """Score completions with any verifier this caller may use (no job): score, status, sub-scores,
    error kind, time. Runs within the tenant's fair share; items × timeout_s is bounded."""
    return await fair.run(scope.tenant, _dry_run, name, body, vs, scope, fair.budget_s)


def _dry_run(name: str, body: RunIn, vs: VerifierStore, scope: Scope, budget_s: float) -> dict[str, Any]:
    spec, errors = pin_and_resolve({"name": name, "config": body.config, "version": body.version}, vs, scope)
    if errors:
        if errors[0]["loc"] in (("body", "name"), ("body", "version")):  # a private one reads like a missing one
            raise HTTPException(status.HTTP_404_NOT_FOUND, errors[0]["msg"])
        raise RequestValidationError(errors)
    try:
        verifier = get_verifier(name, spec.get("config"), version=spec.get("version"))
    except ValidationError as e:  # each refused field by name: body.config.<field>
        raise RequestValidationError([{"loc": ("body", "config", *err["loc"]), "type": "value_error",
                                       "msg": str(err["msg"])[:2000]} for err in e.errors(include_url=False)]) from None
    except (ValueError, RecursionError) as e:
        raise RequestValidationError([{"loc": ("body", "config"), "type": "value_error",
                                       "msg": str(e)[:2000]}]) from None
    check_budget(sum(sandbox_seconds(verifier, it.reference) for it in body.items), budget_s, ("body", "items"))
    results: list[RunResult] = []
    if isinstance(verifier, SandboxedVerifier):
        t0 = time.perf_counter()
        verdicts = verifier.run_items([(it.completion, it.reference, it.fields) for it in body.items])
        each = (time.perf_counter() - t0) / len(verdicts)
        results = [result_of(v, each) for v in verdicts]
    else:
        for i, it in enumerate(body.items):
            if it.fields:
                raise RequestValidationError([{"loc": ("body", "items", i, "fields"), "type": "value_error",
                                               "msg": f"`fields` only apply to Python verifiers, not {name!r}"}])
        for it in body.items:
            t0 = time.perf_counter()
            try:
                v = verifier.verify(it.completion, it.reference)
            except Exception as e:  # a plugin's bug is a result of the dry run, not a 500
                v = Verdict(0.0, Status.error, f"{type(e).__name__}: {e}"[:1000], {"error_kind": "runtime_error"})
            results.append(result_of(v, time.perf_counter() - t0))
    version = spec.get("version") or getattr(verifier, "version", None)
    return {"name": name, "version": str(version) if version is not None else None,
            "results": [r.model_dump(mode="json") for r in results]}
