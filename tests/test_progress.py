"""Progress of long commands (issue 42 item 5, issue 41 item 11): the one heartbeat helper (`cli/progress.py`) with a
fake clock, its switch (`TAILSIEVE_PROGRESS`), and every long command writing it on stderr only — stdout stays one
JSON document — also when stderr is not a terminal (the `--spec` sweeps included)."""

from __future__ import annotations

import contextlib
import io
import json
import sys
from collections.abc import Iterator

import pytest

from tailsieve.cli import main
from tailsieve.cli.progress import ENV, EVERY_S, Heartbeat, Mode, heartbeat, interval, progress_mode
from tailsieve.errors import ConfigError


class Clock:
    """A clock the test moves."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def beat() -> Iterator[tuple[Heartbeat, Clock, list[str]]]:
    clock, lines = Clock(), list[str]()
    yield Heartbeat("route", "steps", 200, every_s=10.0, clock=clock, write=lines.append), clock, lines


def test_a_line_every_interval_with_done_total_and_elapsed(beat: tuple[Heartbeat, Clock, list[str]]) -> None:
    hb, clock, lines = beat
    for t, done in ((3.0, 10), (9.99, 20), (10.0, 30), (15.0, 40), (19.99, 41), (20.0, 50), (95.0, 200)):
        clock.now = 100.0 + t
        hb.update(done)
    assert lines == ["tailsieve route: 30/200 steps (15%), 10 s elapsed",
                     "tailsieve route: 50/200 steps (25%), 20 s elapsed",
                     "tailsieve route: 200/200 steps (100%), 1 min 35 s elapsed"]


def test_advance_total_and_note(beat: tuple[Heartbeat, Clock, list[str]]) -> None:
    hb, clock, lines = beat
    hb.update(advance=5)
    hb.update(advance=5, note="tailsieve 3/30")
    clock.now += 12
    hb.update(advance=1, total=400)
    hb.update(note="")
    clock.now += 610
    hb.beat()
    assert lines == ["tailsieve route: 11/400 steps (3%), 12 s elapsed, tailsieve 3/30",
                     "tailsieve route: 11/400 steps (3%), 10 min 22 s elapsed"]


@pytest.mark.parametrize("total", [None, 0])
def test_without_a_total_the_count_alone(total: int | None) -> None:
    clock, lines = Clock(), list[str]()
    hb = Heartbeat("analyze", "phases", total, every_s=0.0, clock=clock, write=lines.append)
    hb.update(1, note="reading the workload")
    assert lines == ["tailsieve analyze: 1 phases, 0 s elapsed, reading the workload"]


def test_a_silent_heartbeat_counts_but_writes_nothing() -> None:
    clock = Clock()
    hb = Heartbeat("oracle", "groups", 3, every_s=0.0, clock=clock, write=None)
    hb.update(2)
    clock.now += 60
    hb.beat()
    assert hb.done == 2 and hb.line(clock.now) == "tailsieve oracle: 2/3 groups (67%), 1 min 00 s elapsed"


@pytest.mark.parametrize(("value", "want"), [(None, EVERY_S), ("", EVERY_S), ("off", None), ("OFF", None),
                                             (" 30 ", 30.0), ("0", 0.0), ("2.5", 2.5)])
def test_the_switch(monkeypatch: pytest.MonkeyPatch, value: str | None, want: float | None) -> None:
    if value is None:
        monkeypatch.delenv(ENV, raising=False)
    else:
        monkeypatch.setenv(ENV, value)
    assert interval() == want


@pytest.mark.parametrize("value", ["-1", "x", "nan", "inf", "10s"])
def test_a_bad_switch_is_one_line(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(ENV, value)
    with pytest.raises(ConfigError, match=f"^{ENV} must be 'off' or a number of seconds >= 0, got "):
        interval()


class _Err(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


@pytest.mark.parametrize(("tty", "bar_shown", "setting", "mode", "writes"), [
    (False, False, "0", Mode.LINES, True), (False, True, "0", Mode.LINES, True),
    (True, False, "0", Mode.BAR, True), (True, True, "0", Mode.BAR, False),
    (False, False, "off", Mode.OFF, False), (True, False, "off", Mode.OFF, False)])
def test_who_writes(monkeypatch: pytest.MonkeyPatch, tty: bool, bar_shown: bool, setting: str, mode: Mode,
                    writes: bool) -> None:
    """Lines where no bar says it; never on stdout."""
    out, err = _Err(False), _Err(tty)
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setenv(ENV, setting)
    assert progress_mode() is mode
    with heartbeat("plan", "policy steps", 4, bar_shown=bar_shown) as hb:
        hb.update(3)
    assert out.getvalue() == ""
    assert (err.getvalue().splitlines()[:1] == ["tailsieve plan: 3/4 policy steps (75%), 0 s elapsed"]) is writes
    assert bool(err.getvalue()) is writes


SPEC = ["simulate", "--spec", "eagle3,acceptance=0.7", "--curve", "a100-llama3-8b", "--steps", "3", "--groups",
        "8", "--group-size", "2", "--replicas", "3", "--spec-budgets", "0,1"]
LONG = {  # each long command, small: (argv, unit)
    "simulate": (["simulate", "--steps", "3", "--groups", "8", "--group-size", "2", "--replicas", "3"],
                 "policy steps"),
    "simulate --spec": (SPEC, "policy steps"),
    "plan": (["plan", "--steps", "3", "--groups", "8", "--group-size", "2", "--replicas", "3"], "policy steps"),
    "route": (["route", "--groups", "8", "--group-size", "2"], "steps"),
    "oracle": (["oracle", "--sample", "12", "--repeat", "3"], "groups"),
    "analyze": (["analyze"], "phases"),
}


@pytest.mark.parametrize("case", sorted(LONG))
def test_every_long_command_beats_on_stderr_and_keeps_stdout_json(monkeypatch: pytest.MonkeyPatch,
                                                                  case: str) -> None:
    """stderr a file (not a terminal), an interval of 0: a line per unit of progress, stdout one JSON document."""
    argv, unit = LONG[case]
    monkeypatch.setenv(ENV, "0")
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        assert main([*argv, "--json"]) == 0
    json.loads(out.getvalue())
    lines = err.getvalue().splitlines()
    command = argv[0]
    assert lines and all(line.startswith(f"tailsieve {command}: ") for line in lines), lines
    assert any(f" {unit} (" in line or line.split(", ")[0].endswith(unit) for line in lines), lines
