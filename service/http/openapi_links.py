"""OpenAPI links: which response value feeds which request, so clients and stateful fuzzers
(schemathesis) can walk from an upload to its file routes, from a job to its checkpoints and their
download, from a registered verifier to its dry run.

Added to the generated document as ``responses.<status>.links`` with ``operationRef`` pointers, so
they follow the routes whatever FastAPI names their operations.
"""
from __future__ import annotations

from typing import Any

JOB = "/v1/jobs/{job_id}"
FT_JOB = "/v1/fine_tuning/jobs/{job_id}"
FILE = "/v1/files/{file_id}"
VERIFIER = "/v1/verifiers/{name}"
CKPT = "/v1/jobs/{job_id}/checkpoints/{name}/download"

_JOB_TARGETS = [(JOB, "get"), (JOB, "delete"), (f"{JOB}/cancel", "post"), (f"{JOB}/pause", "post"),
                (f"{JOB}/resume", "post"), (f"{JOB}/metrics", "get"), (f"{JOB}/events", "get"),
                (f"{JOB}/events/stream", "get"), (f"{JOB}/checkpoints", "get"), (f"{JOB}/rollouts", "get"),
                (f"{JOB}/evals", "get")]
_FT_TARGETS = [(FT_JOB, "get"), (f"{FT_JOB}/events", "get"), (f"{FT_JOB}/checkpoints", "get"),
               (f"{FT_JOB}/cancel", "post"), (f"{FT_JOB}/pause", "post"), (f"{FT_JOB}/resume", "post")]
_FILE_TARGETS = [(FILE, "get"), (f"{FILE}/content", "get"), (FILE, "delete")]
_VERIFIER_TARGETS = [(VERIFIER, "get"), (f"{VERIFIER}/run", "post")]

# (source path, method, status) -> [(target path, method, {parameter: runtime expression})]
LINKS: dict[tuple[str, str, str], list[tuple[str, str, dict[str, str]]]] = {
    ("/v1/jobs", "post", "201"): [(p, m, {"job_id": "$response.body#/id"}) for p, m in _JOB_TARGETS],
    ("/v1/jobs", "get", "200"): [(p, m, {"job_id": "$response.body#/data/0/id"}) for p, m in _JOB_TARGETS],
    (f"{JOB}/checkpoints", "get", "200"): [
        (CKPT, "get", {"job_id": "$request.path.job_id", "name": "$response.body#/0/name"})],
    ("/v1/fine_tuning/jobs", "post", "200"): [(p, m, {"job_id": "$response.body#/id"}) for p, m in _FT_TARGETS],
    ("/v1/fine_tuning/jobs", "get", "200"): [(p, m, {"job_id": "$response.body#/data/0/id"}) for p, m in _FT_TARGETS],
    ("/v1/files", "post", "201"): [(p, m, {"file_id": "$response.body#/id"}) for p, m in _FILE_TARGETS],
    ("/v1/files", "get", "200"): [(p, m, {"file_id": "$response.body#/data/0/id"}) for p, m in _FILE_TARGETS],
    ("/v1/verifiers", "post", "201"): [(p, m, {"name": "$response.body#/name"}) for p, m in _VERIFIER_TARGETS],
    ("/v1/verifiers", "get", "200"): [(p, m, {"name": "$response.body#/data/0/name"}) for p, m in _VERIFIER_TARGETS],
}


def _ref(path: str, method: str) -> str:
    return "#/paths/" + path.replace("~", "~0").replace("/", "~1") + "/" + method


def add_links(doc: dict[str, Any]) -> dict[str, Any]:
    """Put :data:`LINKS` into an OpenAPI document (in place); links to routes it lacks are left out."""
    paths = doc.get("paths", {})
    for (src, method, status), targets in LINKS.items():
        op = paths.get(src, {}).get(method)
        if op is None:
            continue
        response = op.setdefault("responses", {}).setdefault(status, {"description": "Successful Response"})
        links = response.setdefault("links", {})
        for target, tmethod, params in targets:
            if tmethod in paths.get(target, {}):
                name = (tmethod + target.replace("/v1/", "_").replace("/", "_")).replace("{", "").replace("}", "")
                links[name] = {"operationRef": _ref(target, tmethod), "parameters": dict(params)}
    return doc
