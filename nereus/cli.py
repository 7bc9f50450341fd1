"""``nereus`` command line: plan | run | simulate | report | inventory | config check.

Bad input (flags, config files, traces, logs) ends in one line on stderr naming the field, the
value and the rule, and exit status 2 — never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from nereus.errors import InfeasiblePlanError, NereusError

# Each module defines register(subparsers); the handler is stored as ``func`` on the namespace.
COMMAND_MODULES = (
    "nereus.commands.plan",
    "nereus.commands.config_check",
    "nereus.commands.inventory",
    "nereus.commands.report",
    "nereus.commands.simulate",
    "nereus.commands.run",
)


class UsageError(NereusError):
    """A command-line usage error (unknown flag, missing argument): one line, exit 2."""


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and a NereusError (caught in main)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message}")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="nereus", description=__doc__.splitlines()[0] if __doc__ else None)
    from nereus import __version__

    parser.add_argument("--version", action="version", version=f"nereus {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def one_line(text: str) -> str:
    """``text`` with every character that would end a line or hide in a terminal escaped
    (a key or value taken from a hostile input may hold ``\\r`` or ``\\x85``)."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
                   for c in text)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return int(args.func(args))
    except InfeasiblePlanError as exc:
        print(f"nereus: infeasible: {one_line(str(exc))}", file=sys.stderr)
        return 3
    except NereusError as exc:
        print(f"nereus: error: {one_line(str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("nereus: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # stdout closed early (``nereus plan | head``): stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
