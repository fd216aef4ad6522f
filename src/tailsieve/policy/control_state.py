"""The controller's frozen values (§3.2, App. C): its constants (`ControllerConfig`), what it learns from one step
(`StepObservation`) and what it carries between steps (`ControlState`, saved and restored by real runs)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
from numpy.typing import NDArray

from tailsieve.errors import ConfigError
from tailsieve.inputs import MAX_INT, MAX_LENGTH, finite, finite_or_nan, int_in, json_object, one_of
from tailsieve.policy.decision import Decision


def _knob(default: Any, help: str) -> Any:
    """A `ControllerConfig` field with its one help line (CLI flags are derived from these: `cli.flags`)."""
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True, slots=True)
class ControllerConfig:
    """Every constant of the controllers, each with one help line (docs/controller.md, "Constants"). The first six
    are the paired rule's (`tailsieve`, `tailsieve-fixed`); the last five are the paper's literal rules
    (`tailsieve-paper`, §3.2, App. C)."""

    q0: int = _knob(1, "initial isolation size q (the paper's default, §4.4)")
    m0: int | None = _knob(0, "initial tail replicas m (0: start at the uniform boundary; None: R // 2)")
    history_steps: int = _knob(16, "steps of response-work history every forecast is priced on (H)")
    z: float = _knob(1.0, "a move's paired gain must clear its switching cost by z standard errors")
    horizon: int = _knob(8, "steps over which a move's gain must repay its one-time cost")
    move_cost_s: float = _knob(0.0, "prior restart seconds of a pool move, until one is measured")
    ema: float = _knob(0.3, "weight of the newest step in the model-error, restart and rate averages")
    momentum: float = _knob(0.5, "paper: damping of the q update (C.1 damped momentum)")
    max_q_step: int = _knob(2, "paper: most groups one q move shifts (C.1 bounded step)")
    gain: float = _knob(0.03, "paper: least predicted fractional gain for a move of q or m")
    m_radius: int = _knob(2, "paper: C.2's radius of candidate tail-pool sizes around m")

    def __post_init__(self) -> None:
        if self.q0 < 0:
            raise ConfigError(f"q0 must be >= 0, got {self.q0}")
        if self.m0 is not None and self.m0 < 0:
            raise ConfigError(f"m0 must be >= 0, got {self.m0}")
        for name in ("ema", "momentum", "gain"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise ConfigError(f"{name} must lie in [0, 1], got {v}")
        for name in ("history_steps", "horizon", "max_q_step", "m_radius"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not (self.z >= 0 and math.isfinite(self.z)):
            raise ConfigError(f"z must be >= 0 and finite, got {self.z}")
        if not (self.move_cost_s >= 0 and math.isfinite(self.move_cost_s)):
            raise ConfigError(f"move_cost_s must be >= 0 and finite, got {self.move_cost_s}")


@dataclass(frozen=True, slots=True)
class StepWork:
    """Every request of one step as it ran, in plan order (tail groups first): what the model would have forecast
    for exactly this step's work, so calibration measures the model's error and not the luck of the draw."""

    lengths: NDArray[np.int64]  # (P, G) tokens each request generated (a cut one: what it had at the cutoff)
    lanes: NDArray[np.int64]  # (P, G) replica of each request
    tail: int  # the first `tail` groups ran in the tail pool
    kept: NDArray[np.bool_]  # (P,) groups consumed (run to completion)
    fresh: NDArray[np.bool_] | None = None  # (P,) groups drawn from the stream this step (never cut before)
    finished: NDArray[np.int64] | None = None  # (P,) members that finished (a cut group's shortest ones)
    uids: NDArray[np.int64] | None = None  # (P,) stream uid of each group (links a cut group to its regeneration)


@dataclass(frozen=True, slots=True)
class StepObservation:
    """What the controller learns from one executed step (from `StepResult` and the consumed batch)."""

    step: int
    q: int
    m: int
    warmup: bool
    tail_s: float
    bulk_s: float
    consumed_lengths: NDArray[np.int64]  # (N, G) lengths of the consumed groups, the q tail groups first
    restart_s: float = 0.0  # replica restarts before this step (a pool move between differently configured pools)
    pinned: int = 0  # consumed groups right after the tail groups that were candidates run pinned in the bulk pool
    work: StepWork | None = None  # the step's requests as they ran (None: calibrate against the bootstrap forecast)


@dataclass(frozen=True, slots=True)
class ControlState:
    """Controller state between steps; `q`, `m` are what the next step should run, `decision` why."""

    q: int
    m: int
    hold: int = 0  # paper: settle steps left after a move of q (App. E)
    velocity: float = 0.0  # paper: the damped q velocity (C.1)
    rate_tail: float = math.nan  # paper: EMA of the tail pool's groups per second (NaN: none yet)
    rate_bulk: float = math.nan
    calib_tail: float = math.nan  # model error, measured / modelled at two-pool steps (NaN: none yet)
    calib_bulk: float = math.nan
    calib_uniform: float = math.nan  # the same at uniform steps
    move_cost_s: float = math.nan  # EMA of the measured restart seconds of a pool move (NaN: none seen yet)
    last_m: int = 0  # m of the last executed step (a change in m is a pool move)
    uniform_dispatch: str = "group"  # how a uniform step places requests: "group" (whole groups) or "request"
    history: tuple[NDArray[np.int64], ...] = field(default_factory=tuple)
    tail_history: tuple[NDArray[np.int64], ...] = field(default_factory=tuple)
    decision: Decision | None = None  # the decision that set (q, m) (None: the initial state)

    @property
    def note(self) -> str:
        """The decision's one-line note ('' before the first decision)."""
        return "" if self.decision is None else self.decision.note

    def to_json(self) -> dict[str, Any]:
        """Plain JSON-able dict: NaN (not measured yet) as null, the histories as nested lists."""
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name in _HISTORIES:
                out[f.name] = [a.tolist() for a in v]
            elif f.name == "decision":
                out[f.name] = None if v is None else v.to_json()
            else:
                out[f.name] = None if isinstance(v, float) and math.isnan(v) else v
        return out

    @classmethod
    def from_json(cls, obj: Any, where: str = "control") -> ControlState:
        """Inverse of `to_json`, field by field (q and m required, the rest default; the fields of the controller
        before issue 40, `_RETIRED`, are read and dropped): counts are integers >= 0, estimates finite
        (calibrations > 0; null: not measured yet), histories (rows, G) tables of token counts; a ConfigError
        naming the field otherwise."""
        names = [f.name for f in fields(cls)]
        d = json_object(obj, where, ("q", "m"), (*names, *_RETIRED))
        kw: dict[str, Any] = {}
        for name, v in d.items():
            flag = f"{where}.{name}"
            if name in _RETIRED:
                continue
            if name in _COUNTS:
                kw[name] = int_in(v, flag, 0, MAX_INT)
            elif name in _HISTORIES:
                kw[name] = _history(v, flag)
            elif name in _MEASURED:
                kw[name] = finite_or_nan(v, flag, lo=0)
            elif name in ("calib_tail", "calib_bulk", "calib_uniform"):
                kw[name] = finite_or_nan(v, flag, lo=0, lo_open=True)
            elif name == "uniform_dispatch":
                kw[name] = one_of(v, flag, ("group", "request"))
            elif name == "decision":
                kw[name] = None if v is None else Decision.from_json(v, flag)
            else:  # velocity: any finite number
                kw[name] = finite(v, flag)
        return cls(**kw)


_COUNTS = ("q", "m", "hold", "last_m")
_MEASURED = ("rate_tail", "rate_bulk", "move_cost_s")  # NaN until the first measurement
_HISTORIES = ("history", "tail_history")
# fields of the controller before issue 40 (saved states of older runs): read and dropped
_RETIRED = ("bias_tail", "bias_bulk", "bias_uniform", "bias_step", "var_uniform", "var_step", "seen_step", "settled",
            "dwell", "move_dir", "since_move", "reversals", "returns", "leave_streak", "note", "last_fresh")


def _history(v: Any, flag: str) -> tuple[NDArray[np.int64], ...]:
    """Saved response-work history: a list of (rows, G) tables of token counts in 0..MAX_LENGTH."""
    if not isinstance(v, list):
        raise ConfigError(f"{flag} must be a list of (rows, G) tables, got {type(v).__name__}")
    out = []
    for i, table in enumerate(v):
        ok = (isinstance(table, list) and table and all(isinstance(r, list) and r and len(r) == len(table[0])
                                                        for r in table)
              and all(type(x) is int and 0 <= x <= MAX_LENGTH for r in table for x in r))
        if not ok:
            raise ConfigError(f"{flag}[{i}] must be a non-empty table of token counts in 0..{MAX_LENGTH:,} with rows "
                              "of one length")
        out.append(np.asarray(table, dtype=np.int64))
    return tuple(out)
