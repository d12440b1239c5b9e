"""HTTP-registered verifiers: versioned sources in the database, and the hooks that pin and resolve them.

A name's versions are immutable rows ``(name, version)``; registering the name again adds the next
version. Names are global (one owner each); a version is visible to its owner's tenant, to admin
scopes, and — only if registered with ``public: true`` — to every tenant, who may use it and read its
interface but never its source, config, golden cases or owner. To anyone else a private verifier
does not exist: every lookup here takes the caller's :class:`~service.access.keys.Scope` and answers a
private name exactly as a missing one. A job names a stored verifier in its spec (``{"name": "my_grader"}``);
at submission
:func:`pin_job_spec` records the latest version in the spec (unless the job gave one), and in the
worker :func:`resolve_job_spec` puts that version's source into the spec's config, where
``verifiers.get_verifier(name, config, version=...)`` runs it in the sandbox. The API and worker
processes only ever store and pass the source as text.
"""
from __future__ import annotations

import hashlib
from typing import Any

from sqlalchemy import func, or_, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import sessionmaker

from trainer.config import JobSpec

from ..access.keys import Scope
from ..store.tables import Base, StoredVerifier, utcnow

MAX_VERSION = 2**31 - 1


class VerifierNotFound(KeyError):
    def __str__(self) -> str:
        return str(self.args[0])


class VerifierStore:
    """Versioned verifier sources on an existing engine (the job store's)."""

    def __init__(self, engine):
        # Own table, created here if missing, so this works whether or not a migration has added it.
        Base.metadata.create_all(engine, tables=[StoredVerifier.__table__], checkfirst=True)
        self.engine = engine
        self.Session = sessionmaker(engine, expire_on_commit=False)

    def create(self, name: str, source: str, *, description: str = "", config: dict[str, Any] | None = None,
               golden: list[Any] | None = None, tenant: str = "default", public: bool = False) -> StoredVerifier:
        """Store ``source`` as the next version of ``name``."""
        for _attempt in range(5):  # two registrations racing for the same version: the loser retries
            try:
                with self.Session.begin() as s:
                    latest = s.scalar(select(func.max(StoredVerifier.version)).where(StoredVerifier.name == name))
                    row = StoredVerifier(name=name, version=(latest or 0) + 1, source=source,
                                         sha256=hashlib.sha256(source.encode()).hexdigest(),
                                         description=description, config=config or {}, golden=golden or [],
                                         tenant=tenant, public=public, created_at=utcnow())
                    s.add(row)
                return row
            except IntegrityError:
                continue
        raise RuntimeError(f"could not allocate a version for {name!r} (concurrent registrations)")

    @staticmethod
    def _visible(q, scope: Scope):
        if scope.all_tenants:
            return q
        return q.where(or_(StoredVerifier.tenant == scope.tenant, StoredVerifier.public.is_(True)))

    def get(self, name: str, version: int | None, scope: Scope) -> StoredVerifier:
        """The version (default: the latest) ``scope`` may use; a private one of another tenant is
        reported exactly like a missing one."""
        if version is not None and not 1 <= version <= MAX_VERSION:  # the database's INTEGER could not hold it
            raise VerifierNotFound(f"version must be between 1 and {MAX_VERSION}")
        with self.Session() as s:
            q = self._visible(select(StoredVerifier).where(StoredVerifier.name == name), scope)
            q = q.where(StoredVerifier.version == version) if version is not None else q
            row = s.scalars(q.order_by(StoredVerifier.version.desc()).limit(1)).first()
        if row is None:
            which = f"{name!r} v{version}" if version is not None else repr(name)
            raise VerifierNotFound(f"no HTTP-registered verifier {which}")
        return row

    def pinned(self, name: str, version: int) -> StoredVerifier:
        """A version a job was pinned to at submission (visibility was checked then)."""
        with self.Session() as s:
            row = s.scalars(select(StoredVerifier).where(StoredVerifier.name == name,
                                                         StoredVerifier.version == version)).first()
        if row is None:
            raise VerifierNotFound(f"no HTTP-registered verifier {name!r} v{version}")
        return row

    def owner(self, name: str) -> str | None:
        """The tenant that owns ``name`` (its first version's), or None if nobody registered it."""
        with self.Session() as s:
            return s.scalar(select(StoredVerifier.tenant).where(StoredVerifier.name == name)
                            .order_by(StoredVerifier.version).limit(1))

    def versions(self, name: str, scope: Scope) -> list[int]:
        with self.Session() as s:
            q = self._visible(select(StoredVerifier.version).where(StoredVerifier.name == name), scope)
            return list(s.scalars(q.order_by(StoredVerifier.version)))

    def latest_all(self, scope: Scope) -> list[StoredVerifier]:
        """The newest version of each name that ``scope`` may see."""
        with self.Session() as s:
            newest = (self._visible(select(StoredVerifier.name, func.max(StoredVerifier.version).label("v")), scope)
                      .group_by(StoredVerifier.name).subquery())
            q = select(StoredVerifier).join(newest, (StoredVerifier.name == newest.c.name)
                                            & (StoredVerifier.version == newest.c.v))
            return list(s.scalars(q.order_by(StoredVerifier.name)))


# ------------------------------------------------------------------------------------ job hooks
def _store(engine_or_store) -> VerifierStore:
    return engine_or_store if isinstance(engine_or_store, VerifierStore) else VerifierStore(engine_or_store)


def resolved_config(vs: VerifierStore, name: str, config: dict[str, Any], version: int) -> dict[str, Any]:
    """The config a pinned stored verifier runs with: its stored defaults, the job's overrides, its source."""
    row = vs.pinned(name, version)
    return {**row.config, **{k: v for k, v in config.items() if k != "source"}, "source": row.source}


def _walk(specs: list[dict[str, Any]], visit) -> list[dict[str, Any]]:
    """Apply ``visit(spec_dict, path)`` to each spec and to each ``multi`` sub-verifier, depth first."""
    out = []
    for i, spec in enumerate(specs):
        spec = dict(visit(dict(spec), (i,)))
        config = spec.get("config")
        subs = config.get("verifiers") if spec.get("name") == "multi" and isinstance(config, dict) else None
        # raw user config: recurse only into well-formed sub-specs (the multi's own Config reports the rest)
        if isinstance(subs, dict) and all(isinstance(x, dict) for x in subs.values()):
            labels = list(subs)
            done = _walk([subs[k] for k in labels], lambda d, p: visit(d, (i, "config", "verifiers", labels[p[0]])))
            spec["config"] = {**spec["config"], "verifiers": dict(zip(labels, done))}
        out.append(spec)
    return out


def config_error(name: str, config: dict[str, Any], stored: bool) -> str | None:
    """Why ``config`` is not valid for verifier ``name`` (validated against its ``Config``), or None."""
    from pydantic import ValidationError

    from verifiers.registry import verifier_class
    from verifiers.remote import PythonConfig

    try:
        # a stored verifier's source is filled in later; only the job's overrides are checked here
        model = PythonConfig if stored else getattr(verifier_class(name), "Config", None)
        if hasattr(model, "model_validate"):
            model.model_validate({**config, "source": "-"} if stored else config)
    except ValidationError as e:
        return "; ".join(f"{'.'.join(map(str, x['loc'])) or 'config'}: {x['msg']}" for x in e.errors())[:2000]
    except Exception as e:  # a plugin that fails to import: say so at submission, not mid-job
        return f"verifier {name!r} could not be loaded: {type(e).__name__}: {e}"[:2000]
    return None


def _pinner(vs: VerifierStore, errors: list[dict[str, Any]], loc: tuple, scope: Scope):
    from verifiers import available, is_registered

    def visit(d: dict[str, Any], path: tuple) -> dict[str, Any]:
        name, version = d.get("name", ""), d.get("version")
        if (not isinstance(name, str) or not (version is None or type(version) is int)
                or not isinstance(d.get("config") or {}, dict)):
            return d  # a malformed multi sub-spec: its parent's config check has already said why
        if version is not None or not is_registered(name):
            try:
                d["version"] = vs.get(name, version, scope).version
            except VerifierNotFound as e:
                msg = (f"unknown verifier {name!r}; known: {', '.join(available())} and the HTTP-registered "
                       "ones (GET /v1/verifiers)") if version is None else str(e)
                errors.append({"loc": (*loc, *path, "version" if version else "name"), "type": "value_error",
                               "msg": msg})
                return d
        why = config_error(name, d.get("config") or {}, stored=d.get("version") is not None)
        if why:
            errors.append({"loc": (*loc, *path, "config"), "type": "value_error", "msg": why})
        return d

    return visit


def _resolver(vs: VerifierStore):
    def visit(d: dict[str, Any], path: tuple) -> dict[str, Any]:
        if d.get("version") is not None:
            d["config"] = resolved_config(vs, d["name"], d.get("config") or {}, d["version"])
        return d

    return visit


def pin_job_spec(spec: JobSpec, engine, scope: Scope) -> tuple[JobSpec, list[dict[str, Any]]]:
    """At submission: give every stored verifier in the spec a version (latest unless pinned) that
    ``scope`` may use.

    Returns the pinned spec and FastAPI-style errors (``loc`` into ``body.verifiers``) for names that
    are neither registered nor stored (nor visible to the scope), versions that do not exist, and
    configs their verifier refuses (multi formulas included). Call it in check_spec / create_job
    and store the returned spec, so the job keeps its version whatever is registered later.
    """
    errors: list[dict[str, Any]] = []
    raw = spec.model_dump(mode="json")
    raw["verifiers"] = _walk(raw["verifiers"], _pinner(_store(engine), errors, ("body", "verifiers"), scope))
    return (JobSpec.model_validate(raw) if not errors else spec), errors


def resolve_job_spec(spec: JobSpec, engine) -> JobSpec:
    """In the worker, before ``train``: put each pinned stored verifier's source into its config.

    Raises :class:`VerifierNotFound` if a pinned version is missing (a job must not silently change
    verifier). Specs without ``version`` are left alone (built-ins and plugins).
    """
    raw = spec.model_dump(mode="json")
    raw["verifiers"] = _walk(raw["verifiers"], _resolver(_store(engine)))
    return JobSpec.model_validate(raw)


def pin_and_resolve(spec: dict[str, Any], engine, scope: Scope,
                    loc: tuple = ("body",)) -> tuple[dict[str, Any], list[dict]]:
    """One verifier spec dict (``name``, ``config``, ``version``): pinned to a version ``scope`` may
    use, then resolved (for dry runs)."""
    vs, errors = _store(engine), []
    pinned = _walk([spec], lambda d, p: _pinner(vs, errors, loc, scope)(d, p[1:]))[0]
    if errors:
        return spec, errors
    return _walk([pinned], _resolver(vs))[0], []
