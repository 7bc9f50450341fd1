"""Rank 0's rows of a step beyond ``/steps``: its metrics (losses, KL, reward-model score,
reward failures), its batch (rows taken, every response's reward), its logged responses and its
validation — from rank 0's step results (``r0``: :func:`nereus.runtime.worker.step.learn_step`,
:mod:`nereus.runtime.worker.validation`). Tables: docs/log_schema.md (schema version 3)."""

from __future__ import annotations

import math
from typing import Any

from nereus.log.writer import RunLogWriter


def _metric(log: RunLogWriter, step: int, name: str, value: float) -> None:
    log.log_row("metrics", {"step": step, "name": name, "value": float(value)})


def record_batch(log: RunLogWriter, step: int, r0: dict[str, Any], reward_model: bool) -> None:
    """The step's metrics, batch, samples and validation rows (buffered; the step's flush
    writes them before its ``/steps`` row)."""
    for name, loss in sorted(r0.get("losses", {}).items()):
        _metric(log, step, f"loss/{name}", loss)
    if math.isfinite(r0.get("kl", math.nan)):
        _metric(log, step, "kl", r0["kl"])
    if reward_model:
        _metric(log, step, "reward/model_score", r0.get("rm_score", math.nan))
    batch = r0.get("batch")
    if batch:
        _metric(log, step, "reward/errors", batch["errors"])
        log.log_row("batches", {"step": step, "epoch": batch["epoch"],
                                "position": batch["position"], "errors": batch["errors"],
                                "rows": batch["rows"], "rewards": batch["rewards"]})
    for s in r0.get("samples", []):
        log.log_row("samples", {"step": step, "seq": s["seq"], "row": s["row"],
                                "reward": s["reward"], "response": s["response"]})
    val = r0.get("val")
    if val:
        log.log_row("validation", {"step": step, **val})
