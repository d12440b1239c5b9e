"""API keys (bearer) mapped to tenants, and the one rule that decides what a request may see.

Keys are stored only as SHA-256 hashes. A key's *admin flag* — never its tenant's name — decides its
scope: an admin key sees every tenant's resources, any other key sees its own tenant's (and public
verifiers). Names that look privileged (``admin``, ``default``, ``public``…) are refused at key creation
so that no name can ever be mistaken for a role.
"""
from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass, field

from sqlalchemy import select

from ..store.jobs import Store
from ..store.tables import ApiKey

KEY_PREFIX = "rlvr_"
TENANT_PATTERN = r"^[A-Za-z0-9_.\-]{1,128}$"
# "default" owns what was created with auth off; "admin" is the bootstrap key's tenant; the rest read as roles
RESERVED_TENANTS = frozenset({"admin", "administrator", "all", "any", "default", "everyone", "global", "internal",
                              "public", "root", "rlvr", "service", "superuser", "system"})


def check_tenant_name(name: str) -> str:
    """The tenant name a new key may get; ValueError saying why not."""
    if not re.fullmatch(TENANT_PATTERN, name):
        raise ValueError("tenant: letters, digits, _ . - (1-128 characters)")
    if name.lower() in RESERVED_TENANTS:
        raise ValueError(f"tenant name {name!r} is reserved; reserved: {', '.join(sorted(RESERVED_TENANTS))}")
    return name


@dataclass(frozen=True)
class Scope:
    """What one request may see and whom what it creates belongs to.

    ``tenant`` owns whatever the request creates; ``all_tenants`` (admin keys only) lifts the tenant
    filter on reads. Every router filters through :attr:`only` / :meth:`sees`, nothing else.
    """

    tenant: str
    all_tenants: bool = False

    @property
    def only(self) -> str | None:
        """The tenant to filter reads by, or None for every tenant."""
        return None if self.all_tenants else self.tenant

    def sees(self, owner: str) -> bool:
        return self.all_tenants or owner == self.tenant


@dataclass(frozen=True)
class Principal:
    tenant: str
    admin: bool = False
    key_id: str | None = field(default=None, compare=False)  # the stored key it came from (None: bootstrap, auth off)

    @property
    def scope(self) -> Scope:
        return Scope(self.tenant, all_tenants=self.admin)


# Auth off: one trusted user who owns and sees everything. The bootstrap key: admin by flag; its
# tenant name is reserved, so no tenant key can share it.
LOCAL_USER = Principal("default", admin=True)
BOOTSTRAP_ADMIN = Principal("admin", admin=True)


def _hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def create_key(store: Store, tenant: str, admin: bool = False) -> str:
    """Create a key for ``tenant`` and return it (the only time it is ever visible)."""
    return new_key(store, tenant, admin)[1]


def new_key(store: Store, tenant: str, admin: bool = False) -> tuple[ApiKey, str]:
    """Create a key for ``tenant``: (its stored row, the key itself)."""
    check_tenant_name(tenant)
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    row = ApiKey(tenant=tenant, key_hash=_hash(key), admin=admin, hint=key[-4:])
    with store.Session.begin() as s:
        s.add(row)
    return row, key


def authenticate(store: Store, key: str, admin_key: str | None = None) -> Principal | None:
    if admin_key and hmac.compare_digest(key.encode(), admin_key.encode()):
        return BOOTSTRAP_ADMIN
    with store.Session() as s:
        row = s.scalar(select(ApiKey).where(ApiKey.key_hash == _hash(key), ApiKey.revoked.is_(False)))
    return Principal(row.tenant, row.admin, row.id) if row else None


KEY_RECHECK_S = 1.0  # how often a long-lived response (event stream, download, long poll) asks again


def still_valid(store: Store, principal: Principal) -> bool:
    """Whether the key a request came with is still good: for responses that outlive the request's own
    authentication (an event stream runs for hours). The bootstrap key and auth-off have no stored key."""
    if principal.key_id is None:
        return True
    with store.Session() as s:
        return s.scalar(select(ApiKey.id).where(ApiKey.id == principal.key_id, ApiKey.revoked.is_(False))) is not None


def list_keys(store: Store, tenant: str | None, include_revoked: bool = False, admin_keys: bool = True
              ) -> list[ApiKey]:
    """Stored keys (newest first) of ``tenant`` (None: every tenant); admin keys only with ``admin_keys``.
    The bootstrap key is not stored."""
    q = select(ApiKey).order_by(ApiKey.created_at.desc(), ApiKey.id.desc())
    if tenant is not None:
        q = q.where(ApiKey.tenant == tenant)
    if not admin_keys:
        q = q.where(ApiKey.admin.is_(False))
    if not include_revoked:
        q = q.where(ApiKey.revoked.is_(False))
    with store.Session() as s:
        return list(s.scalars(q))


def revoke_key(store: Store, key_id: str, tenant: str | None, admin_keys: bool = True) -> ApiKey | None:
    """Revoke a key of ``tenant`` (None: any), an admin key only with ``admin_keys``; None if there is no such
    key (another tenant's, or an admin key for a caller without ``admin_keys``, reads the same). Revoking a
    revoked key changes nothing and returns it."""
    with store.Session.begin() as s:
        row = s.get(ApiKey, key_id)
        if row is None or (tenant is not None and row.tenant != tenant) or (row.admin and not admin_keys):
            return None
        if not row.revoked:
            row.revoked, row.revoked_at = True, dt.datetime.now(dt.timezone.utc)
        return row
