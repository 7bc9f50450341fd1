"""MATH answers: the last ``\\boxed{}`` of a solution and the usual normalisation of the MATH
benchmark's equivalence check (Hendrycks et al. 2021), written here. Pure.

Normalisation: line breaks, ``\\!``, ``\\,``, ``\\;`` and spaces removed; ``\\left``/``\\right``,
degrees (``^\\circ``), dollars, percent signs and a trailing ``\\text{ unit}`` dropped;
``\\dfrac``/``\\tfrac`` → ``\\frac``; ``\\frac12`` → ``\\frac{1}{2}``, ``\\sqrt2`` →
``\\sqrt{2}``; ``a/b`` of two integers → ``\\frac{a}{b}``; a leading ``.5`` → ``0.5``;
``x = 5`` → ``5`` when the left side is a short name; ``\\text{...}`` around a whole answer
unwrapped. Two answers are equivalent when their normal forms are equal, or both are numbers
(integers, decimals, ``\\frac{a}{b}``, with thousands separators) of equal value.
"""

from __future__ import annotations

import re
from fractions import Fraction

_BOX_NAMES = ("\\boxed", "\\fbox")


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (or ``\\fbox{}``, ``\\boxed 5``) in ``text``,
    braces nested; None when there is none or it is not closed."""
    start = max(text.rfind(name) for name in _BOX_NAMES)
    if start < 0:
        return None
    name = next(n for n in _BOX_NAMES if text.startswith(n, start))
    i = start + len(name)
    if i < len(text) and text[i] == " ":  # \boxed 5: up to the next $ or space
        rest = text[i + 1:]
        return re.split(r"[\s$]", rest, maxsplit=1)[0] or None
    if i >= len(text) or text[i] != "{":
        return None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1:j]
    return None


def _fix_fracs(s: str) -> str:
    """``\\frac12`` → ``\\frac{1}{2}``, ``\\frac1{b}`` → ``\\frac{1}{b}``."""
    parts = s.split("\\frac")
    out = parts[0]
    for part in parts[1:]:
        out += "\\frac"
        if part.startswith("{") or len(part) < 2:
            out += part
            continue
        a, b, rest = part[0], part[1], part[2:]
        if b == "{":
            out += "{" + a + "}" + b + rest
        else:
            out += "{" + a + "}{" + b + "}" + rest
    return out


def _fix_sqrt(s: str) -> str:
    return re.sub(r"\\sqrt(\w)", r"\\sqrt{\1}", s)


def _fix_slash(s: str) -> str:
    m = re.fullmatch(r"(-?\d+)/(\d+)", s)
    return f"\\frac{{{m.group(1)}}}{{{m.group(2)}}}" if m else s


def _drop_units(s: str) -> str:
    if "\\text{ " in s:
        return s.split("\\text{ ")[0]
    return s


def _unwrap_text(s: str) -> str:
    m = re.fullmatch(r"\\(?:text|textbf|mathrm|mbox)\{(.*)\}", s)
    return m.group(1) if m else s


def normalize(answer: str) -> str:
    """The normal form of a MATH answer (see the module's docstring)."""
    s = answer.strip()
    s = s.replace("\n", "").replace("\\!", "").replace("\\,", "").replace("\\;", "")
    s = s.replace("\\\\", "\\")
    s = s.replace("tfrac", "frac").replace("dfrac", "frac")
    s = s.replace("\\left", "").replace("\\right", "")
    s = s.replace("^{\\circ}", "").replace("^\\circ", "")
    s = s.replace("\\$", "").replace("$", "")
    s = _drop_units(s)
    s = s.replace("\\%", "").replace("%", "")
    s = s.replace(" .", " 0.").replace("{.", "{0.")
    s = s.strip().rstrip(".")
    if not s:
        return s
    if s[0] == ".":
        s = "0" + s
    sides = s.split("=")
    if len(sides) == 2 and len(sides[0].strip()) <= 2:
        s = sides[1]
    s = _fix_sqrt(s)
    s = s.replace(" ", "")
    s = _unwrap_text(s)
    s = _fix_fracs(s)
    if s == "0.5":
        s = "\\frac{1}{2}"
    return _fix_slash(s)


def as_number(s: str) -> Fraction | None:
    """The value of a normalised answer that is one number: ``-12``, ``1,000``, ``0.25``,
    ``\\frac{3}{4}``, ``-\\frac{1}{2}``; None otherwise."""
    t = s.replace(",", "") if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", s) else s
    m = re.fullmatch(r"(-?)\\frac\{(-?\d+)\}\{(\d+)\}", t)
    try:
        if m:
            value = Fraction(int(m.group(2)), int(m.group(3)))
            return -value if m.group(1) else value
        if re.fullmatch(r"-?(\d+(\.\d*)?|\.\d+)", t):
            return Fraction(t)
    except ZeroDivisionError:
        return None
    return None


def equivalent(a: str, b: str) -> bool:
    """Whether two MATH answers are the same after normalisation."""
    na, nb = normalize(a), normalize(b)
    if na == nb:
        return True
    va, vb = as_number(na), as_number(nb)
    return va is not None and vb is not None and va == vb
