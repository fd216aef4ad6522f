"""The bounds of a launch config (docs/launch.md, "Bounds"): every number `tailsieve launch` and `rollout --launch`
turn into a wait, a retry count, a memory size or a core list lies in a documented range, and no text that becomes a
server's argv or environment holds a NUL byte. Each bound is written once here; `LaunchConfig` checks them when it is
built (from a TOML/JSON `[launch]` table, flags or code), so `--dry-run` refuses what a start would fail on.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from tailsieve.errors import ConfigError
from tailsieve.inputs import excerpt

MAX_BACKOFF_S = 30.0  # the longest wait between two restart tries (the restart policy's cap)
MAX_CPU_MEMORY_GIB = 4096  # cpu: KV cache GiB per replica
MAX_CORE_ID = 8191  # the largest CPU number a taskset core list may name (Linux NR_CPUS at most 8192)


@dataclass(frozen=True, slots=True)
class Bound:
    """A closed range [lo, hi] of one `[launch]` number; `integer`: whole numbers only."""

    lo: float
    hi: float
    unit: str = ""
    integer: bool = False

    def check(self, value: Any, name: str) -> None:
        """`value` within the range (finite; an integer when `integer`); else one line naming `name` and the
        range."""
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if self.integer:
            number = number and isinstance(value, int)
        if not number or not self.lo <= value <= self.hi:  # NaN fails the comparison; a huge int compares exactly
            kind = "an integer" if self.integer else "a number"
            rng = f"{self.lo:g}..{self.hi:g}" if self.integer else f"[{self.lo:g}, {self.hi:g}]"
            unit = f" {self.unit}" if self.unit else ""
            raise ConfigError(f"{name} must be {kind} in {rng}{unit}, got {excerpt(value)}")


# The `[launch]` keys with a range (the LaunchConfig field of the same name).
BOUNDS: dict[str, Bound] = {
    "startup_timeout_s": Bound(1.0, 86_400.0, "seconds"),  # a day: a cold hub download of a large model
    "grace_s": Bound(0.1, 600.0, "seconds"),  # SIGTERM → SIGKILL: a replica ignoring SIGTERM is killed by then
    "restart_retries": Bound(0, 100, integer=True),
    "restart_backoff_s": Bound(0.0, MAX_BACKOFF_S, "seconds"),
    "warmup_tokens": Bound(0, 4096, integer=True),
}
CPU_MEMORY = Bound(0, MAX_CPU_MEMORY_GIB, "GiB")  # the kind refines it (vLLM: whole GiB >= 1)
_CORE_SPAN = re.compile(r"(\d+)(?:-(\d+)(?::(\d+))?)?")


def check_bounds(values: dict[str, Any], prefix: str = "launch.") -> None:
    """Every bounded key present in `values` within its range."""
    for key, bound in BOUNDS.items():
        if key in values:
            bound.check(values[key], f"{prefix}{key}")


def check_cores(place: str, what: str = "launch.cores") -> None:
    """A taskset core list whose numbers are at most `MAX_CORE_ID`, each range `a-b[:s]` with a <= b and s >= 1
    (the list's syntax is checked before)."""
    for part in place.strip().split(","):
        m = _CORE_SPAN.fullmatch(part)
        if m is None:
            continue
        lo, hi, step = int(m[1]), int(m[2] or m[1]), int(m[3] or 1)
        if hi > MAX_CORE_ID:
            raise ConfigError(f"{what}: {excerpt(place)} names CPU {hi:,}; core numbers are at most {MAX_CORE_ID}")
        if lo > hi or step < 1:
            raise ConfigError(f"{what}: {excerpt(part)} is not a range a-b[:s] with a <= b and s >= 1")


def check_no_nul(texts: Iterable[tuple[str, Any]]) -> None:
    """No NUL byte in any (name, text) pair: a server's argv and environment cannot hold one (the OS would refuse
    the start with `embedded null byte`)."""
    for name, text in texts:
        if isinstance(text, str) and "\0" in text:
            raise ConfigError(f"{name} holds a NUL byte: {excerpt(text)}")
