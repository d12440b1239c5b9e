"""/v1/keys: admin-only API key creation."""
from __future__ import annotations

from fastapi import status
from pydantic import BaseModel, Field, field_validator

from ..auth import TENANT_PATTERN, check_tenant_name, create_key
from ..deps import AdminDep, StoreDep
from ..guard import api_router

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


class KeyOut(BaseModel):
    tenant: str
    admin: bool
    key: str = Field(..., description="Shown once; only its hash is stored.")


@router.post("", status_code=status.HTTP_201_CREATED, response_model=KeyOut)
def new_key(body: KeyIn, store: StoreDep, _admin: AdminDep) -> KeyOut:
    return KeyOut(tenant=body.tenant, admin=body.admin, key=create_key(store, body.tenant, body.admin))
