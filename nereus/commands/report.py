"""``nereus report LOG.h5 [--out DIR] [--json] [--no-plots]``: summary and plots of a run log;
``nereus report --tensorboard LOG.h5 DIR``: its scalars as TensorBoard event files in the new
folder DIR (:func:`nereus.log.sinks.write_tensorboard`, the scalars a run writes live)."""

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
    p.add_argument("--tensorboard", action="store_true",
                   help="write the log's scalars as TensorBoard event files into the new "
                   "folder DIR instead (the scalars runtime.tensorboard writes live)")
    p.add_argument("tensorboard_dir", nargs="?", metavar="DIR",
                   help="with --tensorboard: the folder to create; never over an existing path")
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


def _tensorboard(args: argparse.Namespace) -> int:
    from nereus.errors import ConfigError
    from nereus.log.outputs import NewFolder
    from nereus.log.reader import read_run_log
    from nereus.log.sinks import write_tensorboard

    if not args.tensorboard_dir:
        raise ConfigError("--tensorboard", None, "needs DIR, the folder to create: nereus "
                          "report --tensorboard LOG.h5 DIR")
    folder = NewFolder(args.tensorboard_dir, "DIR")
    log = read_run_log(args.log)
    tmp = folder.start()
    try:
        count = write_tensorboard(log, tmp)
        folder.publish()
    except OSError as exc:
        raise ConfigError("DIR", args.tensorboard_dir,
                          f"cannot be written ({exc.strerror or type(exc).__name__})") from None
    finally:
        folder.discard()
    print(f"tensorboard: {count} scalars of {args.log} in {folder.path} "
          f"(tensorboard --logdir {folder.path})")
    return 0


def handler(args: argparse.Namespace) -> int:
    from nereus.errors import ConfigError
    from nereus.log.outputs import NewFolder
    from nereus.log.reader import read_run_log
    from nereus.log.summary import format_summary, summarize

    if args.tensorboard:
        return _tensorboard(args)
    if args.tensorboard_dir:
        raise ConfigError("DIR", args.tensorboard_dir, "is only taken with --tensorboard")

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
