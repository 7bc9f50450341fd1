"""The built-in scorers against a table of cases: GSM8K (formats, negatives, commas, fractions,
decimals, units) and MATH (\\boxed with nesting, \\frac forms, normalisation), exact match."""

from __future__ import annotations

import pytest

from nereus.rl.rewards.builtin import exact, gsm8k, math, parse_number
from nereus.rl.rewards.math_answer import last_boxed, normalize

SOLUTION = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nAltogether 48+24 = 72 clips.\n#### 72"

# (response, reference answer, expected score)
GSM8K_CASES = [
    ("She sold 72 clips in total.\n#### 72", SOLUTION, 1.0),
    ("#### 72", "72", 1.0),
    ("The answer is 72.", SOLUTION, 1.0),  # no ####: the last number
    ("48 + 24 = 72", SOLUTION, 1.0),
    ("48 + 24 = 73", SOLUTION, 0.0),
    ("#### 71", SOLUTION, 0.0),
    ("#### 72.0", SOLUTION, 1.0),
    ("#### 72.00", "72", 1.0),
    ("#### $72", "72", 1.0),
    ("It costs $1,234 in all. #### 1,234", "#### 1234", 1.0),
    ("#### 1234", "The total is 1,234 dollars.\n#### 1,234", 1.0),
    ("#### 1,234,567", "1234567", 1.0),
    ("#### -5", "#### -5", 1.0),
    ("#### 5", "#### -5", 0.0),
    ("The temperature fell to -12 degrees.", "#### -12", 1.0),
    ("#### 3/4", "#### 0.75", 1.0),
    ("#### 0.75", "3/4", 1.0),
    ("#### 1/3", "#### 0.33", 0.0),
    ("#### 2.5", "#### 5/2", 1.0),
    ("#### .5", "#### 0.5", 1.0),
    ("#### 50%", "#### 50", 1.0),
    ("so the answer is \\boxed{18}", "#### 18", 1.0),
    ("first 10, then 20 #### 20 apples\nchecked: 30", "#### 20", 1.0),  # the #### line wins
    ("I don't know.", SOLUTION, 0.0),
    ("", SOLUTION, 0.0),
    ("#### seventy-two", SOLUTION, 0.0),
]

MATH_CASES = [
    ("The answer is $\\boxed{5}$.", "5", 1.0),
    ("\\boxed{5}", "\\boxed{6}", 0.0),
    ("so $x = \\boxed{\\frac{1}{2}}$", "\\frac{1}{2}", 1.0),
    ("\\boxed{\\dfrac{1}{2}}", "\\frac12", 1.0),
    ("\\boxed{\\tfrac{3}{4}}", "\\frac{3}{4}", 1.0),
    ("\\boxed{0.5}", "\\frac{1}{2}", 1.0),
    ("\\boxed{1/2}", "\\frac{1}{2}", 1.0),
    ("\\boxed{-\\frac{1}{2}}", "-0.5", 1.0),
    ("\\boxed{\\frac{2}{4}}", "\\frac{1}{2}", 1.0),  # equal values
    ("\\boxed{\\sqrt{2}}", "\\sqrt2", 1.0),
    ("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt{3}}{2}", 1.0),  # nested braces
    ("\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}", "(3,\\frac{\\pi}{2})", 1.0),
    ("\\boxed{90^\\circ}", "90", 1.0),
    ("\\boxed{\\$18.90}", "18.90", 1.0),
    ("\\boxed{10\\%}", "10", 1.0),
    ("\\boxed{x = 3}", "3", 1.0),
    ("\\boxed{1,000}", "1000", 1.0),
    ("\\boxed{\\text{(C)}}", "(C)", 1.0),
    ("\\boxed{5 \\text{ cm}}", "5", 1.0),
    ("first \\boxed{4}, then corrected: \\boxed{7}", "7", 1.0),  # the last box counts
    ("\\fbox{12}", "12", 1.0),
    ("\\boxed 9", "9", 1.0),
    ("The answer is 5.", "5", 0.0),  # no \boxed: 0
    ("\\boxed{5", "5", 0.0),  # not closed
    ("\\boxed{}", "5", 0.0),
    ("\\boxed{\\{1, 2\\}}", "\\{1,2\\}", 1.0),
    ("\\boxed{3}", "The answer follows.\n$\\boxed{3}$", 1.0),  # a MATH solution as reference
    ("\\boxed{-3}", "3", 0.0),
]

EXACT_CASES = [("Paris", "Paris", 1.0), ("  Paris\n", "Paris", 1.0), ("paris", "Paris", 0.0),
               ("42", 42, 1.0), ("Paris.", "Paris", 0.0)]


@pytest.mark.parametrize(("response", "answer", "want"), GSM8K_CASES)
def test_gsm8k(response: str, answer: str, want: float) -> None:
    assert gsm8k("q", response, answer, {}) == want


@pytest.mark.parametrize(("response", "answer", "want"), MATH_CASES)
def test_math(response: str, answer: str, want: float) -> None:
    assert math("q", response, answer, {}) == want


@pytest.mark.parametrize(("response", "answer", "want"), EXACT_CASES)
def test_exact(response: str, answer: object, want: float) -> None:
    assert exact("q", response, answer, {}) == want


def test_the_table_is_large() -> None:
    assert len(GSM8K_CASES) + len(MATH_CASES) >= 30
    for cases in (GSM8K_CASES, MATH_CASES):  # both outcomes in each table
        assert {w for _, _, w in cases} == {0.0, 1.0}


def test_boxed_extraction_and_normal_forms() -> None:
    assert last_boxed("a \\boxed{\\frac{a}{b^{2}}} b") == "\\frac{a}{b^{2}}"
    assert last_boxed("no box") is None
    assert normalize("\\dfrac12") == "\\frac{1}{2}"
    assert normalize("\\left(1, 2\\right)") == "(1,2)"
    assert normalize(" .5") == "\\frac{1}{2}"
    assert parse_number("-1,234.50") == parse_number("-2469/2")
    assert parse_number("abc") is None and parse_number("1/0") is None
