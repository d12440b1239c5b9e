"""/v1/files: JSONL datasets, validated on upload (OpenAI's file object shape).

Shared by the native API and OpenAI's clients; its errors are OpenAI's shape for both (400 naming the
parameter, every bad line in the message; 404 "No such File object"; service/openai_errors.py)."""
from __future__ import annotations

from pathlib import Path

from fastapi import HTTPException, Request, UploadFile, status
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse

from ..auth import Scope
from ..deps import ScopeDep, SettingsDep, StoreDep
from ..files import FileNotFound, get_file, store_upload
from ..guard import api_router
from ..openai_errors import OpenAIRoute
from ..schemas import FileOut, render_rows

router = api_router(prefix="/v1/files", tags=["files"], route_class=OpenAIRoute)
PURPOSES = {"fine-tune", "train", "eval", "dataset", "preference"}


@router.post("", status_code=status.HTTP_201_CREATED, response_model=FileOut)
async def upload_file(request: Request, file: UploadFile, store: StoreDep, settings: SettingsDep,
                      scope: ScopeDep) -> FileOut:
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
    # the same reader the job will use checks it (trainer.data.load_jsonl), off the event loop
    f, errors = await run_in_threadpool(store_upload, store, settings.home_dir / "files", scope.tenant, filename,
                                        purpose, data)
    if errors:
        raise RequestValidationError([{"loc": ("body", "file"), "type": "value_error", "msg": e} for e in errors])
    return FileOut.of(f)


@router.get("")
def list_files(store: StoreDep, scope: ScopeDep) -> dict:
    from sqlalchemy import select

    from ..db import File

    with store.Session() as s:
        q = select(File).order_by(File.created_at.desc()).limit(1000)
        if scope.only is not None:
            q = q.where(File.tenant == scope.only)
        rows = list(s.scalars(q))
    data, unreadable = render_rows(rows, lambda f: FileOut.of(f).model_dump())
    return {"object": "list", "data": data, **({"unreadable": unreadable} if unreadable else {})}


def _get(store, file_id: str, scope: Scope):
    f = get_file(store, file_id, scope.only)  # FileNotFound: OpenAI's 404 (service/openai_errors.py)
    if not Path(f.path).is_file():  # a record whose bytes are gone is as missing as no record
        raise FileNotFound(file_id)
    return f


@router.get("/{file_id}", response_model=FileOut)
def retrieve_file(file_id: str, store: StoreDep, scope: ScopeDep) -> FileOut:
    return FileOut.of(_get(store, file_id, scope))


@router.get("/{file_id}/content", response_class=FileResponse)
def file_content(file_id: str, store: StoreDep, scope: ScopeDep) -> FileResponse:
    f = _get(store, file_id, scope)
    return FileResponse(f.path, media_type="application/jsonl", filename=f.filename)


@router.delete("/{file_id}")
def delete_file(file_id: str, store: StoreDep, scope: ScopeDep) -> dict:
    from ..db import File

    f = _get(store, file_id, scope)
    with store.Session.begin() as s:
        row = s.get(File, f.id)
        if row is not None:
            s.delete(row)
    Path(f.path).unlink(missing_ok=True)
    return {"id": f.id, "object": "file", "deleted": True}
