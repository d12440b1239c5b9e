"""/v1/datasets: what a job's `data.dataset` can name — the built-in tasks with their params and verifiers, and
the caller's uploaded files (newest first; GET /v1/files pages them all)."""
from __future__ import annotations

from fastapi import Query
from sqlalchemy import select

from ..deps import ScopeDep, StoreDep
from ..http.guard import api_router
from ..jobs.schemas import DatasetList, DatasetOut
from ..store.tables import File

router = api_router(prefix="/v1/datasets", tags=["datasets"])


@router.get("", response_model=DatasetList)
def list_datasets(store: StoreDep, scope: ScopeDep,
                  files_limit: int = Query(100, ge=0, le=1000, description="At most this many uploaded files.")
                  ) -> DatasetList:
    from trainer.tasks import tasks

    builtins = [DatasetOut.of_task(name, t) for name, t in sorted(tasks().items())]
    with store.Session() as s:
        q = select(File).order_by(File.created_at.desc(), File.id.desc())
        if scope.only is not None:
            q = q.where(File.tenant == scope.only)
        files = list(s.scalars(q.limit(files_limit + 1)))
    return DatasetList(data=builtins + [DatasetOut.of_file(f) for f in files[:files_limit]],
                       has_more_files=len(files) > files_limit)
