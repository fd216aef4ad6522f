"""Progress of a long command on stderr, never stdout (so `--json` and piped tables stay clean).

Every command that can run past a few seconds (`simulate` and its `--spec` sweeps, `plan`, `route`, `oracle`,
`analyze`, `profile`) reports through one `Heartbeat`: where stderr is a terminal and the command draws a rich bar,
the bar; otherwise (a log file, a pipe, a command without a bar) a line every 10 s of what is done:

    tailsieve route: 1,200/7,812 steps (15%), 40 s elapsed

The line comes from a background timer too, so a single long call (loading a 10^6-prompt trace) still shows that
the command is alive. `TAILSIEVE_PROGRESS=off` silences it; `TAILSIEVE_PROGRESS=SECONDS` sets the interval. The
clock and the writer are injected, so tests see exact lines.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import StrEnum

from tailsieve.cli.width import say
from tailsieve.errors import ConfigError
from tailsieve.inputs import ascii_float, excerpt

__all__ = ["ENV", "EVERY_S", "Heartbeat", "Mode", "heartbeat", "interval", "progress_mode"]

ENV = "TAILSIEVE_PROGRESS"  # "off", or the seconds between two progress lines
EVERY_S = 10.0  # seconds between two progress lines by default
POLL_S = 1.0  # how often the background timer looks at the clock


class Mode(StrEnum):
    """How a command shows its progress."""

    BAR = "bar"  # stderr is a terminal: a rich bar where the command draws one
    LINES = "lines"  # a heartbeat line every `interval()` seconds
    OFF = "off"  # TAILSIEVE_PROGRESS=off


def interval() -> float | None:
    """Seconds between progress lines (`TAILSIEVE_PROGRESS`; default EVERY_S), None when silenced; another value is
    a one-line `ConfigError`."""
    text = os.environ.get(ENV, "").strip()
    if not text:
        return EVERY_S
    if text.lower() == "off":
        return None
    try:
        value = ascii_float(text, ENV)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise ConfigError(f"{ENV} must be 'off' or a number of seconds >= 0, got {excerpt(text)}")
    return value


def progress_mode() -> Mode:
    """The progress of this process: OFF when silenced, BAR when stderr is a terminal, else LINES."""
    if interval() is None:
        return Mode.OFF
    return Mode.BAR if sys.stderr.isatty() else Mode.LINES


def _stderr(line: str) -> None:
    say(line)
    sys.stderr.flush()


def _elapsed(seconds: float) -> str:
    s = int(seconds)
    return f"{s} s" if s < 60 else f"{s // 60} min {s % 60:02d} s"


class Heartbeat:
    """What a long command has done, written as one line whenever `every_s` seconds have passed since the last
    line (or the start): `tailsieve CMD: DONE/TOTAL UNIT (P%), T elapsed[, NOTE]`. `write=None`: silent."""

    def __init__(self, command: str, unit: str, total: int | None = None, *, every_s: float = EVERY_S,
                 clock: Callable[[], float] = time.monotonic, write: Callable[[str], None] | None = _stderr) -> None:
        self.command, self.unit, self.total, self.every_s = command, unit, total, every_s
        self.clock, self.write = clock, write
        self.start = self.last = clock()
        self.done = 0
        self.note = ""
        self._lock = threading.Lock()

    def update(self, done: int | None = None, *, advance: int = 0, total: int | None = None,
               note: str | None = None) -> None:
        """Record progress (`done` absolute, or `advance` on it; a new `total` or `note`), then `beat`."""
        with self._lock:
            self.done = (self.done if done is None else done) + advance
            self.total = self.total if total is None else total
            self.note = self.note if note is None else note
        self.beat()

    def beat(self) -> None:
        """Write the line if `every_s` seconds have passed since the last one."""
        with self._lock:
            now = self.clock()
            if self.write is None or now - self.last < self.every_s:
                return
            self.last = now
            line = self.line(now)
        self.write(line)

    def line(self, now: float) -> str:
        """The progress line at clock time `now`."""
        if self.total:
            done = f"{self.done:,}/{self.total:,} {self.unit} ({100 * self.done / self.total:.0f}%)"
        else:
            done = f"{self.done:,} {self.unit}"
        note = f", {self.note}" if self.note else ""
        return f"tailsieve {self.command}: {done}, {_elapsed(now - self.start)} elapsed{note}"


@contextmanager
def heartbeat(command: str, unit: str, total: int | None = None, *, bar_shown: bool = False) -> Iterator[Heartbeat]:
    """A `Heartbeat` for the length of the block, writing to stderr (see the module docstring): silent when progress
    is off, or when stderr is a terminal and `bar_shown` (the command's rich bar says it); else also beating from a
    background timer, so that a long single call is not silence."""
    every = interval()
    mode = progress_mode()
    active = every is not None and not (mode is Mode.BAR and bar_shown)
    hb = Heartbeat(command, unit, total, every_s=EVERY_S if every is None else every, write=_stderr if active else None)
    if not active:
        yield hb
        return
    stop = threading.Event()

    def timer() -> None:
        while not stop.wait(min(POLL_S, hb.every_s) or POLL_S):
            hb.beat()

    thread = threading.Thread(target=timer, name=f"tailsieve-{command}-progress", daemon=True)
    thread.start()
    try:
        yield hb
    finally:
        stop.set()
        thread.join()
