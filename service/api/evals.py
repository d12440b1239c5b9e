"""/v1/jobs/{id}/evals: every held-out eval of a job, problem by problem, and the paired comparison of two.

The worker stores each eval's records (service.store: ``eval_records``); these routes read them in the caller's
tenant scope (another tenant's job is a 404, as for every job route). A comparison pairs two evals of the same
job on the same held-out problems, so the s.e. of the gain is the paired one (trainer.stats) and the problems
that flipped are listed for reading.
"""
from __future__ import annotations

from typing import Any, Literal

from fastapi import HTTPException, Path, Query, status
from pydantic import BaseModel, Field

from trainer.stats import paired

from ..deps import ScopeDep, StoreDep
from ..http.guard import api_router
from ..store.jobs import Store

router = api_router(prefix="/v1/jobs", tags=["evals"])
MAX_STEP = 2**31 - 1  # the step column is a 32-bit integer
Judge = Literal["strict", "reward"]
JUDGE_DOC = ("Which verdict counts as correct: `strict`, the task's declared judge (an echoed question earns "
             "nothing), or `reward`, the job's own reward verifiers.")


class EvalSummary(BaseModel):
    step: int
    problems: int
    accuracy: float = Field(description="Share correct by the job's own reward verifiers (`eval/accuracy`).")
    strict_accuracy: float = Field(description="Share correct by the task's declared judge (`eval/strict_accuracy`).")
    reward: float = Field(description="Mean reward.")


class EvalRecordOut(BaseModel):
    index: int = Field(description="The problem's place in the job's held-out set (the same at every eval).")
    id: str | None = Field(None, description="The problem's id, when its dataset gives one.")
    correct: bool
    strict_correct: bool
    reward: float
    record: dict[str, Any] = Field(description="prompt, reference, completion, verdicts, strict_verdicts, length, …")


class EvalPage(BaseModel):
    step: int
    total: int
    offset: int
    records: list[EvalRecordOut]


class Flip(BaseModel):
    index: int
    id: str | None
    direction: Literal["gained", "lost"] = Field(description="gained: wrong at `a`, right at `b`; lost: the reverse.")
    prompt: Any
    completion_a: str
    completion_b: str


class EvalComparison(BaseModel):
    a: int
    b: int
    judge: Judge
    n: int = Field(description="Problems paired (present at both evals).")
    accuracy_a: float
    accuracy_b: float
    diff: float = Field(description="accuracy_b - accuracy_a.")
    se: float | None = Field(description="Paired standard error of `diff`: sd of the per-problem differences "
                                         "/ sqrt(n).")
    both: int
    gained: int
    lost: int
    neither: int
    mcnemar_p: float = Field(description="Exact two-sided McNemar p-value of `gained` against `lost`.")
    flips_total: int
    flips: list[Flip] = Field(description="The problems that flipped, in held-out order, at most `limit`.")


def _have(store: Store, job_id: str, scope, step: int) -> int:
    store.get_job(job_id, scope.only)  # JobNotFound → 404: another tenant's job is not there
    total = next((n for st, n, *_ in store.eval_steps(job_id) if st == step), 0)
    if not total:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"job {job_id} has no held-out eval at step {step}")
    return total


@router.get("/{job_id}/evals", response_model=list[EvalSummary])
def list_evals(job_id: str, store: StoreDep, scope: ScopeDep) -> list[EvalSummary]:
    """Every stored held-out eval of the job: its step and accuracies (the records: /evals/{step})."""
    store.get_job(job_id, scope.only)
    return [EvalSummary(step=st, problems=n, accuracy=c / n, strict_accuracy=sc / n, reward=r / n)
            for st, n, c, sc, r in store.eval_steps(job_id)]


@router.get("/{job_id}/evals/compare", response_model=EvalComparison)
def compare_evals(job_id: str, store: StoreDep, scope: ScopeDep,
                  a: int = Query(..., ge=0, le=MAX_STEP, description="The earlier eval's step (e.g. 0)."),
                  b: int = Query(..., ge=0, le=MAX_STEP, description="The later eval's step."),
                  judge: Judge = Query("strict", description=JUDGE_DOC),
                  limit: int = Query(50, ge=0, le=1000, description="At most this many flipped problems listed.")
                  ) -> EvalComparison:
    """Paired comparison of two evals of this job on the same held-out problems: which flipped, the paired s.e."""
    _have(store, job_id, scope, a)
    _have(store, job_id, scope, b)
    col = 3 if judge == "strict" else 2
    ra = {r[0]: r for r in store.get_evals(job_id, a, outcome_only=True)}
    rb = {r[0]: r for r in store.get_evals(job_id, b, outcome_only=True)}
    both = sorted(set(ra) & set(rb))
    stats = paired([bool(ra[i][col]) for i in both], [bool(rb[i][col]) for i in both])
    flipped = [i for i in both if bool(ra[i][col]) != bool(rb[i][col])]
    shown = flipped[:limit]
    text_a = {r.idx: r.data for r in store.get_evals(job_id, a, only=shown)}
    text_b = {r.idx: r.data for r in store.get_evals(job_id, b, only=shown)}
    flips = [Flip(index=i, id=rb[i][1], direction="gained" if rb[i][col] else "lost",
                  prompt=text_b[i].get("prompt"), completion_a=str(text_a[i].get("completion", "")),
                  completion_b=str(text_b[i].get("completion", ""))) for i in flipped[:limit]]
    se = stats.pop("se")
    return EvalComparison(a=a, b=b, judge=judge, se=se if se == se else None, flips_total=len(flipped), flips=flips,
                          **stats)


@router.get("/{job_id}/evals/{step}", response_model=EvalPage)
def get_eval(job_id: str, store: StoreDep, scope: ScopeDep,
             step: int = Path(..., ge=0, le=MAX_STEP, description="The eval's step (GET /evals lists them)."),
             offset: int = Query(0, ge=0, le=MAX_STEP), limit: int = Query(100, ge=1, le=500)) -> EvalPage:
    """One eval's per-problem records in held-out order, a page at a time."""
    total = _have(store, job_id, scope, step)
    rows = store.get_evals(job_id, step, offset, limit)
    return EvalPage(step=step, total=total, offset=offset, records=[
        EvalRecordOut(index=r.idx, id=r.problem_id, correct=r.correct, strict_correct=r.strict_correct,
                      reward=r.reward, record=r.data) for r in rows])
