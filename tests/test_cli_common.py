"""Shared CLI helpers (cli/_common.py): cell formatting, column alignment, the console width, when progress shows."""

from __future__ import annotations

import io
import sys

import pytest

from tailsieve.cli import main
from tailsieve.cli._common import PIPE_WIDTH, console, fmt, is_numeric, print_table, progress_console, progress_enabled


def test_fmt_and_numeric_cells() -> None:
    assert [fmt(v) for v in (2131.5, 12229.4, 16385, float("nan"), 0.12345, "x")] == [
        "2132", "12229", "16385", "-", "0.1235", "x"]  # no thousands separator beside an int
    assert all(is_numeric(c) for c in ("12", "-3.5", "0.13%", "1.025×", "±6.7%", "3.5 s", "-", "1e-05", "1,024"))
    assert not any(is_numeric(c) for c in ("h100", "1..64", "BSD-3-Clause", "7 / 4", "", "linear: +0.1 ms"))


def rendered_row(out: str, first: str) -> str:
    return next(line for line in out.splitlines() if line.startswith(f"│ {first}"))


def test_text_columns_left_numbers_right(capsys: pytest.CaptureFixture[str]) -> None:
    print_table("t", ["name", "what", "n"], [("a", "short", 1), ("bb", "a longer text", 12345.0)])
    out = capsys.readouterr().out
    assert rendered_row(out, "a").split("│")[2:4] == [" short         ", "     1 "]
    assert rendered_row(out, "bb").split("│")[2:4] == [" a longer text ", " 12345 "]


def test_console_width(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    assert console().width == PIPE_WIDTH  # stdout is not a terminal here
    monkeypatch.setenv("COLUMNS", "100")
    assert console().width == 100


def test_analyze_prints_every_length_alike(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["analyze"]) == 0
    out = capsys.readouterr().out
    cells = {k: rendered_row(out, k).split("│")[2].strip() for k in ("P50", "P90", "P99", "max ")}
    assert cells == {"P50": "2132", "P90": "6639", "P99": "12229", "max ": "16385"}


def test_every_command_has_json_and_the_same_names() -> None:
    """README: every command has --json; the same thing has the same flag name everywhere."""
    import argparse

    from tailsieve.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    flags = {name: {o for a in p._actions for o in a.option_strings if a.help != argparse.SUPPRESS}
             for name, p in sub.choices.items()}
    assert all("--json" in f for f in flags.values()), [n for n, f in flags.items() if "--json" not in f]
    for cmd in ("simulate", "plan", "route", "oracle"):
        assert "--workload" in flags[cmd] and "--trace" not in flags[cmd]
    for cmd in ("simulate", "route", "rollout"):
        assert "--policy" in flags[cmd] and "--policies" not in flags[cmd]


def test_top_level_help_imports_no_command_and_summaries_match() -> None:
    """`tailsieve --help`/`--version` list the commands from SUMMARIES without importing them (start-up cost:
    bench/bench_startup.py); each summary is the help its module registers."""
    import argparse
    import subprocess
    import sys

    from tailsieve.cli import SUMMARIES, build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    registered = {c.dest: c.help for c in sub._choices_actions}
    assert registered == SUMMARIES
    code = ("import sys\nfrom tailsieve.cli import main\nfor argv in (['--version'], ['--help']):\n"
            "    try:\n        main(argv)\n    except SystemExit:\n        pass\n"
            "print(sorted(m for m in ('numpy', 'rich', 'aiohttp', 'matplotlib', 'tailsieve.cli.simulate_cmd') "
            "if m in sys.modules), file=sys.stderr)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stderr.strip() == "[]" and "simulate" in proc.stdout and "tailsieve 0.1.0" in proc.stdout


class _Stream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


@pytest.mark.parametrize("tty", [True, False])
def test_progress_follows_stderr_not_stdout(monkeypatch: pytest.MonkeyPatch, tty: bool) -> None:
    monkeypatch.delenv("TAILSIEVE_PROGRESS", raising=False)  # conftest turns progress off
    monkeypatch.setattr(sys, "stdout", _Stream(not tty))
    monkeypatch.setattr(sys, "stderr", _Stream(tty))
    assert progress_enabled() is tty
    con = progress_console(progress_enabled())
    assert con.is_terminal is tty and con.file is sys.stderr
