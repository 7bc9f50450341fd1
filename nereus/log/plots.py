"""PNG plots of a run log (matplotlib, Agg): step latency, plan timeline, GPU memory, transitions,
and each model-stage's predicted against measured time.

Every plot is written even when its data is empty (it then says so), so that a report directory
always holds the same four files.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from nereus.log.reader import RunLog
from nereus.log.summary import plan_segments

PLOT_FILES = ("step_latency.png", "plan_timeline.png", "gpu_memory.png", "transitions.png",
              "stage_times.png")
_DPI = 100
_MARGINS = {"left": 0.12, "right": 0.88, "bottom": 0.12, "top": 0.9, "wspace": 0.3}
_MAX_MEMORY_LINES = 16  # more GPUs than this: a heat map instead of one line per GPU
_MAX_HEAT_ROWS, _MAX_HEAT_COLUMNS = 1024, 2048  # cells of the heat map, at most


def _empty(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])


def _step_latency(plt: Any, log: RunLog) -> Any:
    fig, ax = plt.subplots(figsize=(8, 4))
    steps = log.steps
    if steps["step"].size == 0:
        _empty(ax, "no steps logged")
    else:
        ax.plot(steps["step"], steps["step_s"], marker=".", lw=1, label="step latency")
        ax.axhline(float(np.nanmedian(steps["step_s"])), color="gray", ls=":", label="median")
        for i, t in enumerate(log.tables["transitions"]["step"].tolist()):
            ax.axvline(
                t + 0.5, color="tab:red", ls="--", lw=0.8, label="transition" if i == 0 else None
            )
        ax.set_xlabel("step")
        ax.set_ylabel("step latency (s)")
        p95 = np.asarray(steps["gen_len_p95"], dtype=float)
        if np.isfinite(p95).any():
            ax2 = ax.twinx()
            ax2.plot(steps["step"], p95, color="tab:green", lw=0.8, alpha=0.7)
            ax2.set_ylabel("p95 generated length (tokens)", color="tab:green")
        ax.legend(loc="upper left", fontsize=8)
    ax.set_title("Step latency")
    return fig


def _plan_timeline(plt: Any, log: RunLog) -> Any:
    fig, (ax, ax_pool) = plt.subplots(2, 1, figsize=(9, 5), sharex=True, height_ratios=[3, 1])
    ax.set_title("Plan timeline (tp x pp x dp per model-stage; color = plan version)")
    segments = plan_segments(log)
    if not segments:
        _empty(ax, "no steps logged")
        _empty(ax_pool, "")
        return fig
    colors = plt.get_cmap("tab10")
    stage_names: list[str] = []
    for seg in segments:
        for name in _stages(seg["plan"]):
            if name not in stage_names:
                stage_names.append(name)
    rows = stage_names or ["plan"]
    for seg in segments:
        x0, width = seg["first_step"] - 0.5, seg["last_step"] - seg["first_step"] + 1
        color = colors(seg["plan_version"] % 10)
        stages = _stages(seg["plan"])
        for y, name in enumerate(rows):
            ax.broken_barh([(x0, width)], (y - 0.4, 0.8), facecolors=color, edgecolor="white")
            s = stages.get(name)
            label = f"{s.get('tp')}x{s.get('pp')}x{s.get('dp')}" if s else f"v{seg['plan_version']}"
            ax.text(x0 + width / 2, y, label, ha="center", va="center", fontsize=7, clip_on=True)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(rows)
    steps = log.steps
    ax_pool.step(steps["step"], steps["pool_gpus"], where="mid", color="black", lw=1)
    ax_pool.set_ylabel("GPU pool")
    ax_pool.set_xlabel("step")
    return fig


def _stages(plan: Any) -> dict[str, dict[str, Any]]:
    """Model-stage name -> stage dict of a plan in ``ExecutionPlan.to_dict`` form ({} otherwise)."""
    if not (isinstance(plan, dict) and isinstance(plan.get("stages"), list)):
        return {}
    return {str(s.get("name", "?")): s for s in plan["stages"] if isinstance(s, dict)}


def _cells(values: np.ndarray, lo: int, hi: int, most: int) -> tuple[int, np.ndarray]:
    """(cells, cell of each value): one cell per integer of [lo, hi], or ``most`` equal bins."""
    span = hi - lo + 1
    if span <= most:
        return span, np.asarray(values, dtype=np.int64) - lo
    frac = (np.asarray(values, dtype=float) - lo) / float(span)
    return most, np.clip((frac * most).astype(np.int64), 0, most - 1)


def _gpu_memory(plt: Any, log: RunLog) -> Any:
    fig, ax = plt.subplots(figsize=(8, 4))
    mem = log.tables["gpu_memory"]
    if mem["step"].size == 0:
        _empty(ax, "no GPU memory logged")
        ax.set_title("Peak memory per GPU")
        return fig
    gib = np.asarray(mem["peak_bytes"], dtype=float) / 2**30
    gpus = np.unique(mem["global_gpu"])
    if gpus.size <= _MAX_MEMORY_LINES:
        for g in gpus.tolist():
            sel = mem["global_gpu"] == g
            ax.plot(mem["step"][sel], gib[sel], marker=".", lw=1, label=f"GPU {g}")
        ax.legend(fontsize=7, ncol=2)
        ax.set_ylabel("peak memory (GiB)")
    else:
        # one cell per (GPU id, step) over their full ranges: absent GPUs and steps stay blank;
        # ranges wider than the image (a long run, sparse ids) share cells, the peak shown
        g0, g1 = int(gpus[0]), int(gpus[-1])
        s0, s1 = int(mem["step"].min()), int(mem["step"].max())
        rows, g_cell = _cells(mem["global_gpu"], g0, g1, _MAX_HEAT_ROWS)
        cols, s_cell = _cells(mem["step"], s0, s1, _MAX_HEAT_COLUMNS)
        grid = np.full((rows, cols), np.nan)
        np.fmax.at(grid, (g_cell, s_cell), gib)
        extent = (s0 - 0.5, s1 + 0.5, g1 + 0.5, g0 - 0.5)
        im = ax.imshow(grid, aspect="auto", interpolation="nearest", extent=extent)
        fig.colorbar(im, ax=ax, label="peak memory (GiB)")
        ax.set_ylabel("global GPU id")
    ax.set_xlabel("step")
    ax.set_title("Peak memory per GPU")
    return fig


def _transitions(plt: Any, log: RunLog) -> Any:
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    trans = log.tables["transitions"]
    n = trans["step"].size
    if n == 0:
        _empty(ax1, "no transitions")
        _empty(ax2, "no transitions")
    else:
        x = np.arange(n)
        labels = [str(s) for s in trans["step"].tolist()]
        ax1.bar(x - 0.2, trans["predicted_s"], 0.4, label="predicted")
        ax1.bar(x + 0.2, trans["measured_s"], 0.4, label="measured")
        ax1.set_xticks(x)
        ax1.set_xticklabels(labels, fontsize=7)
        ax1.set_xlabel("after step")
        ax1.set_ylabel("transition time (s)")
        ax1.legend(fontsize=8)
        ax2.bar(x, np.asarray(trans["transfer_bytes"], dtype=float) / 1e9, color="tab:purple")
        ax2.set_xticks(x)
        ax2.set_xticklabels(labels, fontsize=7)
        ax2.set_xlabel("after step")
        ax2.set_ylabel("bytes moved (GB)")
    ax1.set_title("Transition time")
    ax2.set_title("Transition volume")
    return fig


def _stage_times(plt: Any, log: RunLog) -> Any:
    """Per model-stage: measured time per step (dots) and the cost model's prediction under the
    calibration that step ran with (line): the closed loop at work."""
    fig, ax = plt.subplots(figsize=(9, 4.5))
    t = log.tables["stage_times"]
    if t["step"].size == 0:
        _empty(ax, "no stage times logged (a log of schema 1, or no step)")
    else:
        names = sorted(set(t["model_stage"].tolist()))
        for i, name in enumerate(names):
            sel = t["model_stage"] == name
            color = f"C{i % 10}"
            ax.plot(t["step"][sel], t["predicted_s"][sel], color=color, lw=1.2, label=name)
            ax.plot(t["step"][sel], t["measured_s"][sel], color=color, ls="", marker="o", ms=3)
        ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.set_ylabel("seconds (line: predicted, dots: measured)")
        ax.legend(fontsize=7, ncol=2, loc="upper left")
    ax.set_title("Model-stage time: predicted vs measured")
    return fig


def write_plots(log: RunLog, out_dir: Path) -> list[Path]:
    """Write the PNGs of :data:`PLOT_FILES` into ``out_dir`` (created); return their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for name, draw in zip(
        PLOT_FILES, (_step_latency, _plan_timeline, _gpu_memory, _transitions, _stage_times),
        strict=True
    ):
        fig = draw(plt, log)
        try:
            # Fixed margins: a layout engine (tight/constrained) renders every figure twice.
            fig.subplots_adjust(**_MARGINS)
            path = out_dir / name
            fig.savefig(path, dpi=_DPI)
            written.append(path)
        finally:
            plt.close(fig)
    return written
