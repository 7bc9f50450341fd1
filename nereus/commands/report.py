"""``nereus report LOG.h5 [--out DIR] [--json] [--no-plots]``: summary and plots of a run log."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "report",
        help="summarize an HDF5 run log and plot it",
        description="Print a summary of a run log (also one being written, or left by a killed "
        "writer) and write PNG plots: step latency, plan timeline, per-GPU memory, transitions.",
    )
    p.add_argument("log", metavar="LOG.h5", help="run log written by nereus run / simulate")
    p.add_argument("--out", metavar="DIR", help="plot directory to create (default: LOG_report "
                   "next to LOG); never over an existing path")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    p.add_argument("--no-plots", action="store_true", help="print the summary only")
    p.set_defaults(func=handler)


def _finite(value: Any) -> Any:
    """NaN and infinities as null, so that --json prints standard JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _write_plots(log: Any, folder: Any) -> list[str]:
    """The four plots in the new folder ``folder`` (:class:`nereus.log.outputs.NewFolder`):
    drawn in a temporary folder beside it, renamed when all are written."""
    from nereus.errors import ConfigError
    from nereus.log.plots import write_plots

    tmp = folder.start()
    try:
        written = write_plots(log, Path(tmp))
        folder.publish()
    except OSError as exc:
        raise ConfigError(folder.field, folder.given,
                          f"cannot be written ({exc.strerror or type(exc).__name__})") from None
    finally:
        folder.discard()
    return [str(Path(folder.path) / p.name) for p in written]


def handler(args: argparse.Namespace) -> int:
    from nereus.log.outputs import NewFolder
    from nereus.log.reader import read_run_log
    from nereus.log.summary import format_summary, summarize

    folder = None
    if not args.no_plots:
        log_path = Path(args.log)
        out = args.out if args.out is not None else str(log_path.with_name(log_path.stem + "_report"))
        folder = NewFolder(out, "--out")
    log = read_run_log(args.log)
    summary = summarize(log)
    summary["plots"] = _write_plots(log, folder) if folder is not None else []
    plots = summary["plots"]
    if args.json:
        print(json.dumps(_finite(summary), allow_nan=False, default=str))
    else:
        print(format_summary(summary))
        if plots:
            print("plots: " + ", ".join(plots))
    return 0
