"""/v1/files: JSONL datasets, validated on upload (OpenAI's file object shape)."""
from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, HTTPException, Request, UploadFile, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, Response

from ..deps import PrincipalDep, SettingsDep, StoreDep
from ..files import FileNotFound, get_file, save_file, validate_jsonl
from ..schemas import FileOut

router = APIRouter(prefix="/v1/files", tags=["files"])
PURPOSES = {"fine-tune", "train", "eval", "dataset", "preference"}


@router.post("", status_code=status.HTTP_201_CREATED, response_model=FileOut)
async def upload_file(request: Request, file: UploadFile, store: StoreDep, settings: SettingsDep,
                      principal: PrincipalDep) -> FileOut:
    form = await request.form()
    purpose = str(form.get("purpose") or "fine-tune")
    if purpose not in PURPOSES:
        raise RequestValidationError([{"loc": ("body", "purpose"), "type": "value_error",
                                       "msg": f"purpose must be one of {sorted(PURPOSES)}"}])
    filename = Path(file.filename or "upload.jsonl").name[:255]
    if not filename.isprintable():
        raise RequestValidationError([{"loc": ("body", "file"), "type": "value_error",
                                       "msg": "file name has control characters"}])
    data = await file.read(settings.max_upload_bytes + 1)
    if len(data) > settings.max_upload_bytes:
        raise HTTPException(status.HTTP_413_CONTENT_TOO_LARGE,
                            f"file over {settings.max_upload_bytes} bytes")
    n, errors = validate_jsonl(data, purpose=purpose)
    if errors:
        raise RequestValidationError([{"loc": ("body", "file"), "type": "value_error", "msg": e} for e in errors])
    f = save_file(store, settings.home_dir / "files", principal.tenant, filename, purpose, data, n)
    return FileOut.of(f)


@router.get("")
def list_files(store: StoreDep, principal: PrincipalDep) -> dict:
    from sqlalchemy import select

    from ..db import File

    with store.Session() as s:
        q = select(File).order_by(File.created_at.desc()).limit(1000)
        if principal.tenant != "admin":
            q = q.where(File.tenant == principal.tenant)
        rows = list(s.scalars(q))
    return {"object": "list", "data": [FileOut.of(f).model_dump() for f in rows]}


def _get(store, file_id, principal):
    try:
        return get_file(store, file_id, None if principal.tenant == "admin" else principal.tenant)
    except FileNotFound:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"file {file_id!r} not found") from None


@router.get("/{file_id}", response_model=FileOut)
def retrieve_file(file_id: str, store: StoreDep, principal: PrincipalDep) -> FileOut:
    return FileOut.of(_get(store, file_id, principal))


@router.get("/{file_id}/content", response_class=FileResponse)
def file_content(file_id: str, store: StoreDep, principal: PrincipalDep) -> FileResponse:
    f = _get(store, file_id, principal)
    return FileResponse(f.path, media_type="application/jsonl", filename=f.filename)


@router.delete("/{file_id}")
def delete_file(file_id: str, store: StoreDep, principal: PrincipalDep) -> dict:
    from ..db import File

    f = _get(store, file_id, principal)
    with store.Session.begin() as s:
        row = s.get(File, f.id)
        if row is not None:
            s.delete(row)
    Path(f.path).unlink(missing_ok=True)
    return {"id": f.id, "object": "file", "deleted": True}
