"""The scalars of a run log, as TensorBoard and wandb show them: one function from a log row to
its ``(tag, step, value)`` triples, used both live (rank 0, as each row is logged) and by ``nereus
report --tensorboard`` on a finished log — so the two give the same scalars, and both equal the
log's columns. Pure.

| table | tags (step: the row's step unless said) |
|---|---|
| steps | ``reward/mean``, ``length/mean``, ``length/p95``, ``tokens``, ``time/step_s``, ``time/stage_s/<model-stage>``, ``plan/version``, ``plan/pool_gpus`` |
| metrics | the metric's name: ``loss/<model-stage>``, ``kl``, ``reward/model_score``, ``reward/errors`` |
| transitions | ``transition/measured_s``, ``transition/predicted_s``, ``transition/bytes``; ``plan/<model-stage>/{dp,tp,pp}`` of the new plan at step + 1 |
| (initial plan) | ``plan/<model-stage>/{dp,tp,pp}`` at step 0 |
| stage_times | ``calibration/error/<model-stage>``: predicted / measured − 1 |
| validation | ``val/reward``, ``val/pass@1``, ``val/length``, ``val/sampled_reward``, ``val/sampled_pass@1``, ``val/pass@k`` |

Values that are not finite (a NaN reward of a stopped step, validation without samples) are
left out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

Scalar = tuple[str, int, float]

_STEPS = (("reward", "reward/mean"), ("gen_len_mean", "length/mean"),
          ("gen_len_p95", "length/p95"), ("tokens", "tokens"), ("step_s", "time/step_s"),
          ("plan_version", "plan/version"), ("pool_gpus", "plan/pool_gpus"))
_VALIDATION = (("reward", "val/reward"), ("pass_at_1", "val/pass@1"), ("len_mean", "val/length"),
               ("sampled_reward", "val/sampled_reward"),
               ("sampled_pass_at_1", "val/sampled_pass@1"), ("pass_at_k", "val/pass@k"))
_TRANSITIONS = (("measured_s", "transition/measured_s"),
                ("predicted_s", "transition/predicted_s"), ("transfer_bytes", "transition/bytes"))


def _text(value: Any) -> str:
    return value.decode("ascii") if isinstance(value, bytes) else str(value)


def plan_scalars(plan: Mapping[str, Any] | None, step: int) -> list[Scalar]:
    """``plan/<model-stage>/{dp,tp,pp}`` of a plan (``ExecutionPlan.to_dict()``)."""
    if not plan:
        return []
    return [(f"plan/{sp['name']}/{k}", step, float(sp[k])) for sp in plan.get("stages", [])
            for k in ("dp", "tp", "pp")]


def scalars(table: str, row: Mapping[str, Any]) -> list[Scalar]:
    """The scalars of one row of ``table`` (``row``: column → value, json columns decoded)."""
    step = int(row["step"])
    out: list[Scalar] = []
    if table == "steps":
        out = [(tag, step, float(row[col])) for col, tag in _STEPS]
        out += [(f"time/stage_s/{k}", step, float(v))
                for k, v in sorted((row.get("stage_s") or {}).items())]
    elif table == "metrics":
        out = [(_text(row["name"]), step, float(row["value"]))]
    elif table == "transitions":
        out = [(tag, step, float(row[col])) for col, tag in _TRANSITIONS]
        out += plan_scalars(row.get("plan"), step + 1)
    elif table == "stage_times":
        measured, predicted = float(row["measured_s"]), float(row["predicted_s"])
        if measured > 0:
            out = [(f"calibration/error/{_text(row['model_stage'])}", step,
                    predicted / measured - 1.0)]
    elif table == "validation":
        out = [(tag, step, float(row[col])) for col, tag in _VALIDATION]
    return [s for s in out if math.isfinite(s[2])]
