"""OpenAI reinforcement fine-tuning shapes ↔ rlvr job specs (pure functions, no I/O).

Graders map onto verifiers: ``string_check`` → string_check, ``text_similarity`` (fuzzy_match) →
text_similarity, ``python`` → the sandboxed python verifier (its ``grade(sample, item)`` wrapped as
``verify``), ``multi`` → multi, plus our own ``math`` and ``code`` types. Anything we cannot honour
raises :class:`Unsupported` (→ HTTP 400 naming the parameter), never a silent approximation.
"""
from __future__ import annotations

import datetime as dt
import math
import re
from typing import Any

from ..access.redact import redact_paths
from ..jobs.catalog import base_name, fine_tuned_id

BASE_LR = 5e-5
DEFAULT_BATCH = 8
DEFAULT_GROUP = 8
_TEMPLATE = re.compile(r"^\{\{\s*item\.([A-Za-z0-9_]+)\s*\}\}$")
_SAMPLE = {"{{sample.output_text}}", "{{ sample.output_text }}"}
PY_ADAPTER = '''

def verify(completion, reference, **fields):
    # OpenAI python graders define grade(sample, item); rlvr calls verify(completion, reference)
    item = reference if isinstance(reference, dict) else {"reference": reference}
    return grade({"output_text": completion, "output_json": None}, item)
'''


class Unsupported(ValueError):
    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


def _field(template: Any, param: str) -> str | None:
    """``{{item.answer}}`` → "answer"; None for graders that take the whole item."""
    if template is None:
        return None
    m = _TEMPLATE.match(str(template))
    if not m:
        raise Unsupported(param, f"only '{{{{item.<field>}}}}' references are supported, got {template!r}")
    return m.group(1)


def _check_input(g: dict, param: str) -> None:
    if "input" in g and g["input"] not in _SAMPLE:
        raise Unsupported(f"{param}.input", "only '{{sample.output_text}}' is supported as a grader input")


def grader_to_verifier(g: dict, param: str = "method.reinforcement.grader") -> tuple[dict, str | None]:
    """One grader → (verifier spec dict, item field used as its reference or None for the whole item)."""
    if not isinstance(g, dict) or "type" not in g:
        raise Unsupported(param, "a grader is an object with a 'type'")
    t = g["type"]
    if t == "string_check":
        _check_input(g, param)
        op = g.get("operation", "eq")
        cfg = {"eq": {"operation": "eq"}, "ne": {"operation": "ne"}, "like": {"operation": "contains"},
               "ilike": {"operation": "contains", "ignore_case": True}}.get(op)
        if cfg is None:
            raise Unsupported(f"{param}.operation", f"unknown string_check operation {op!r}")
        return {"name": "string_check", "config": cfg}, _field(g.get("reference"), f"{param}.reference")
    if t == "text_similarity":
        _check_input(g, param)
        metric = g.get("evaluation_metric", "fuzzy_match")
        if metric != "fuzzy_match":
            raise Unsupported(f"{param}.evaluation_metric",
                              f"evaluation_metric {metric!r} is not supported (supported: fuzzy_match)")
        return {"name": "text_similarity", "config": {}}, _field(g.get("reference"), f"{param}.reference")
    if t == "python":
        src = g.get("source")
        if not isinstance(src, str) or "def grade" not in src:
            raise Unsupported(f"{param}.source", "python graders define grade(sample, item)")
        if g.get("image_tag"):
            raise Unsupported(f"{param}.image_tag", "image_tag is not supported (the sandbox has one image)")
        return {"name": "python", "config": {"source": src + PY_ADAPTER}}, None
    if t in ("math", "code"):
        return {"name": t, "config": dict(g.get("config") or {})}, _field(g.get("reference"), f"{param}.reference")
    if t == "multi":
        subs, fields = {}, set()
        graders = g.get("graders")
        if not isinstance(graders, dict) or not graders:
            raise Unsupported(f"{param}.graders", "multi needs a non-empty 'graders' object")
        for label, sub in graders.items():
            spec, fld = grader_to_verifier(sub, f"{param}.graders.{label}")
            subs[label] = spec
            fields.add(fld)
        if len(fields) > 1:
            raise Unsupported(f"{param}.graders", "sub-graders must all reference the same item field")
        formula = g.get("calculate_output")
        return {"name": "multi", "config": {"verifiers": subs, **({"formula": formula} if formula else {})}}, \
            fields.pop()
    raise Unsupported(f"{param}.type", f"grader type {t!r} is not supported "
                      "(supported: string_check, text_similarity, python, multi, math, code)")


def convert_rows(rows: list[dict], field: str | None) -> list[dict]:
    """OpenAI RFT lines ({"messages": [...], ...item fields}) → rlvr samples."""
    out = []
    for i, row in enumerate(rows, 1):
        if not isinstance(row, dict) or not isinstance(row.get("messages"), list):
            raise Unsupported("training_file", f"line {i}: expected an object with 'messages'")
        item = {k: v for k, v in row.items() if k != "messages"}
        if field is not None and field not in item:
            raise Unsupported("training_file", f"line {i}: item has no field {field!r} the grader references")
        if not all(isinstance(m, dict) for m in row["messages"]):
            raise Unsupported("training_file", f"line {i}: 'messages' must be objects with 'role' and 'content'")
        prompt = [m for m in row["messages"] if m.get("role") != "assistant"]
        out.append({"prompt": prompt, "reference": item[field] if field else item})
    return out


ALLOWED_HP = {"n_epochs", "batch_size", "learning_rate_multiplier", "eval_interval", "compute_multiplier",
              "eval_samples", "reasoning_effort"}  # the last two only at their defaults (schema.py refuses others)


def hyperparameters(hp: dict, n_train: int) -> tuple[dict, dict]:
    """→ (rlvr train/optim/rollout patch, the effective hyperparameters echoed back)."""
    unknown = set(hp) - ALLOWED_HP
    if unknown:
        raise Unsupported(f"method.reinforcement.hyperparameters.{sorted(unknown)[0]}", "unknown hyperparameter")
    auto = lambda k, d: d if hp.get(k) in (None, "auto") else hp[k]  # noqa: E731
    try:
        epochs, batch = int(auto("n_epochs", 1)), int(auto("batch_size", DEFAULT_BATCH))
        lr_mult = float(auto("learning_rate_multiplier", 1.0))
        group = max(2, min(64, round(DEFAULT_GROUP * float(auto("compute_multiplier", 1.0)))))
        eval_every = int(auto("eval_interval", 0))
    except (TypeError, ValueError) as e:
        raise Unsupported("method.reinforcement.hyperparameters", f"not a number: {e}") from None
    if not (1 <= epochs <= 100 and 1 <= batch <= 1024 and 0 < lr_mult <= 100 and eval_every >= 0):
        raise Unsupported("method.reinforcement.hyperparameters", "value out of range")
    steps = max(1, math.ceil(epochs * n_train / batch))
    patch = {"train": {"steps": steps, "prompts_per_step": batch, "eval_every": eval_every},
             "optim": {"lr": BASE_LR * lr_mult}, "rollout": {"group_size": group}}
    echo = {"n_epochs": epochs, "batch_size": batch, "learning_rate_multiplier": lr_mult,
            "eval_interval": eval_every, "compute_multiplier": group / DEFAULT_GROUP}
    return patch, echo


def checkpoint_url(job_id: str, name: str) -> str:
    """Where a checkpoint can be fetched (a tar of the HF folder): responses name it, never its server path."""
    return f"/v1/jobs/{job_id}/checkpoints/{name}/download"


def _ts(t: dt.datetime | None) -> int | None:
    if t is None:
        return None
    return int((t if t.tzinfo else t.replace(tzinfo=dt.timezone.utc)).timestamp())


def job_object(job, openai_meta: dict) -> dict:
    err = {"code": job.error_code, "message": redact_paths(job.error_message or ""), "param": None} \
        if job.error_code else None
    spec = job.spec if isinstance(job.spec, dict) else {}
    model, seed = (spec.get("model") or {}).get("path"), (spec.get("train") or {}).get("seed")
    return {
        "id": job.id, "object": "fine_tuning.job", "created_at": _ts(job.created_at),
        "finished_at": _ts(job.finished_at), "model": openai_meta.get("model") or (base_name(model) if model else None),
        "fine_tuned_model": fine_tuned_id(job),  # an id /v1/models lists and model.path takes, not a path
        "organization_id": job.tenant, "status": job.status, "error": err, "seed": seed,
        "training_file": openai_meta.get("training_file"), "validation_file": openai_meta.get("validation_file"),
        "result_files": [], "trained_tokens": None, "hyperparameters": openai_meta.get("hyperparameters", {}),
        "method": openai_meta.get("method"), "metadata": job.meta or None, "estimated_finish": None,
        "integrations": None,
    }
