"""The OpenAI-compatible request bodies as pydantic models: one model validates each whole body.

Strict types (a string where an integer belongs, a bool for a number, NaN/Infinity, a 300-character
model name, an unknown key anywhere) are refused before anything is read or stored; the router turns
the first error into OpenAI's 400 shape naming the parameter (:func:`openai_param`). What the models
cannot say (which ``{{item.field}}`` templates we support, what a python grader must define) is
checked while mapping (service/openai_compat/mapping.py), with the same 400.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StringConstraints

from verifiers.remote import MAX_SOURCE_CHARS

FILE_ID = r"^file-[A-Za-z0-9_-]{1,64}$"
_PRINTABLE = r"^[^\x00-\x1f\x7f]*$"


def _auto(v: Any) -> Any:
    return None if v == "auto" else v


def _unsupported(default: str, why: str):
    """A parameter we cannot honour: its default ("auto"/"default") is accepted, any other value is a 400
    naming it — never silently ignored."""
    def check(v: Any) -> Any:
        if v is None or v == default:
            return None
        raise ValueError(f"not supported by this server ({why}); leave it out or use {default!r}")

    return BeforeValidator(check)


AutoInt = Annotated[int | None, BeforeValidator(_auto)]  # "auto" = our default (None)
AutoFloat = Annotated[float | None, BeforeValidator(_auto)]
Template = Annotated[str, StringConstraints(max_length=1024)]


class _Req(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class Hyperparameters(_Req):
    n_epochs: AutoInt = Field(None, ge=1, le=100, description="Passes over the training file (default 1).")
    batch_size: AutoInt = Field(None, ge=1, le=1024, description="Prompts per step (default 8).")
    learning_rate_multiplier: AutoFloat = Field(None, gt=0, le=100, description="× 5e-5 (default 1).")
    eval_interval: AutoInt = Field(None, ge=0, le=1_000_000, description="Steps between held-out evals (0: start/end).")
    eval_samples: Annotated[Literal["auto"] | None, _unsupported("auto", "held-out evaluation is greedy, one "
                            "sample per prompt")] = Field(None, description="Not supported: only `auto`.")
    compute_multiplier: AutoFloat = Field(None, gt=0, le=8, description="Group size = 8 × this, in [2, 64].")
    reasoning_effort: Annotated[Literal["default"] | None, _unsupported("default", "models here have no reasoning "
                                "effort setting")] = Field(None, description="Not supported: only `default`.")


class _Grader(_Req):
    name: str = Field("grader", max_length=256, pattern=_PRINTABLE)


class StringCheckGrader(_Grader):
    type: Literal["string_check"]
    input: Template = "{{sample.output_text}}"
    reference: Template | None = None
    operation: Literal["eq", "ne", "like", "ilike"] = "eq"


class TextSimilarityGrader(_Grader):
    type: Literal["text_similarity"]
    input: Template = "{{sample.output_text}}"
    reference: Template | None = None
    evaluation_metric: Literal["fuzzy_match"] = "fuzzy_match"


class PythonGrader(_Grader):
    type: Literal["python"]
    source: str = Field(..., min_length=1, max_length=MAX_SOURCE_CHARS, description="Defines grade(sample, item).")
    image_tag: str | None = Field(None, max_length=256, description="Not supported (the sandbox has one image).")


class ConfiguredGrader(_Grader):
    """rlvr's own graders: the math checker and sandboxed code tests, with their verifier config."""

    type: Literal["math", "code"]
    reference: Template | None = None
    config: dict[str, Any] = Field(default_factory=dict)


class MultiGrader(_Grader):
    type: Literal["multi"]
    graders: dict[Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")], "Grader"] = Field(
        ..., min_length=1, max_length=16)
    calculate_output: str | None = Field(None, max_length=4096)


Grader = Annotated[Union[StringCheckGrader, TextSimilarityGrader, PythonGrader, ConfiguredGrader, MultiGrader],
                   Field(discriminator="type")]
MultiGrader.model_rebuild()


class Reinforcement(_Req):
    grader: Grader
    hyperparameters: Hyperparameters | None = None


class Method(_Req):
    type: Literal["reinforcement"] = Field(..., description="Only reinforcement fine-tuning is supported.")
    reinforcement: Reinforcement


class FineTuningJobCreate(_Req):
    model: str = Field(..., min_length=1, max_length=256, pattern=_PRINTABLE,
                       description="Any id `GET /v1/models` lists (built-in, pulled, a Hugging "
                       "Face Hub id, your fine-tuned `ft:…` models), as model.path takes it.")
    training_file: str = Field(..., pattern=FILE_ID)
    validation_file: str | None = Field(None, pattern=FILE_ID)
    method: Method
    seed: int | None = Field(None, ge=0, le=2**32 - 1)
    suffix: str | None = Field(None, min_length=1, max_length=64, pattern=_PRINTABLE)
    metadata: dict[Annotated[str, StringConstraints(min_length=1, max_length=64)],
                   Annotated[str, StringConstraints(max_length=512)]] | None = Field(None, max_length=16)
    hyperparameters: None = Field(None, description="The deprecated top-level form is not supported: use "
                                  "method.reinforcement.hyperparameters.")
    integrations: list[Any] | None = Field(None, max_length=0, description="Not supported (must be empty).")


class GraderRunIn(_Req):
    grader: Grader
    model_sample: str = Field(..., max_length=100_000)
    item: dict[str, Any] | None = None


class GraderValidateIn(_Req):
    grader: Grader


def openai_param(error: dict[str, Any]) -> str:
    """A pydantic error's location as OpenAI names the parameter: ``method.reinforcement.grader.operation``
    (the discriminator tags pydantic inserts after ``grader`` and after each ``graders`` label dropped)."""
    loc = [str(x) for x in error.get("loc", ())]
    if loc and loc[0] in ("body", "query"):
        loc = loc[1:]
    out, i = [], 0
    while i < len(loc):
        out.append(loc[i])
        if loc[i] == "grader":
            i += 2
        elif loc[i] == "graders" and i + 1 < len(loc):
            out.append(loc[i + 1])
            i += 3
        else:
            i += 1
    if error.get("type") in ("union_tag_invalid", "union_tag_not_found"):
        out.append("type")
    return ".".join(out)
