"""Scoring a batch of responses with ``reward.fn`` on the ranks, and what a failure does.

The sequences of a batch are dealt round-robin to the ranks (sequence ``i`` to rank ``i mod
world``): each scores its share, and one MPI all-gather gives every rank every score and every
failure, so every rank reaches the same verdict at the same point — a failing function ends the
run on every rank with the same one line (never one rank waiting for another), whichever rank
called it. A value is a failure when the function raises, or returns something that is not a
real number (a string, None, a list) or is not finite. With ``reward.on_error: fail`` (default)
the first failure, by sequence, ends the run: :class:`RewardError` names the function, the
sequence's row in its file and the step; with ``zero`` a failed response scores 0 and is counted
(``errors``).

Before a run starts, :func:`probe` calls the function once, on the first row with an empty
response (a response a policy can always give): a function that fails there is a one-line
config error, exit 2, before any rank starts or anything is written.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from nereus.config.data import RewardOptions
from nereus.errors import ConfigError, NereusError, shown


class RewardError(NereusError):
    """``reward.fn`` failed on a response (``reward.on_error: fail``)."""


@dataclass(frozen=True)
class ScoreItem:
    """One response to score: the prompt's text, the decoded response, the reference answer,
    the whole row, and where the row is (``"data.train row 17"``)."""

    prompt: str
    response: str
    answer: Any
    row: dict[str, Any]
    where: str


@dataclass(frozen=True)
class Scores:
    values: list[float]  # per item, in order
    errors: int  # items scored 0 after a failure (on_error: zero)
    first_error: str  # the first failure's description, or ""


def _value(raw: Any) -> float:
    """``raw`` as a float; ValueError when it is not a finite real number."""
    if isinstance(raw, (str, bytes)) or not isinstance(raw, numbers.Real):
        raise ValueError(f"returned {shown(raw)} (a {type(raw).__name__}); it must return a "
                         "number")
    value = float(raw)
    if not math.isfinite(value):
        raise ValueError(f"returned {value}; it must return a finite number")
    return value


def score_one(fn: Callable[..., Any], item: ScoreItem) -> tuple[float, str]:
    """(score, "") or (0.0, what went wrong)."""
    try:
        raw = fn(item.prompt, item.response, item.answer, item.row)
    except Exception as e:  # the user's function: anything it raises is a failure
        return 0.0, f"raised {_exc(e)}"
    try:
        return _value(raw), ""
    except ValueError as e:
        return 0.0, str(e)


def _exc(e: BaseException) -> str:
    text = (str(e).strip().splitlines() or [""])[0][:200]
    return f"{type(e).__name__}({text!r})" if text else type(e).__name__


class Scorer:
    """``reward.fn`` with its failure policy."""

    def __init__(self, fn: Callable[..., Any], options: RewardOptions) -> None:
        self.fn = fn
        self.options = options

    def describe(self, where: str, what: str) -> str:
        hint = ("" if self.options.on_error == "zero" else
                "; reward.on_error: zero scores such a response 0 instead")
        return f"reward.fn={self.options.fn!r} {what} on {where}{hint}"

    def local(self, item_of: Callable[[int], ScoreItem], mine: Sequence[int]) -> dict[str, Any]:
        """Scores of the items ``mine`` (this rank's share; ``item_of(i)`` builds item ``i``):
        plain data for the all-gather."""
        out: dict[str, Any] = {"i": [], "v": [], "e": []}
        for i in mine:
            item = item_of(i)
            value, err = score_one(self.fn, item)
            out["i"].append(int(i))
            out["v"].append(value)
            if err:
                out["e"].append([int(i), self.describe(item.where, err)])
        return out

    def combine(self, n: int, parts: Sequence[dict[str, Any]]) -> Scores:
        """Every rank's share together; raises :class:`RewardError` on a failure with
        ``on_error: fail`` (the same on every rank: the first failure by item)."""
        values = [0.0] * n
        errors: list[tuple[int, str]] = []
        for part in parts:
            for i, v in zip(part.get("i", []), part.get("v", []), strict=True):
                values[int(i)] = float(v)
            errors.extend((int(i), str(msg)) for i, msg in part.get("e", []))
        errors.sort()
        if errors and self.options.on_error == "fail":
            raise RewardError(errors[0][1])
        return Scores(values, len(errors), errors[0][1] if errors else "")

    def score(self, n: int, item_of: Callable[[int], ScoreItem], comm: Any = None,
              tag: str = "rewards") -> Scores:
        """Score items ``0 .. n-1``: shared out over ``comm``'s ranks (None: all here)."""
        if comm is None or comm.Get_size() == 1:
            return self.combine(n, [self.local(item_of, range(n))])
        from nereus.runtime.mpi.frames import allgather

        rank, world = comm.Get_rank(), comm.Get_size()
        return self.combine(n, allgather(comm, self.local(item_of, range(rank, n, world)), tag))


def probe(scorer: Scorer, item: ScoreItem) -> None:
    """Call the function once before the run (an empty response to the first row): a failure
    is a ``ConfigError`` naming ``reward.fn`` — unless ``on_error: zero`` forgives exceptions;
    a value of the wrong type is refused either way."""
    value, err = score_one(scorer.fn, item)
    del value
    if not err:
        return
    if err.startswith("raised") and scorer.options.on_error == "zero":
        return
    raise ConfigError("reward.fn", scorer.options.fn,
                      f"{err} when called on {item.where} with an empty response")
