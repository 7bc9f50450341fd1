"""Where rank 0 sends the run's scalars besides the HDF5 log: TensorBoard event files
(``runtime.tensorboard: DIR``, torch's ``SummaryWriter``) and Weights & Biases (``runtime.wandb``,
when ``wandb`` is installed). Both get, as each log row is written, the scalars
:func:`nereus.log.scalars.scalars` derives from it — the same function ``nereus report
--tensorboard`` applies to a finished log. TensorBoard values are stored in double precision
(new-style tensor summaries), so they read back equal to the log's float64 columns.

A TensorBoard folder is never written over: it must not exist when a run starts (its parent
must), and only a resumed run writes into its own folder again (a new event file).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Mapping
from typing import Any

from nereus.config.outputs import OutputOptions
from nereus.errors import ConfigError
from nereus.log.scalars import Scalar, plan_scalars, scalars


def check_sinks(outputs: OutputOptions, resuming: bool) -> None:
    """Before a run: the TensorBoard folder can be made (or, resuming, continued) and wandb
    imports when asked for. Nothing is created."""
    tb = outputs.tensorboard
    if tb:
        if not (resuming and os.path.isdir(tb)):  # a resumed run continues its own folder
            from nereus.log.outputs import check_new_path

            check_new_path(tb, "runtime.tensorboard")
        try:
            import torch.utils.tensorboard  # noqa: F401  (needs the tensorboard package)
        except ImportError:
            raise ConfigError("runtime.tensorboard", tb, "needs the tensorboard package "
                              "(pip install 'nereus[data]')") from None
    if outputs.wandb is not None and outputs.wandb.mode != "disabled":
        try:
            import wandb  # noqa: F401
        except ImportError:
            raise ConfigError("runtime.wandb", outputs.wandb.to_dict(), "needs the wandb "
                              "package (pip install wandb)") from None


class TensorBoardSink:
    def __init__(self, folder: str) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=folder, flush_secs=30)

    def add(self, items: Iterable[Scalar]) -> None:
        for tag, step, value in items:
            self.writer.add_scalar(tag, value, global_step=step, new_style=True,
                                   double_precision=True)

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    """A wandb run in ``folder`` (its ``wandb/`` folder goes there); ``run_id`` keeps a resumed
    run's scalars in the same wandb run."""

    def __init__(self, project: str, name: str, mode: str, config: Mapping[str, Any],
                 folder: str, run_id: str) -> None:
        import wandb

        options: dict[str, Any] = {"project": project, "name": name or None, "mode": mode,
                                   "id": run_id, "config": dict(config), "dir": folder,
                                   "resume": "allow"}
        self.run = wandb.init(**options)

    def add(self, items: Iterable[Scalar]) -> None:
        by_step: dict[int, dict[str, float]] = {}
        for tag, step, value in items:
            by_step.setdefault(step, {})[tag] = value
        for step in sorted(by_step):
            self.run.log(by_step[step], step=step)

    def flush(self) -> None:
        return None

    def close(self) -> None:
        self.run.finish()


class Sinks:
    """Rank 0's scalar sinks; :meth:`row` is the run log writer's observer."""

    def __init__(self, sinks: list[Any]) -> None:
        self.sinks = sinks

    def add(self, items: list[Scalar]) -> None:
        if items:
            for sink in self.sinks:
                sink.add(items)

    def row(self, table: str, values: Mapping[str, Any]) -> None:
        self.add(scalars(table, values))

    def plan(self, plan: Mapping[str, Any], step: int) -> None:
        self.add(plan_scalars(plan, step))

    def flush(self) -> None:
        for sink in self.sinks:
            sink.flush()

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()
        self.sinks = []


def open_sinks(outputs: OutputOptions, config: Mapping[str, Any], log_path: str,
               created_unix_s: float) -> Sinks:
    """The sinks ``runtime.tensorboard`` and ``runtime.wandb`` ask for (rank 0): the wandb run
    beside the run log, its id derived from the log (its path and creation time)."""
    sinks: list[Any] = []
    if outputs.tensorboard:
        sinks.append(TensorBoardSink(os.path.abspath(outputs.tensorboard)))
    w = outputs.wandb
    if w is not None and w.mode != "disabled":
        path = os.path.abspath(log_path)
        run_id = hashlib.sha256(f"{path}|{created_unix_s!r}".encode()).hexdigest()[:16]
        sinks.append(WandbSink(w.project, w.name, w.mode, config, os.path.dirname(path),
                               run_id))
    return Sinks(sinks)


def log_rows(log: Any) -> Iterable[tuple[str, dict[str, Any]]]:
    """(table, row) of every row of a read run log (:class:`nereus.log.reader.RunLog`) whose
    scalars the sinks get, in the order a run writes them: by step, then table."""
    order = ("steps", "metrics", "stage_times", "validation", "transitions")
    rows: list[tuple[int, int, int, str, dict[str, Any]]] = []
    for t, name in enumerate(order):
        cols = log.tables.get(name, {})
        n = len(cols["step"]) if "step" in cols else 0
        for i in range(n):
            rows.append((int(cols["step"][i]), t, i, name, {k: v[i] for k, v in cols.items()}))
    rows.sort(key=lambda r: r[:3])
    return [(name, row) for _, _, _, name, row in rows]


def write_tensorboard(log: Any, folder: str) -> int:
    """A finished run log's scalars as TensorBoard event files in ``folder`` (made by the
    caller); returns how many scalars were written."""
    sink = TensorBoardSink(folder)
    items: list[Scalar] = plan_scalars(log.initial_plan, 0)
    for table, row in log_rows(log):
        items += scalars(table, row)
    sink.add(items)
    sink.close()
    return len(items)
