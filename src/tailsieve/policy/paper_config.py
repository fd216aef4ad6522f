"""`tailsieve-paper`'s own constants (§3.2, App. C.1–C.2): `PaperConfig`, carried by `ControllerConfig.paper` so one
config sets every policy of a run (the paper's knobs keep their flat names as flags and config keys: `--momentum`,
`controller.gain`; `policy.controller_knobs`). No other controller reads them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tailsieve.errors import ConfigError

__all__ = ["PaperConfig", "knob"]


def knob(default: Any, help: str) -> Any:
    """A config field with its one help line (CLI flags and adapter tables are derived from these)."""
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True, slots=True)
class PaperConfig:
    """The paper's literal rules' knobs: C.1's damped, bounded q update, the gain threshold of a move, C.2's radius."""

    momentum: float = knob(0.5, "paper: damping of the q update (C.1 damped momentum)")
    max_q_step: int = knob(2, "paper: most groups one q move shifts (C.1 bounded step)")
    gain: float = knob(0.03, "paper: least predicted fractional gain for a move of q or m")
    m_radius: int = knob(2, "paper: C.2's radius of candidate tail-pool sizes around m")

    def __post_init__(self) -> None:
        for name in ("momentum", "gain"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise ConfigError(f"{name} must lie in [0, 1], got {v}")
        for name in ("max_q_step", "m_radius"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
