"""/v1/keys: create (admin), list and revoke API keys.

A key is shown once, when created; lists show its id, tenant, admin flag, creation time and last four
characters, never the key or its hash. A tenant key lists and revokes its own tenant's keys, an admin key
every tenant's (the one scope rule, ScopeDep); admin keys are an admin's business alone, whatever tenant name
they carry (an ordinary key sees none, and revoking one reads as a missing key). A revoked key is refused at
once by this API process and by
the others within their key cache's lifetime (service/access/gate.py KEY_CACHE_S).
"""
from __future__ import annotations

import datetime as dt

from fastapi import HTTPException, Query, Request, status
from pydantic import BaseModel, Field, field_validator

from ..access.keys import KEY_PREFIX, TENANT_PATTERN, check_tenant_name, list_keys, new_key, revoke_key
from ..deps import AdminDep, PrincipalDep, ScopeDep, StoreDep
from ..http.guard import api_router
from ..store.tables import ApiKey

router = api_router(prefix="/v1/keys", tags=["keys"])


class KeyIn(BaseModel):
    tenant: str = Field(..., min_length=1, max_length=128, pattern=TENANT_PATTERN,
                        description="The tenant the key acts for; reserved names (admin, default, public, …) are "
                        "refused: only the `admin` flag grants access to every tenant.")
    admin: bool = Field(False, description="An admin key sees every tenant's resources and may create keys.")

    @field_validator("tenant")
    @classmethod
    def _not_reserved(cls, v: str) -> str:
        return check_tenant_name(v)


class KeyInfo(BaseModel):
    id: str = Field(..., description="What `DELETE /v1/keys/{id}` and `rlvr keys revoke` take.")
    object: str = "api_key"
    tenant: str
    admin: bool
    created_at: dt.datetime
    redacted: str | None = Field(None, description="`rlvr_…` and the key's last 4 characters, to tell keys apart "
                                 "(None for keys made before these were kept).")
    revoked: bool = False
    revoked_at: dt.datetime | None = None
    current: bool = Field(False, description="The key this request was made with.")

    @classmethod
    def of(cls, row: ApiKey, current_id: str | None = None) -> "KeyInfo":
        return cls(id=row.id, tenant=row.tenant, admin=row.admin, created_at=row.created_at,
                   redacted=f"{KEY_PREFIX}…{row.hint}" if row.hint else None, revoked=row.revoked,
                   revoked_at=row.revoked_at, current=row.id == current_id)


class KeyOut(KeyInfo):
    key: str = Field(..., description="Shown once; only its hash is stored.")


class KeyList(BaseModel):
    object: str = "list"
    data: list[KeyInfo]


@router.post("", status_code=status.HTTP_201_CREATED, response_model=KeyOut)
def create(body: KeyIn, store: StoreDep, _admin: AdminDep) -> KeyOut:
    row, key = new_key(store, body.tenant, body.admin)
    return KeyOut(**KeyInfo.of(row).model_dump(), key=key)


@router.get("", response_model=KeyList)
def get_keys(store: StoreDep, scope: ScopeDep, principal: PrincipalDep,
             revoked: bool = Query(False, description="Include revoked keys.")) -> KeyList:
    rows = list_keys(store, scope.only, revoked, admin_keys=scope.all_tenants)
    return KeyList(data=[KeyInfo.of(k, principal.key_id) for k in rows])


@router.delete("/{key_id}", response_model=KeyInfo)
def revoke(key_id: str, request: Request, store: StoreDep, scope: ScopeDep, principal: PrincipalDep) -> KeyInfo:
    """Revoke a key: refused from the next request on (this process at once, other API processes within
    their key cache's lifetime). Another tenant's key reads as a missing one."""
    row = revoke_key(store, key_id, scope.only, admin_keys=scope.all_tenants)
    if row is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"key {key_id!r} not found")
    request.app.state.key_cache.forget(row.id)
    return KeyInfo.of(row, principal.key_id)
