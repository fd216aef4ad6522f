"""Error types: every user-facing failure is a one-line `TailSieveError`."""

from __future__ import annotations


class TailSieveError(Exception):
    """Base class for errors reported to the user as one line and a non-zero exit."""


class CurveError(TailSieveError, ValueError):
    """A throughput curve (TPOT table) is malformed or unknown."""


class TraceError(TailSieveError, ValueError):
    """A response-length trace is malformed, empty or unreadable."""


class ConfigError(TailSieveError, ValueError):
    """A configuration value is impossible; the message names the value."""


class Interrupted(KeyboardInterrupt):
    """A run stopped by a signal (SIGINT, SIGTERM, SIGHUP; `cli.launch_cmd.sigterm_as_interrupt`): the CLI prints one
    line, `interrupted by SIG…` and `note` (what was kept), and exits with 128 + the signal's number."""

    def __init__(self, signum: int, note: str = "") -> None:
        super().__init__(note)
        self.signum = signum
        self.note = note
