"""Command-line interface: `tailsieve <command>`; each command lives in its own module with `register()`."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from tailsieve import __version__
from tailsieve.errors import TailSieveError
from tailsieve.redact import redact

# One module per command; each exposes `register(subparsers)` that sets `func(args) -> int` on its parser.
COMMANDS: tuple[str, ...] = (
    "tailsieve.cli.curves_cmd",
    "tailsieve.cli.workloads_cmd",
    "tailsieve.cli.analyze_cmd",
    "tailsieve.cli.route_cmd",
    "tailsieve.cli.simulate_cmd",
    "tailsieve.cli.oracle_cmd",
    "tailsieve.cli.profile_cmd",
    "tailsieve.cli.rollout_cmd",
    "tailsieve.cli.launch_cmd",
)


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every command registered."""
    parser = argparse.ArgumentParser(
        prog="tailsieve",
        description="Partial-rollout-guided tail routing for synchronous LLM rollouts.",
    )
    parser.add_argument("--version", action="version", version=f"tailsieve {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMANDS:
        importlib.import_module(module).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; user errors print one line to stderr and return a non-zero exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args))
    except (TailSieveError, ValueError, FileNotFoundError, IsADirectoryError, PermissionError) as exc:
        msg = redact(str(exc)).splitlines()[0] if str(exc) else type(exc).__name__
        print(f"tailsieve {args.command}: error: {msg}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"tailsieve {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
