"""The controller's frozen values (§3.2, App. C): its constants (`ControllerConfig`), what it learns from one step
(`StepObservation`) and what it carries between steps (`ControlState`, saved and restored by real runs)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from tailsieve.errors import ConfigError


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
    history_steps: int = 8  # consumed batches kept as response-work history
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
        if self.move_horizon < 1:
            raise ConfigError(f"move_horizon must be >= 1, got {self.move_horizon}")


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
    calib_tail: float = 1.0
    calib_bulk: float = 1.0
    calib_uniform: float = math.nan  # measured / predicted at uniform steps (NaN: none yet; the first one seeds it)
    bias_tail: float = 0.0  # log forecast bias of each class (`policy.calibration`): modelled / bootstrap forecast
    bias_bulk: float = 0.0
    bias_uniform: float = 0.0
    bias_step: float = 0.0  # log spread bias of a two-pool step's E[max] (`policy.calibration`)
    settled: int = 0
    dwell: int = 0  # steps since the last switch between uniform and isolation
    move_cost_s: float = math.nan  # EMA of the measured restart seconds of a pool move (NaN: none seen yet)
    last_m: int = 0  # m of the last executed step (a change in m is a pool move)
    move_dir: int = 0  # direction of the last move of m between two-pool splits (+1, −1; 0: none)
    since_move: int = 0  # steps since that move
    reversals: int = 0  # moves of m in a row that reversed the one before (each doubles the dwell a reversal needs)
    returns: int = 0  # returns from a split to uniform so far (after one, leaving again waits `min_dwell` steps)
    uniform_dispatch: str = "group"  # how a uniform step places requests: "group" (whole groups) or "request"
    history: tuple[NDArray[np.int64], ...] = field(default_factory=tuple)
    tail_history: tuple[NDArray[np.int64], ...] = field(default_factory=tuple)
    # the last two-pool step's fresh groups as they ran (`policy.fresh.fresh_record`; empty: none pending): its cut
    # groups are completed once their regenerations are seen, the next step
    last_fresh: tuple[NDArray[np.int64], ...] = field(default_factory=tuple)
    note: str = ""
