"""/v1/files: JSONL datasets, validated on upload (OpenAI's file object shape).

Shared by the native API and OpenAI's clients; its errors are OpenAI's shape for both (400 naming the
parameter, every bad line in the message; 404 "No such File object"; service/openai_compat/errors.py)."""
from __future__ import annotations

from pathlib import Path
from typing import Literal

from fastapi import HTTPException, Query, Request, UploadFile, status
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse

from ..access.keys import Scope
from ..deps import ScopeDep, SettingsDep, StoreDep
from ..http.guard import api_router
from ..jobs.files import FileNotFound, get_file, remove_file, store_upload
from ..jobs.schemas import FileOut, render_rows
from ..openai_compat.errors import OpenAIRoute

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
def list_files(store: StoreDep, scope: ScopeDep,
               after: str | None = Query(None, max_length=128, description="The id of the last file already seen."),
               limit: int = Query(10_000, ge=1, le=10_000),
               order: Literal["asc", "desc"] = Query("desc", description="By creation time."),
               purpose: str | None = Query(None, max_length=64, description="Only files with this purpose.")) -> dict:
    """OpenAI's list: a cursor page (``after`` an id, ``limit``, ``order``) of the caller's files."""
    from sqlalchemy import and_, or_, select

    from ..store.tables import File

    newest_first = order == "desc"
    with store.Session() as s:
        q = select(File).order_by(*((File.created_at.desc(), File.id.desc()) if newest_first
                                    else (File.created_at.asc(), File.id.asc())))
        if scope.only is not None:
            q = q.where(File.tenant == scope.only)
        if purpose:
            q = q.where(File.purpose == purpose)
        if after:
            cursor = get_file(store, after, scope.only)  # FileNotFound: a 404 naming it
            beyond = (File.created_at < cursor.created_at) if newest_first else (File.created_at > cursor.created_at)
            tie = (File.id < cursor.id) if newest_first else (File.id > cursor.id)
            q = q.where(or_(beyond, and_(File.created_at == cursor.created_at, tie)))
        rows = list(s.scalars(q.limit(limit + 1)))
    data, unreadable = render_rows(rows[:limit], lambda f: FileOut.of(f).model_dump())
    return {"object": "list", "data": data, "has_more": len(rows) > limit,
            "first_id": data[0]["id"] if data else None, "last_id": data[-1]["id"] if data else None,
            **({"unreadable": unreadable} if unreadable else {})}


def _get(store, file_id: str, scope: Scope):
    f = get_file(store, file_id, scope.only)  # FileNotFound: OpenAI's 404 (service/openai_compat/errors.py)
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
    f = _get(store, file_id, scope)
    remove_file(store, f.id)
    return {"id": f.id, "object": "file", "deleted": True}
