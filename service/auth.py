"""API keys (bearer) mapped to tenants. Keys are stored only as SHA-256 hashes."""
from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

from sqlalchemy import select

from .db import ApiKey
from .store import Store

KEY_PREFIX = "rlvr_"


@dataclass(frozen=True)
class Principal:
    tenant: str
    admin: bool = False


def _hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def create_key(store: Store, tenant: str, admin: bool = False) -> str:
    """Create a key for ``tenant`` and return it (the only time it is ever visible)."""
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    with store.Session.begin() as s:
        s.add(ApiKey(tenant=tenant, key_hash=_hash(key), admin=admin))
    return key


def authenticate(store: Store, key: str, admin_key: str | None = None) -> Principal | None:
    if admin_key and hmac.compare_digest(key.encode(), admin_key.encode()):
        return Principal(tenant="admin", admin=True)
    with store.Session() as s:
        row = s.scalar(select(ApiKey).where(ApiKey.key_hash == _hash(key), ApiKey.revoked.is_(False)))
    return Principal(row.tenant, row.admin) if row else None
