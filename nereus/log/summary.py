"""Summary of a run log as plain data (for ``nereus report --json``) and as text."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import numpy as np

from nereus.log.reader import RunLog


def _num(x: float) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def describe_plan(plan: Any) -> str:
    """``stage tp x pp x dp`` per stage of a plan dict (``ExecutionPlan.to_dict``), else short text."""
    if isinstance(plan, dict) and isinstance(plan.get("stages"), list):
        parts = []
        for s in plan["stages"]:
            if isinstance(s, dict) and {"name", "tp", "pp", "dp"} <= s.keys():
                parts.append(f"{s['name']} {s['tp']}x{s['pp']}x{s['dp']}")
        if parts:
            return ", ".join(parts) + " (tp x pp x dp)"
    if plan is None:
        return "(not recorded)"
    text = str(plan)
    return text if len(text) <= 80 else text[:77] + "..."


def plan_segments(log: RunLog) -> list[dict[str, Any]]:
    """Runs of consecutive logged steps under one plan version: first/last step, plan."""
    steps = log.steps
    plans: dict[int, Any] = {0: log.initial_plan}
    for k, plan in enumerate(log.tables["transitions"]["plan"], start=1):
        plans[k] = plan
    segments: list[dict[str, Any]] = []
    for step, version in zip(steps["step"].tolist(), steps["plan_version"].tolist(), strict=True):
        if segments and segments[-1]["plan_version"] == version:
            segments[-1]["last_step"] = step
            segments[-1]["steps"] += 1
        else:
            segments.append(
                {
                    "plan_version": version,
                    "first_step": step,
                    "last_step": step,
                    "steps": 1,
                    "plan": plans.get(version),
                }
            )
    return segments


def summarize(log: RunLog) -> dict[str, Any]:
    """Counts, step-time statistics, transitions and their share of run time, admissions, events."""
    steps = log.steps
    step_s = np.asarray(steps["step_s"], dtype=float)
    trans = log.tables["transitions"]
    trans_s = float(np.nansum(trans["measured_s"])) if trans["step"].size else 0.0
    steps_total_s = float(np.nansum(step_s)) if step_s.size else 0.0
    run_s = steps_total_s + trans_s
    adm = log.tables["admissions"]
    admissions: dict[str, dict[str, int]] = {}
    for path, admitted in zip(adm["path"].tolist(), adm["admitted"].tolist(), strict=True):
        entry = admissions.setdefault(path, {"admitted": 0, "rejected": 0})
        entry["admitted" if admitted else "rejected"] += 1
    efficiencies: dict[str, float] = {}
    eff = log.tables["efficiencies"]
    for hw, op, e in zip(
        eff["hardware"].tolist(), eff["op_class"].tolist(), eff["efficiency"].tolist(), strict=True
    ):
        efficiencies[f"{hw}/{op}"] = float(e)  # later rows replace earlier ones
    segments = plan_segments(log)
    return {
        "path": log.path,
        "schema_version": log.schema_version,
        "nereus_version": log.nereus_version,
        "run_meta": {k: v for k, v in log.run_meta.items() if k != "fingerprint"},
        "fingerprints": job_fingerprints(log),
        "closed": log.closed,
        "dropped_rows": {k: v for k, v in log.dropped_rows.items() if v},
        "steps": int(step_s.size),
        "first_step": int(steps["step"][0]) if step_s.size else None,
        "last_step": int(steps["step"][-1]) if step_s.size else None,
        "mean_step_s": _num(float(np.nanmean(step_s))) if step_s.size else None,
        "median_step_s": _num(float(np.nanmedian(step_s))) if step_s.size else None,
        "steps_total_s": steps_total_s,
        "transitions": int(trans["step"].size),
        "transition_s": trans_s,
        "transition_predicted_s": float(np.nansum(trans["predicted_s"]))
        if trans["step"].size
        else 0.0,
        "transfer_bytes": int(np.sum(trans["transfer_bytes"])) if trans["step"].size else 0,
        "transition_share": trans_s / run_s if run_s > 0 else 0.0,
        "replans": int(log.rows("replans")),
        "replan_triggers": dict(Counter(log.tables["replans"]["trigger"].tolist())),
        "admissions": admissions,
        "events": dict(Counter(log.events["kind"].tolist())),
        "calibration_samples": int(log.rows("calibration_samples")),
        "stage_time_error": _stage_error(log),
        "efficiency_updates": int(log.rows("efficiencies")),
        "efficiencies": efficiencies,
        "plan_timeline": [
            {k: v for k, v in seg.items() if k != "plan"} | {"plan": describe_plan(seg["plan"])}
            for seg in segments
        ],
    }


def job_fingerprints(log: RunLog) -> list[dict[str, Any]]:
    """The job fingerprint (:mod:`nereus.config.fingerprint`) each run segment recorded in its
    ``run-start`` event, in order: ``{"segment", "digest", "summary"}`` (digest None: the
    segment recorded none, or one that does not match its parts)."""
    from nereus.config.fingerprint import Fingerprint

    out: list[dict[str, Any]] = []
    kinds, details = log.events["kind"].tolist(), log.events["detail"].tolist()
    for kind, detail in zip(kinds, details, strict=True):
        if kind != "run-start":
            continue
        raw = detail.get("fingerprint") if isinstance(detail, dict) else None
        fp = Fingerprint.from_dict(raw) if raw is not None else None
        out.append({"segment": len(out), "digest": fp.digest if fp else None,
                    "summary": fp.summary() if fp else ("malformed" if raw else "none")})
    return out


def _fingerprint_line(fps: list[dict[str, Any]]) -> str | None:
    if not fps or all(f["digest"] is None and f["summary"] == "none" for f in fps):
        return None
    if len({f["digest"] for f in fps}) == 1:
        return f"job fingerprint: {fps[0]['summary']} (every one of {len(fps)} segment(s))"
    return "job fingerprints DIFFER across segments: " + "; ".join(
        f"segment {f['segment']}: {f['summary']}" for f in fps)


def _stage_error(log: RunLog) -> dict[str, Any]:
    """Mean absolute percentage error of the model-stage time predictions, per step."""
    t = log.tables["stage_times"]
    if t["step"].size == 0:
        return {}
    err = np.abs(t["predicted_s"] - t["measured_s"]) / np.maximum(t["measured_s"], 1e-12)
    per_step = {int(s): 100.0 * float(np.mean(err[t["step"] == s])) for s in np.unique(t["step"])}
    return {"mape_pct": 100.0 * float(np.mean(err)), "per_step_mape_pct": per_step}


def _fmt_s(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f} s"


def format_summary(s: dict[str, Any]) -> str:
    lines = [f"run log {s['path']} (schema {s['schema_version']}, nereus {s['nereus_version']})"]
    if s["run_meta"]:
        meta = ", ".join(f"{k}={v}" for k, v in list(s["run_meta"].items())[:8])
        lines.append(f"run: {meta}")
    job = _fingerprint_line(s.get("fingerprints", []))
    if job:
        lines.append(job)
    if s["closed"]:
        lines.append("writer: closed the file")
    else:
        lines.append("writer: did not close the file (still running, or killed)")
    if s["dropped_rows"]:
        dropped = ", ".join(f"{k} {v}" for k, v in s["dropped_rows"].items())
        lines.append(f"unflushed rows dropped: {dropped}")
    if s["steps"]:
        lines.append(
            f"steps: {s['steps']} (step {s['first_step']}..{s['last_step']}); "
            f"mean {_fmt_s(s['mean_step_s'])}, median {_fmt_s(s['median_step_s'])}, "
            f"total {s['steps_total_s']:.1f} s"
        )
    else:
        lines.append("steps: 0")
    lines.append(
        f"transitions: {s['transitions']}, {s['transition_s']:.3f} s measured "
        f"({s['transition_predicted_s']:.3f} s predicted), "
        f"{s['transfer_bytes'] / 1e9:.3f} GB moved, "
        f"{100 * s['transition_share']:.3f}% of run time (steps + transitions)"
    )
    triggers = ", ".join(f"{k} {v}" for k, v in sorted(s["replan_triggers"].items())) or "none"
    lines.append(f"replans: {s['replans']} (triggers: {triggers})")
    if s["admissions"]:
        adm = "; ".join(
            f"{path} {c['admitted']} admitted / {c['rejected']} rejected"
            for path, c in sorted(s["admissions"].items())
        )
    else:
        adm = "none"
    lines.append(f"admissions: {adm}")
    events = ", ".join(f"{k} {v}" for k, v in sorted(s["events"].items())) or "none"
    lines.append(f"events: {events}")
    if s.get("stage_time_error"):
        per = s["stage_time_error"]["per_step_mape_pct"]
        lines.append(
            f"stage-time prediction error (MAPE): {s['stage_time_error']['mape_pct']:.1f}% over "
            f"the run; per step " + " ".join(f"{v:.0f}%" for _, v in sorted(per.items())))
    lines.append(
        f"calibration: {s['calibration_samples']} samples, {s['efficiency_updates']} efficiency "
        f"updates of {len(s['efficiencies'])} (hardware, op class)"
        + (
            " (latest: "
            + ", ".join(f"{k} {v:.3f}" for k, v in sorted(s["efficiencies"].items())[:6])
            + ")"
            if s["efficiencies"]
            else ""
        )
    )
    lines.append("plan timeline:")
    if not s["plan_timeline"]:
        lines.append("  (no steps)")
    for seg in s["plan_timeline"]:
        lines.append(
            f"  steps {seg['first_step']}..{seg['last_step']} ({seg['steps']}): "
            f"plan {seg['plan_version']}: {seg['plan']}"
        )
    return "\n".join(lines)
