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


@dataclass(frozen=True, slots=True)
class ControllerConfig:
    """Every constant of the controller; defaults documented in README (Controller section)."""

    q0: int = 1  # initial isolation size (§4.4 default)
    m0: int | None = 0  # initial tail replicas: start at the uniform boundary; None = R // 2
    ema: float = 0.3  # weight of the newest measurement in rate / calibration EMAs
    bias_ema: float = 0.1  # weight of the newest step in the forecast-bias EMAs (mostly luck per step: slow)
    momentum: float = 0.5  # damping of the q update (C.1 "damped momentum")
    max_q_step: int = 2  # bounded change of q per decision (at least E/4: the bound scales with the range)
    q_gain: float = 0.03  # apply a q change only if the predicted makespan improves by more than this fraction
    m_gain: float = 0.03  # switching threshold of the outer loop
    m_radius: int = 2  # C.2's radius: splits this near m are always scored (the outer loop scans the whole range)
    min_dwell: int = 3  # steady steps in isolation before the uniform boundary is reconsidered
    leave_confirm: int = 2  # after a return to uniform: decisions in a row the leave test must pass to leave again
    history_steps: int = 16  # consumed batches kept as response-work history
    calib_bounds: tuple[float, float] = (0.5, 2.0)
    move_cost_s: float = 0.0  # prior restart seconds of a pool move (learnt from StepObservation.restart_s)
    move_horizon: int = 8  # steps in which a pool move's predicted gain must repay its restart

    def __post_init__(self) -> None:
        if self.q0 < 0:
            raise ConfigError(f"q0 must be >= 0, got {self.q0}")
        if self.m0 is not None and self.m0 < 0:
            raise ConfigError(f"m0 must be >= 0, got {self.m0}")
        for name in ("ema", "momentum", "bias_ema"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise ConfigError(f"{name} must lie in [0, 1], got {v}")
        if self.max_q_step < 1 or self.m_radius < 1 or self.history_steps < 1:
            raise ConfigError("max_q_step, m_radius and history_steps must be >= 1")
        if not (self.move_cost_s >= 0 and math.isfinite(self.move_cost_s)):
            raise ConfigError(f"move_cost_s must be >= 0 and finite, got {self.move_cost_s}")
        for name in ("move_horizon", "leave_confirm"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")


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
    candidates: int
    tail_s: float
    bulk_s: float
    consumed_lengths: NDArray[np.int64]  # (N, G) lengths of the consumed groups, the q tail groups first
    restart_s: float = 0.0  # replica restarts before this step (a pool move between differently configured pools)
    pinned: int = 0  # consumed groups right after the tail groups that were candidates run pinned in the bulk pool
    work: StepWork | None = None  # the step's requests as they ran (None: calibrate against the bootstrap forecast)


@dataclass(frozen=True, slots=True)
class ControlState:
    """Controller state between steps; `q`, `m` are what the next step should run."""

    q: int
    m: int
    hold: int = 0
    velocity: float = 0.0
    rate_tail: float = math.nan
    rate_bulk: float = math.nan
    calib_tail: float = math.nan  # measured / modelled at two-pool steps (NaN: none yet, `calibration.model_errors`)
    calib_bulk: float = math.nan
    calib_uniform: float = math.nan  # measured / predicted at uniform steps (NaN: none yet; the first one seeds it)
    bias_tail: float = 0.0  # log forecast bias of each class (`policy.calibration`): modelled / bootstrap forecast
    bias_bulk: float = 0.0
    bias_uniform: float = 0.0
    bias_step: float = 0.0  # log spread bias of a two-pool step's E[max] (`policy.calibration`)
    var_uniform: float = math.nan  # step-to-step spread of the uniform bias's log-ratios (NaN: none seen yet)
    var_step: float = math.nan  # the same for the two-pool step's spread bias (`calibration.forecast_noise`)
    seen_step: int = 0  # two-pool steps the spread bias has learnt from (its first ones are averaged, not EMA'd)
    settled: int = 0
    dwell: int = 0  # steps since the last switch between uniform and isolation
    move_cost_s: float = math.nan  # EMA of the measured restart seconds of a pool move (NaN: none seen yet)
    last_m: int = 0  # m of the last executed step (a change in m is a pool move)
    move_dir: int = 0  # direction of the last move of m between two-pool splits (+1, −1; 0: none)
    since_move: int = 0  # steps since that move
    reversals: int = 0  # moves of m in a row that reversed the one before (each doubles the dwell a reversal needs)
    returns: int = 0  # returns from a split to uniform so far (after one, a leave waits `min_dwell`, `leave_confirm`)
    leave_streak: int = 0  # decisions in a row at uniform whose best split passed the leave test (`leave_confirm`)
    uniform_dispatch: str = "group"  # how a uniform step places requests: "group" (whole groups) or "request"
    history: tuple[NDArray[np.int64], ...] = field(default_factory=tuple)
    tail_history: tuple[NDArray[np.int64], ...] = field(default_factory=tuple)
    # the last two-pool step's fresh groups as they ran (`policy.fresh.fresh_record`; empty: none pending): its cut
    # groups are completed once their regenerations are seen, the next step
    last_fresh: tuple[NDArray[np.int64], ...] = field(default_factory=tuple)
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        """Plain JSON-able dict: NaN (not measured yet) as null, the histories as nested lists."""
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name in (*_HISTORIES, "last_fresh"):
                out[f.name] = [a.tolist() for a in v]
            else:
                out[f.name] = None if isinstance(v, float) and math.isnan(v) else v
        return out

    @classmethod
    def from_json(cls, obj: Any, where: str = "control") -> ControlState:
        """Inverse of `to_json`, field by field (q and m required, the rest default as in older files): counts are
        integers >= 0, estimates finite (calibrations > 0; null: not measured yet), histories (rows, G) tables of
        token counts; a ConfigError naming the field otherwise."""
        names = [f.name for f in fields(cls)]
        d = json_object(obj, where, ("q", "m"), names)
        kw: dict[str, Any] = {}
        for name, v in d.items():
            flag = f"{where}.{name}"
            if name in _COUNTS:
                kw[name] = int_in(v, flag, 0, MAX_INT)
            elif name in _HISTORIES:
                kw[name] = _history(v, flag)
            elif name == "last_fresh":
                kw[name] = _fresh_record(v, flag)
            elif name in _MEASURED:
                kw[name] = finite_or_nan(v, flag, lo=0)
            elif name in ("calib_tail", "calib_bulk", "calib_uniform"):
                kw[name] = finite_or_nan(v, flag, lo=0, lo_open=True)
            elif name == "move_dir":
                kw[name] = one_of(v, flag, (-1, 0, 1))
            elif name == "uniform_dispatch":
                kw[name] = one_of(v, flag, ("group", "request"))
            elif name == "note":
                if not isinstance(v, str):
                    raise ConfigError(f"{flag} must be text, got {v!r}"[:300])
                kw[name] = v
            else:  # velocity and the log biases: any finite number
                kw[name] = finite(v, flag)
        return cls(**kw)


_COUNTS = ("q", "m", "hold", "settled", "dwell", "last_m", "since_move", "reversals", "returns", "leave_streak",
           "seen_step")
_MEASURED = ("rate_tail", "rate_bulk", "move_cost_s", "var_uniform", "var_step")  # NaN until the first measurement
_HISTORIES = ("history", "tail_history")


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


def _fresh_record(v: Any, flag: str) -> tuple[NDArray[np.int64], ...]:
    """Saved `last_fresh`: at most one table of rows [uid, consumed 0/1, finished members 0..G, G token counts]."""
    ok = isinstance(v, list) and len(v) <= 1
    for table in v if ok else ():
        g = len(table[0]) - 3 if isinstance(table, list) and table and isinstance(table[0], list) else 0
        ok = ok and g >= 1 and all(
            isinstance(r, list) and len(r) == g + 3 and all(type(x) is int for x in r)
            and 0 <= r[0] <= MAX_INT and r[1] in (0, 1) and 0 <= r[2] <= g and all(0 <= x <= MAX_LENGTH for x in r[3:])
            for r in table)
    if not ok:
        raise ConfigError(f"{flag} must be [] or one table of rows [uid, consumed 0/1, finished 0..G, G token counts "
                          f"in 0..{MAX_LENGTH:,}]")
    return tuple(np.asarray(t, dtype=np.int64) for t in v)
