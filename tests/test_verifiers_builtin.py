"""Built-in text verifiers, the `multi` formula, and the Scorer (health metrics, pool = in-process)."""
from __future__ import annotations

import subprocess
import sys

import pytest
from pydantic import ValidationError

from trainer.scoring import Scorer, health_metrics
from verifiers import Status, get_verifier
from verifiers.multi import FormulaError, eval_formula, parse_formula
from verifiers.spec import VerifierSpec


def _specs(dicts):
    return [VerifierSpec.model_validate(d) for d in dicts]


def v(name, **config):
    return get_verifier(name, config)


# ------------------------------------------------------------------------------------------ format
@pytest.mark.parametrize("text, ok", [
    ("<think>2+2 is 4</think> 4", True),
    ("<think>x</think>", False),                       # nothing after the tags
    ("4 <think>x</think> 4", False),                   # strict: text before the tag
    ("<think>a</think><think>b</think> 4", False),     # twice
    ("<think>never closed 4", False),
    ("</think>backwards<think> 4", False),
])
def test_format_think_then_answer(text, ok):
    verdict = v("format", tags=["think"], answer_after=True, strict=True).verify(text, None)
    assert (verdict.score, verdict.status) == ((1.0, Status.correct) if ok else (0.0, Status.wrong)), verdict.reason


def test_format_tags_in_order_and_regex():
    fmt = v("format", tags=["think", "answer"], pattern=r"<answer>\s*-?\d+\s*</answer>\s*$")
    assert fmt.verify("<think>hm</think>\n<answer> 42 </answer>", None).score == 1.0
    assert fmt.verify("<answer>42</answer><think>hm</think>", None).score == 0.0  # order
    assert fmt.verify("<think>hm</think><answer>forty</answer>", None).score == 0.0  # regex
    with pytest.raises(ValidationError, match="invalid regex"):
        v("format", pattern="(unclosed")
    with pytest.raises(ValidationError, match="give `pattern`, `tags` or both"):
        v("format")
    with pytest.raises(ValidationError, match="plain tag name"):
        v("format", tags=["a>b"])


# ------------------------------------------------------------------------------------------ string_check
@pytest.mark.parametrize("config, completion, reference, status", [
    ({}, " Paris\n", "Paris", Status.correct),
    ({}, "paris", "Paris", Status.wrong),
    ({"ignore_case": True}, "PARIS", "paris", Status.correct),
    ({"operation": "ne"}, "Rome", "Paris", Status.correct),
    ({"operation": "ne"}, "Paris", "Paris", Status.wrong),
    ({"operation": "contains"}, "The capital is Paris.", "Paris", Status.correct),
    ({"operation": "contains", "ignore_case": True}, "the capital is PARIS.", "paris", Status.correct),
    ({"extract": r"<answer>(.*?)</answer>"}, "<answer>x</answer> then <answer>Paris</answer>", "Paris", Status.correct),
    ({"extract": r"<answer>(.*?)</answer>"}, "Paris", "Paris", Status.unparseable),
])
def test_string_check(config, completion, reference, status):
    for name in ("string_check", "exact"):  # the alias is the same verifier
        verdict = v(name, **config).verify(completion, reference)
        assert verdict.status is status and verdict.score == (1.0 if status is Status.correct else 0.0)


def test_string_check_bad_reference_is_an_error_not_a_zero():
    assert v("string_check").verify("1", 1).status is Status.error


# ------------------------------------------------------------------------------------------ multiple_choice
@pytest.mark.parametrize("completion, choice", [
    ("The answer is B.", "B"),
    ("Answer: (C)", "C"),
    ("I think **Answer: D**", "D"),
    ("Let me see. (A) is wrong, (B) too...\n\nC", "C"),
    ("so \\boxed{A}", "A"),
    ("<answer>B</answer>", "B"),
    ("Option (A) fails, so (D)", "D"),
])
def test_multiple_choice_extracts_the_final_letter(completion, choice):
    verdict = v("multiple_choice").verify(completion, choice)
    assert verdict.status is Status.correct, verdict.reason
    assert v("multiple_choice").verify(completion, "E" if choice != "E" else "A").status in (Status.wrong, Status.error)


def test_multiple_choice_unparseable_and_bad_reference():
    assert v("multiple_choice").verify("A cat sat on the mat.", "A").status is Status.unparseable
    assert v("multiple_choice").verify("Answer: E", "E").status is Status.error  # E is not a choice
    assert v("multiple_choice", choices="ABCDE").verify("Answer: E", "(e)").status is Status.correct


# ------------------------------------------------------------------------------------------ length_penalty
def test_length_penalty_is_linear_outside_the_band():
    lp = v("length_penalty", max_len=10, ramp=10)
    assert lp.verify("x" * 10, None).score == 1.0
    assert lp.verify("x" * 15, None).score == pytest.approx(0.5)
    assert lp.verify("x" * 40, None).score == 0.0
    words = v("length_penalty", unit="words", min_len=2, max_len=3, ramp=2)
    assert words.verify("one", None).score == pytest.approx(0.5)
    assert words.verify("one two three", None).status is Status.correct
    with pytest.raises(ValidationError):
        v("length_penalty", min_len=5, max_len=2)


# ------------------------------------------------------------------------------------------ multi
SUBS = {"ans": {"name": "string_check", "config": {"extract": r"<answer>(.*?)</answer>"}},
        "fmt": {"name": "format", "config": {"tags": ["think", "answer"]}},
        "brief": {"name": "length_penalty", "config": {"max_len": 40, "ramp": 40}}}
GOOD = "<think>2+2</think><answer>4</answer>"  # 36 chars: every part scores 1


def test_multi_weighted_sum():
    subs = {k: {**s, "weight": w} for (k, s), w in zip(SUBS.items(), (0.7, 0.2, 0.1))}
    m = v("multi", verifiers=subs)
    good = m.verify(GOOD, "4")
    assert good.score == pytest.approx(1.0) and good.status is Status.correct
    assert good.details["sub_scores"] == {"ans": 1.0, "fmt": 1.0, "brief": 1.0}
    wrong = m.verify("<think>2+2</think><answer>5</answer>", "4")
    assert wrong.score == pytest.approx(0.3) and wrong.status is Status.wrong


def test_multi_formula():
    m = v("multi", verifiers=SUBS, formula="ans * (0.5 + 0.5 * min(fmt, brief)) - 0.1 * (1 - brief) ** 2")
    assert m.verify(GOOD, "4").score == pytest.approx(1.0)
    # 60 chars: brief = 1 - 20/40 = 0.5 -> 1 * (0.5 + 0.25) - 0.1 * 0.25
    long = "<think>" + "x" * 27 + "</think><answer>4</answer>"
    assert m.verify(long, "4").details["sub_scores"]["brief"] == pytest.approx(0.5)
    assert m.verify(long, "4").score == pytest.approx(0.725)
    assert m.verify("no tags at all", "4").score == 0.0
    clipped = v("multi", verifiers=SUBS, formula="clip(2 * ans - fmt, 0, 1) + abs(-brief) / 2")
    assert clipped.verify(GOOD, "4").score == pytest.approx(1.5)


def test_multi_formula_math_error_is_an_error_verdict():
    m = v("multi", verifiers={"a": SUBS["ans"]}, formula="1 / a")
    verdict = m.verify("<answer>5</answer>", "4")  # a = 0
    assert verdict.status is Status.error and "formula failed" in verdict.reason


def test_multi_propagates_sub_errors():
    m = v("multi", verifiers={"a": SUBS["ans"], "mc": {"name": "multiple_choice"}})
    verdict = m.verify("<answer>B</answer>", "B")  # multiple_choice: fine; string_check: fine
    assert verdict.status is Status.correct or verdict.score == 2.0
    broken = v("multi", verifiers={"a": {"name": "string_check"}}).verify("1", 1)  # non-string reference
    assert broken.status is Status.error


@pytest.mark.parametrize("formula, why", [
    ("__import__('os').system('id')", "only min, max, abs, clip may be called"),
    ("a.__class__", "Attribute is not allowed"),
    ("a[0]", "Subscript is not allowed"),
    ("(lambda: 1)()", "only min, max, abs, clip may be called"),
    ("b + 1", "unknown name 'b'"),
    ("min", "unknown name 'min'"),
    ("max(a, key=abs)", "only min, max, abs, clip may be called"),
    ("clip(a, 0)", "clip() takes 3 arguments"),
    ("a if a else 1", "IfExp is not allowed"),
    ("a % 2", "is not allowed"),
    ("'x' * 3", "Constant is not allowed"),
    ("True + a", "Constant is not allowed"),
    ("a; a", "not an expression"),
    ("-" * 80 + "a", "nests deeper"),
    ("a" + " + a" * 400, "longer than"),
])
def test_formula_whitelist_rejects(formula, why):
    with pytest.raises(FormulaError, match=why.replace("(", r"\(").replace(")", r"\)")):
        parse_formula(formula, ["a"])
    with pytest.raises(ValidationError):  # and the config refuses it (a 422 for a job spec)
        v("multi", verifiers={"a": SUBS["ans"]}, formula=formula)


def test_formula_never_reaches_eval():
    assert eval_formula(parse_formula("max(a, 2) ** 2 / 8 + -a", ["a"]), {"a": 1.0}) == pytest.approx(-0.5)
    with pytest.raises(ValueError, match="exponent"):
        eval_formula(parse_formula("2 ** (a * 100)", ["a"]), {"a": 1.0})
    with pytest.raises(ValueError):  # a complex result is not a score
        eval_formula(parse_formula("(0 - a) ** 0.5", ["a"]), {"a": 1.0})


def test_multi_labels_must_be_identifiers():
    with pytest.raises(ValidationError, match="identifier"):
        v("multi", verifiers={"not-ok": SUBS["ans"]})
    with pytest.raises(ValidationError, match="identifier"):
        v("multi", verifiers={"min": SUBS["ans"]})


# ------------------------------------------------------------------------------------------ scorer
SPECS = [{"name": "multi", "weight": 1.0, "config": {"verifiers": SUBS, "formula": "ans * min(fmt, brief)"}},
         {"name": "string_check", "weight": 0.5, "config": {"extract": r"<answer>(.*?)</answer>"}},
         {"name": "multiple_choice", "weight": 0.0, "config": {}}]


def batch(n=48):
    comps = [GOOD if i % 4 == 0 else f"<think>{'y' * i}</think><answer>{i % 3}</answer>" if i % 4 != 3 else "junk"
             for i in range(n)]
    return comps, [str(i % 2) for i in range(n)]


def test_scorer_health_metrics():
    comps, refs = batch()
    sc = Scorer(_specs(SPECS))(comps, refs)
    h = sc.health["string_check"]
    assert h["calls"] == 48 and h["unparseable_rate"] == pytest.approx(12 / 48)
    assert h["mean"] == pytest.approx(sum(sc.per_verifier["string_check"]) / 48)
    assert 0 < h["latency_p50_s"] <= h["latency_p95_s"] < 1
    mc = sc.health["multiple_choice"]
    assert mc["error_rate"] == 1.0  # references "0"/"1" are not option letters: every call errors
    m = health_metrics([sc])
    assert m["verifier/multi/calls"] == 48.0 and set(m) >= {f"verifier/multi/{k}" for k in
                                                           ("mean", "error_rate", "timeout_rate", "unparseable_rate",
                                                            "latency_p50_s", "latency_p95_s")}
    assert sc.rewards == pytest.approx([a + 0.5 * b for a, b in zip(sc.per_verifier["multi"],
                                                                    sc.per_verifier["string_check"])])
    assert max(sc.rewards) == pytest.approx(1.5)  # some completions answer right with good form


def test_infrastructure_failures_are_retried_once_then_flagged():
    """A verdict with status `error` (sandbox down, verifier crash) is scored again; one that fails
    twice is flagged in Scores.infra (the trainer leaves it out of the group's statistics) and the
    health record counts every call, the retries included."""
    from verifiers import BaseVerifier, Status, Verdict, register
    from verifiers.registry import _registry

    class Flaky(BaseVerifier):
        name, version, description = "flaky-infra", "1", "fails the first call on every 'x' completion"
        seen: dict = {}

        def verify(self, completion, reference):
            n = Flaky.seen[completion] = Flaky.seen.get(completion, 0) + 1
            if completion.startswith("down"):
                return Verdict(0.0, Status.error, "sandbox unreachable")
            if completion.startswith("x") and n == 1:
                return Verdict(0.0, Status.error, "transient")
            return Verdict(1.0, Status.correct)

    if "flaky-infra" not in _registry:
        register("flaky-infra", Flaky)
    comps = ["x1", "ok", "down", "x2"]
    sc = Scorer(_specs([{"name": "flaky-infra", "weight": 1.0, "config": {}}]))(comps, [None] * 4)
    assert sc.retried == 3  # x1, down, x2
    assert sc.infra == [False, False, True, False]
    assert sc.rewards == [1.0, 1.0, 0.0, 1.0]
    h = sc.health["flaky-infra"]
    assert h["calls"] == 7 and h["error_rate"] == pytest.approx(4 / 7)
    assert len(sc.latencies["flaky-infra"]) == 7
    # a zero-weight verifier's failure does not make the reward untrustworthy: nothing is flagged
    sc = Scorer(_specs([{"name": "exact", "weight": 1.0, "config": {}},
                        {"name": "flaky-infra", "weight": 0.0, "config": {}}]))(["down"], ["down"])
    assert sc.infra == [False] and sc.retried == 0


def test_health_of_a_step_covers_every_scoring_call():
    comps, refs = batch(16)
    a = Scorer(_specs(SPECS))(comps[:8], refs[:8])
    b = Scorer(_specs(SPECS))(comps[8:], refs[8:])
    whole = Scorer(_specs(SPECS))(comps, refs)
    m = health_metrics([a, b])
    assert m["verifier/string_check/calls"] == 16.0
    for k, v in health_metrics([whole]).items():
        if "latency" not in k:
            assert m[k] == pytest.approx(v), k


def test_duplicate_verifier_names_get_their_own_label():
    sc = Scorer(_specs([{"name": "exact", "weight": 1.0, "config": {}},
                        {"name": "exact", "weight": 2.0, "config": {"ignore_case": True}}]))(["A"], ["a"])
    assert sc.per_verifier == {"exact": [0.0], "exact#2": [1.0]} and sc.rewards == [2.0]


def test_import_verifiers_stays_light():
    code = ("import sys, verifiers; verifiers.available(); verifiers.get_verifier('multi', {'verifiers': "
            "{'a': {'name': 'format', 'config': {'tags': ['t']}}}}); "
            "bad = [m for m in ('torch', 'sympy', 'sandbox', 'service', 'trainer') if m in sys.modules]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stderr


def test_the_scorer_warms_each_verifier_once_and_times_plain_loops_per_call(monkeypatch):
    from verifiers import BaseVerifier, Status, Verdict, registry

    warmed = []

    class Warm(BaseVerifier):
        name = "warm-test"

        def warm_up(self):
            warmed.append(self)

        def verify(self, completion, reference):
            return Verdict(1.0, Status.correct, "")

    class Batched(BaseVerifier):
        name = "batched-test"
        batches = True

        def verify_batch(self, completions, references):
            return [Verdict(0.0, Status.wrong, "", {"elapsed_s": 0.25}) for _ in completions]

    monkeypatch.setitem(registry._registry, "warm-test", Warm)
    monkeypatch.setitem(registry._registry, "batched-test", Batched)
    sc = Scorer(_specs([{"name": "warm-test"}, {"name": "batched-test"}]))
    assert len(warmed) == 1
    out = sc(["a", "b"], [None, None])
    assert len(warmed) == 1 and out.rewards == [1.0, 1.0]
    assert out.latencies["batched-test"] == [0.25, 0.25]  # a batching verifier's own per-call times
    assert all(0 <= x < 0.25 for x in out.latencies["warm-test"])  # timed here, one call at a time
