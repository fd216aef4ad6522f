"""Every line the CLI prints itself fits 120 columns on a terminal (issue 50, item 6; `cli/width.py`): errors,
interrupts and warnings wrap at spaces with two-column continuations; to a pipe or a file a message stays one line."""

from __future__ import annotations

import io

import pytest

from tailsieve.cli import main
from tailsieve.cli.width import WIDTH, fit, say

LONG = ("tailsieve simulate: error: --replicas 1: 9 of the 14 policies of --policy all (the default) need at least 2 "
        "replicas (a tail and a bulk pool); give --replicas 2 or more, or choose with --policy among uniform, "
        "uniform-oracle, verl-lif")


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_long_line_wraps_within_120_columns_and_loses_no_word() -> None:
    out = fit(LONG)
    lines = out.splitlines()
    assert len(lines) == 2 and all(len(line) <= WIDTH for line in lines)
    assert lines[1].startswith("  ") and " ".join(out.split()) == " ".join(LONG.split())
    assert fit("short") == "short"


def test_only_a_terminal_gets_wrapped_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # wider than 120: still 120
    tty, pipe = Tty(), io.StringIO()
    say(LONG, tty)
    say(LONG, pipe)
    assert max(len(line) for line in tty.getvalue().splitlines()) <= WIDTH and len(tty.getvalue().splitlines()) == 2
    assert pipe.getvalue() == LONG + "\n"  # one error per line for scripts and grep
    monkeypatch.setenv("COLUMNS", "80")  # a narrower terminal: its width
    narrow = Tty()
    say(LONG, narrow)
    assert max(len(line) for line in narrow.getvalue().splitlines()) <= 80


def test_a_cli_error_on_a_terminal_fits(monkeypatch: pytest.MonkeyPatch) -> None:
    err = Tty()
    monkeypatch.setattr("sys.stderr", err)
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["simulate", "--replicas", "1"]) == 1
    lines = err.getvalue().splitlines()
    assert len(lines) >= 2 and all(len(line) <= WIDTH for line in lines)
    assert lines[0].startswith("tailsieve simulate: error: --replicas 1:")
