"""/v1/keys: admin-only API key creation."""
from __future__ import annotations

from fastapi import APIRouter, status
from pydantic import BaseModel, Field

from ..auth import create_key
from ..deps import AdminDep, StoreDep

router = APIRouter(prefix="/v1/keys", tags=["keys"])


class KeyIn(BaseModel):
    tenant: str = Field(..., min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.\-]+$")
    admin: bool = False


class KeyOut(BaseModel):
    tenant: str
    admin: bool
    key: str = Field(..., description="Shown once; only its hash is stored.")


@router.post("", status_code=status.HTTP_201_CREATED, response_model=KeyOut)
def new_key(body: KeyIn, store: StoreDep, _admin: AdminDep) -> KeyOut:
    return KeyOut(tenant=body.tenant, admin=body.admin, key=create_key(store, body.tenant, body.admin))
