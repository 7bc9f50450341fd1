"""GPU-availability and generated-length traces for the simulator.

Formats:
- spot traces (skypilot-org/spot-traces): ``{"metadata": {"gap_seconds": G}, "data": [n0, n1, ...]}``
  — available nodes per tick of G seconds;
- fault traces (stepfun-ai/InfiniteHBD-Trace): a list of ``{"node_id", "event_time" (days),
  "event_type": "fault_start" | "fault_end", "fault_type": {...}}``;
- length traces: CSV with header ``step,mean,p95`` (generated tokens per response).

Every malformed input raises ConfigError naming the file, the field (or row), the value and the
rule. A trace is a regular file of at most ``MAX_TRACE_BYTES``; its numbers are bounded
(:mod:`nereus.config.limits`: node counts by ``MAX_GPUS``, a spot tick by ``MAX_TICK_S``, a fault
time by ``MAX_TRACE_DAYS``, steps by ``MAX_STEPS``, lengths by ``MAX_TOKENS``).
"""

from __future__ import annotations

import csv
import itertools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nereus.config import files, limits
from nereus.errors import ConfigError

REBASE_LEAD_S = 60.0  # a rebased fault trace's first event, seconds into the run


@dataclass(frozen=True)
class GpuTrace:
    """Available GPUs over wall-clock time: ``gpus[i]`` holds from ``times_s[i]`` on."""

    times_s: tuple[float, ...]
    gpus: tuple[int, ...]

    def at(self, t_s: float) -> int:
        lo, hi = 0, len(self.times_s) - 1
        if t_s <= self.times_s[0]:
            return self.gpus[0]
        while lo < hi:  # last index with times_s[i] <= t_s
            mid = (lo + hi + 1) // 2
            if self.times_s[mid] <= t_s:
                lo = mid
            else:
                hi = mid - 1
        return self.gpus[lo]

    @property
    def changes(self) -> int:
        return sum(1 for a, b in zip(self.gpus, self.gpus[1:], strict=False) if a != b)


@dataclass(frozen=True)
class LengthPoint:
    step: int
    mean: float
    p95: float


@dataclass(frozen=True)
class LengthTrace:
    points: tuple[LengthPoint, ...]

    def at(self, step: int) -> LengthPoint:
        """Linear interpolation between points; constant beyond both ends."""
        pts = self.points
        if step <= pts[0].step:
            return LengthPoint(step, pts[0].mean, pts[0].p95)
        for a, b in itertools.pairwise(pts):
            if a.step <= step <= b.step:
                f = (step - a.step) / (b.step - a.step)
                return LengthPoint(step, a.mean + f * (b.mean - a.mean), a.p95 + f * (b.p95 - a.p95))
        return LengthPoint(step, pts[-1].mean, pts[-1].p95)


def read_trace_json(path: str | Path, field: str = "trace") -> Any:
    """The parsed JSON of a trace file (a regular file of at most ``MAX_TRACE_BYTES``)."""
    p = str(path)
    return files.parse_json(files.read_text(p, field, "trace file", "MAX_TRACE_BYTES"), field, p)


def load_spot_trace(
    path: str | Path, gpus_per_node: int, max_gpus: int | None = None, time_scale: float = 1.0
) -> GpuTrace:
    """Available GPUs from a spot trace: nodes per tick × ``gpus_per_node``, capped at ``max_gpus``;
    tick times multiplied by ``time_scale`` (< 1 compresses the trace). The trace starts with the
    run."""
    return spot_trace(read_trace_json(path), Path(path), gpus_per_node, max_gpus,
                      time_scale)


def spot_trace(d: Any, p: Path, gpus_per_node: int, max_gpus: int | None = None,
               time_scale: float = 1.0) -> GpuTrace:
    """:func:`load_spot_trace` of the already-parsed document ``d`` of file ``p``."""
    if not isinstance(d, dict) or "data" not in d or "metadata" not in d:
        raise ConfigError(f"{p}", type(d).__name__, 'must be an object with "metadata" and "data"')
    gap = d["metadata"].get("gap_seconds") if isinstance(d["metadata"], dict) else None
    if (isinstance(gap, bool) or not isinstance(gap, (int, float)) or not 0 < gap <= limits.MAX_TICK_S):
        raise ConfigError(f"{p}: metadata.gap_seconds", gap, "must be a positive number of "
                          f"seconds, at most {limits.named('MAX_TICK_S', limits.MAX_TICK_S)}")
    data = d["data"]
    if not isinstance(data, list) or not data:
        raise ConfigError(f"{p}: data", type(data).__name__, "must be a non-empty list")
    gpus = []
    for i, n in enumerate(data):
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= limits.MAX_GPUS:
            raise ConfigError(f"{p}: data[{i}]", n, "must be a non-negative integer node count, "
                              f"at most {limits.named('MAX_GPUS', limits.MAX_GPUS)}")
        g = n * gpus_per_node
        gpus.append(min(g, max_gpus) if max_gpus is not None else g)
    _check_scale(time_scale)
    return GpuTrace(tuple(float(i * gap) * time_scale for i in range(len(gpus))), tuple(gpus))


def _check_scale(time_scale: float) -> None:
    if isinstance(time_scale, bool) or not isinstance(time_scale, (int, float)) or not (
        math.isfinite(time_scale) and time_scale > 0
    ):
        raise ConfigError("--trace-time-scale", time_scale, "must be a number > 0")


def load_fault_trace(
    path: str | Path, num_nodes: int, gpus_per_node: int, time_scale: float = 1.0,
    rebase: bool = True,
) -> GpuTrace:
    """Available GPUs of a ``num_nodes`` cluster under a fault trace.

    The first ``num_nodes`` distinct node ids of the trace (in order of first appearance) are our
    nodes; a node is unavailable between its fault_start and fault_end. Times are trace days
    converted to seconds and multiplied by ``time_scale`` (< 1 compresses the trace). With
    ``rebase`` (the default) the trace is shifted so that its first event falls
    ``REBASE_LEAD_S`` after the run's start (on the full pool): the raw trace begins months into
    the cluster's life, far beyond any simulated run.
    """
    return fault_trace(read_trace_json(path), Path(path), num_nodes, gpus_per_node,
                       time_scale, rebase)


def fault_trace(
    d: Any, p: Path, num_nodes: int, gpus_per_node: int, time_scale: float = 1.0,
    rebase: bool = True,
) -> GpuTrace:
    """:func:`load_fault_trace` of the already-parsed document ``d`` of file ``p``."""
    _check_scale(time_scale)
    if not isinstance(d, list):
        raise ConfigError(f"{p}", type(d).__name__, "must be a list of fault events")
    nodes: dict[str, int] = {}
    events: list[tuple[float, int, int]] = []
    for i, ev in enumerate(d):
        if not isinstance(ev, dict):
            raise ConfigError(f"{p}: [{i}]", type(ev).__name__, "must be an object")
        for key in ("node_id", "event_time", "event_type"):
            if key not in ev:
                raise ConfigError(f"{p}: [{i}].{key}", None, "is required")
        t = ev["event_time"]
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t <= limits.MAX_TRACE_DAYS:
            raise ConfigError(f"{p}: [{i}].event_time", t, "must be a non-negative number of days, "
                              f"at most {limits.named('MAX_TRACE_DAYS', limits.MAX_TRACE_DAYS)}")
        kind = ev["event_type"]
        if kind not in ("fault_start", "fault_end"):
            raise ConfigError(f"{p}: [{i}].event_type", kind, "must be fault_start or fault_end")
        nid = str(ev["node_id"])
        if nid not in nodes:
            if len(nodes) >= num_nodes:
                continue
            nodes[nid] = len(nodes)
        t_s = float(t) * 86400.0 * time_scale
        events.append((t_s, nodes[nid], 1 if kind == "fault_start" else -1))
    events.sort()
    if rebase and events:
        t0 = events[0][0] - REBASE_LEAD_S
        events = [(t - t0, n, dlt) for t, n, dlt in events]
    down: dict[int, int] = {}  # node → open faults
    n_down = 0  # nodes with at least one open fault
    times = [0.0]
    gpus = [num_nodes * gpus_per_node]
    for t_s, node, delta in events:
        before = down.get(node, 0)
        down[node] = max(0, before + delta)
        n_down += (down[node] > 0) - (before > 0)
        avail = num_nodes - n_down
        if t_s == times[-1]:
            gpus[-1] = avail * gpus_per_node
        else:
            times.append(t_s)
            gpus.append(avail * gpus_per_node)
    return GpuTrace(tuple(times), tuple(gpus))


def load_length_trace(path: str | Path) -> LengthTrace:
    p = Path(path)
    text = files.read_text(str(p), "length trace", "CSV file", "MAX_TRACE_BYTES")
    try:
        rows = list(csv.reader(text.splitlines()))
    except csv.Error as exc:  # e.g. a field past csv's size limit, a NUL
        raise ConfigError(f"{p}", "CSV", f"cannot be read as CSV ({exc})") from None
    if not rows or [c.strip() for c in rows[0]] != ["step", "mean", "p95"]:
        raise ConfigError(f"{p}: header", rows[0] if rows else "", "must be step,mean,p95")
    points: list[LengthPoint] = []
    for line_no, row in enumerate(rows[1:], start=2):
        if not row:
            continue
        if len(row) != 3:
            raise ConfigError(f"{p}: line {line_no}", ",".join(row), "must have 3 columns step,mean,p95")
        try:
            step, mean, p95 = int(row[0]), float(row[1]), float(row[2])
        except ValueError:
            raise ConfigError(f"{p}: line {line_no}", ",".join(row), "must be an integer step and two numbers") from None
        if not (0 <= step <= limits.MAX_STEPS and 0 < mean <= p95 <= limits.MAX_TOKENS):
            raise ConfigError(f"{p}: line {line_no}", ",".join(row), "needs 0 <= step <= "
                              f"{limits.MAX_STEPS:,} (MAX_STEPS) and 0 < mean <= p95 <= "
                              f"{limits.MAX_TOKENS:,} tokens (MAX_TOKENS)")
        if points and step <= points[-1].step:
            raise ConfigError(f"{p}: line {line_no}", step, "steps must increase")
        points.append(LengthPoint(step, mean, p95))
    if not points:
        raise ConfigError(f"{p}", "no rows", "needs at least one step,mean,p95 row")
    return LengthTrace(tuple(points))


def paper_length_trace(kind: str) -> LengthTrace:
    """Length growth built from the Nereus paper's published points (no public per-step series
    exists): ``"25-step"`` mean 1,147.5 → 3,722 tokens (p95 1,339 → 4,072) over 25 steps;
    ``"1000-step"`` mean 500 → 8,000 over 1,000 steps (p95 taken as 1.1 × mean). Linear between
    the endpoints."""
    if kind == "25-step":
        return LengthTrace((LengthPoint(0, 1147.5, 1339.0), LengthPoint(24, 3722.0, 4072.0)))
    if kind == "1000-step":
        return LengthTrace((LengthPoint(0, 500.0, 550.0), LengthPoint(999, 8000.0, 8800.0)))
    raise ConfigError("length trace", kind, "built-in traces are 25-step and 1000-step")


def write_length_trace(trace: LengthTrace, steps: int) -> str:
    """CSV text of ``trace`` sampled at every step (for users and for `nereus simulate`)."""
    lines = ["step,mean,p95"]
    for s in range(steps):
        pt = trace.at(s)
        lines.append(f"{s},{pt.mean:.1f},{pt.p95:.1f}")
    return "\n".join(lines) + "\n"
