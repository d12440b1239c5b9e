"""Arithmetic tasks must not reward echoing the question: `allow_unevaluated: false`."""
from verifiers import get_verifier


def test_echoing_the_question_is_wrong_when_answers_must_be_stated():
    strict = get_verifier("math", {"allow_unevaluated": False})
    loose = get_verifier("math")
    for echo in ("\\boxed{30-15}", "30-15", "The answer is 3*5", "\\boxed{\\sqrt{225}}"):
        assert strict.verify(echo, "15").status.value == "wrong", echo
        assert "stated" in strict.verify(echo, "15").reason
        assert loose.verify(echo, "15").status.value == "correct", echo  # MATH-style graders accept it
    for stated, gold in (("\\boxed{15}", "15"), ("\\boxed{-15}", "-15"), ("\\boxed{0.5}", "\\frac{1}{2}"),
                         ("\\boxed{\\frac{3}{4}}", "0.75"), ("\\boxed{-\\frac{3}{4}}", "-0.75")):
        assert strict.verify(stated, gold).status.value == "correct", stated
    assert strict.verify("\\boxed{16}", "15").status.value == "wrong"
    # non-numeric golds are untouched by the rule
    assert strict.verify("\\boxed{2\\sqrt{3}}", "\\sqrt{12}").status.value == "correct"
