"""/v1/models: every model a job can start from, in OpenAI's shape (``client.models.list()`` / ``retrieve``).

Built-in, pulled (model cache) and cached (Hugging Face cache) models are the server's and every tenant sees
them; fine-tuned ones (``ft:<base>:<job id>``, with a ``download_url``) are the caller's tenant's own. Each id
is a valid ``model.path`` (service/jobs/catalog.py). Errors in OpenAI's shape.
"""
from __future__ import annotations

from fastapi import Path as PathParam

from ..deps import ScopeDep, SettingsDep, StoreDep
from ..http.guard import api_router
from ..jobs.catalog import catalog, find
from ..openai_compat.errors import OpenAIRoute, error

router = api_router(prefix="/v1/models", tags=["openai-compatible"], route_class=OpenAIRoute)


@router.get("")
def list_models(store: StoreDep, settings: SettingsDep, scope: ScopeDep) -> dict:
    return {"object": "list", "data": [m.public() for m in catalog(settings, store, scope)]}


@router.get("/{model_id:path}")
def retrieve_model(store: StoreDep, settings: SettingsDep, scope: ScopeDep,
                   model_id: str = PathParam(..., max_length=1024, description="A model id from the list "
                                             "(`builtin:tiny-arith`, `Qwen/Qwen2.5-0.5B-Instruct`, `ft:…`).")):
    entry = find(settings, store, scope, model_id)
    if entry is None:  # another tenant's fine-tuned model reads exactly like a missing one
        return error(404, f"The model {model_id!r} does not exist or you do not have access to it.", "model",
                     "model_not_found")
    return entry.public()
