"""The built-in scorers (``reward.fn: gsm8k | math | exact``): 1.0 for a correct answer, 0.0
otherwise. Each has a user function's signature, ``f(prompt, response, answer, row) -> float``.
Pure: text in, a number out.

- **gsm8k**: the reference is GSM8K's solution text ending in ``#### 72`` (or just the number).
  The response's answer is the number after its last ``####``, else the content of its last
  ``\\boxed{}``, else its last number (verl's "flexible" extraction). Numbers compare as exact
  fractions after removing ``,``, ``$`` and a trailing ``%`` or ``.``: ``1,234`` = ``1234``,
  ``0.75`` = ``3/4``, ``-3`` ≠ ``3``, ``72.0`` = ``72``.
- **math**: the response's answer is the content of its last ``\\boxed{...}`` (braces nested,
  also ``\\fbox{}`` and ``\\boxed 5``); the reference is the answer column (its own last
  ``\\boxed{}`` when it has one, as MATH solutions do). Both go through the usual MATH
  normalisation (:mod:`nereus.rl.rewards.math_answer`) and compare as strings, or as numbers
  when both are numbers (``\\frac{1}{2}`` = ``0.5``). No ``\\boxed{}``: 0.
- **exact**: the response, whitespace-stripped, equals the answer's text.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from fractions import Fraction
from typing import Any

from nereus.rl.rewards.math_answer import as_number, equivalent, last_boxed

_NUMBER = re.compile(r"[-+]?\$?(?:\d[\d,]*(?:\.\d+)?|\.\d+)(?:\s*/\s*\d+)?")


def parse_number(text: str) -> Fraction | None:
    """``"-1,234.50"`` → Fraction(-2469, 2); ``"3/4"``, ``"$5"``, ``"75%"`` (→ 75), ``"7."``;
    None when ``text`` is not one number."""
    t = text.strip().rstrip(".").replace(",", "").replace("$", "").replace(" ", "")
    t = t.removesuffix("%").removesuffix("\\%")
    if not t:
        return None
    try:
        return Fraction(t)
    except (ValueError, ZeroDivisionError):
        return None


def _last_number(text: str) -> str | None:
    found = _NUMBER.findall(text)
    return found[-1] if found else None


def gsm8k_reference(answer: Any) -> str:
    """The final answer of a GSM8K solution text (after its last ``####``)."""
    text = str(answer)
    return text.rsplit("####", 1)[1].strip() if "####" in text else text.strip()


def gsm8k_extract(response: str) -> str | None:
    """The answer a response gives: after its last ``####``, else its last ``\\boxed{}``,
    else its last number."""
    if "####" in response:
        tail = response.rsplit("####", 1)[1]
        return _last_number(tail.split("\n", 1)[0]) or _last_number(tail)
    boxed = last_boxed(response)
    if boxed is not None:
        return boxed
    return _last_number(response)


def gsm8k(prompt: str, response: str, answer: Any, row: Any = None) -> float:
    got = gsm8k_extract(response)
    if got is None:
        return 0.0
    want = gsm8k_reference(answer)
    a, b = parse_number(got), parse_number(want)
    if a is not None and b is not None:
        return 1.0 if a == b else 0.0
    return 1.0 if got.strip() == want.strip() else 0.0


def math(prompt: str, response: str, answer: Any, row: Any = None) -> float:
    got = last_boxed(response)
    if got is None:
        return 0.0
    text = str(answer)
    want = last_boxed(text)
    return 1.0 if equivalent(got, text if want is None else want) else 0.0


def exact(prompt: str, response: str, answer: Any, row: Any = None) -> float:
    return 1.0 if response.strip() == str(answer).strip() else 0.0


SCORERS: dict[str, Callable[..., float]] = {"gsm8k": gsm8k, "math": math, "exact": exact}

__all__ = ["SCORERS", "as_number", "exact", "gsm8k", "math", "parse_number"]
