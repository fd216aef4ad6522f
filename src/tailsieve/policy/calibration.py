"""The controllers' model error (§3.2): measured pool time / the all-admit model run on that step's own requests.

One factor per forecast class (tail pool, bulk pool, and the uniform boundary per placement: dealt requests, whole
groups), an EMA of weight `ema` (`ControlState.calib_*`): what the model misses on this fleet (engine overheads, a
fleet slower or faster than its profiled curve, tool calls between turns, a prompt prefill the model file lacks). It
carries none of the luck of the draw, because the model runs on the very requests the step ran (`policy.observed`);
in the simulator it is 1 unless the engine is scaled or the workload waits on tools. A class's first ratio seeds it;
until a class is measured it borrows the nearest measured one (the other pool's, then the uniform boundary's at the
state's placement, then 1; a placement borrows the other's): a split priced at 1 against a uniform boundary measured
at 1.5 would look 50% faster than it is. Without a per-request record (`StepObservation.work` is None) the ratio is
taken against the forecast at the executed split instead.
"""

from __future__ import annotations

import math
from dataclasses import replace

from tailsieve.policy.control_state import ControlState, StepObservation

__all__ = ["calibrate", "ema", "factors", "uniform_factor"]


def ema(prev: float, x: float, a: float) -> float:
    """Exponential moving average with weight `a` on the newest value; NaN `prev` (nothing seen yet) gives `x`."""
    return x if math.isnan(prev) else (1 - a) * prev + a * x


def uniform_factor(state: ControlState, dealt: bool) -> float:
    """The uniform boundary's model error with requests dealt (`dealt`) or whole groups placed: its own, else the
    other placement's (NaN when neither was measured)."""
    own, other = (state.calib_uniform, state.calib_group) if dealt else (state.calib_group, state.calib_uniform)
    return own if not math.isnan(own) else other


def factors(state: ControlState) -> tuple[float, float, float]:
    """(c_tail, c_bulk, c_uniform): each class's model error, or the nearest one measured (module docstring); the
    uniform boundary's at the state's placement."""
    here = uniform_factor(state, state.uniform_dispatch == "request")
    u = 1.0 if math.isnan(here) else here
    t, b = state.calib_tail, state.calib_bulk
    ct = t if not math.isnan(t) else b if not math.isnan(b) else u
    cb = b if not math.isnan(b) else t if not math.isnan(t) else u
    cu = here if not math.isnan(here) else cb
    return ct, cb, cu


def calibrate(state: ControlState, obs: StepObservation, a: float, modelled: tuple[float, float]) -> ControlState:
    """The model errors after one steady step: `modelled` is (T_tail, T_bulk) of the model on the step's requests
    (a uniform step: its bulk term is the whole step); a non-positive model time measures nothing."""
    if obs.warmup:
        return state
    ft, fb = modelled
    if obs.m > 0 and obs.q > 0 and ft > 0 and obs.tail_s > 0:
        state = replace(state, calib_tail=ema(state.calib_tail, obs.tail_s / ft, a))
    if fb > 0 and obs.bulk_s > 0:
        ratio = obs.bulk_s / fb
        if obs.m > 0:
            state = replace(state, calib_bulk=ema(state.calib_bulk, ratio, a))
        elif state.uniform_dispatch == "request":
            state = replace(state, calib_uniform=ema(state.calib_uniform, ratio, a))
        else:
            state = replace(state, calib_group=ema(state.calib_group, ratio, a))
    return state
