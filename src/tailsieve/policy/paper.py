"""`tailsieve-paper`: the paper's literal rules (§3.2, App. C.1–C.2), kept as the reference the paired rule is
measured against.

- Inner loop (C.1): after a settled step, EMA rates r_tail = q/T_tail, r_bulk = (N − q)/T_bulk and the balance point
  q* = N·r̄_tail/(r̄_bulk + r̄_tail); q moves toward it with damped momentum, a bounded step (`max_q_step`) and only
  when the predicted makespan max(q/r̄_tail, (N − q)/r̄_bulk) improves by more than `gain`; a settle hold follows
  (App. E: one step after an increase, two after a decrease).
- Outer loop (C.2): once q holds, the splits within `m_radius` of m (the uniform boundary among them when m ≤
  `m_radius`) are priced at the current q on the calibrated predictor; the fastest is taken if it gains more than
  `gain`, its cutoff is feasible, and then by one replica.

Its state (`PaperState`: the settle hold, the damped velocity, the two rate EMAs) and its knobs (`PaperConfig`,
`ControllerConfig.paper`) are its own; the learning (history, model error, price of a move) and the pricing on the
predictor are `Controller`'s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import ClassVar

import numpy as np

from tailsieve.inputs import finite
from tailsieve.policy.calibration import ema
from tailsieve.policy.control_state import ControlState, StepObservation, count, measured, own_state
from tailsieve.policy.controller_base import Controller
from tailsieve.policy.decision import Decision, Reason
from tailsieve.policy.predictor import Predictor

__all__ = ["PaperState", "TailSievePaperController"]


@own_state
@dataclass(frozen=True, slots=True)
class PaperState(ControlState):
    """`ControlState` and what C.1 carries between steps."""

    kind: ClassVar[str] = "tailsieve-paper"

    hold: int = 0  # settle steps left after a move of q (App. E)
    velocity: float = 0.0  # the damped q velocity (C.1)
    rate_tail: float = math.nan  # EMA of the tail pool's groups per second (NaN: none yet)
    rate_bulk: float = math.nan


PaperState.parse = ControlState.parse | {"hold": count, "velocity": finite, "rate_tail": measured,
                                         "rate_bulk": measured}


def paper_state(state: ControlState) -> PaperState:
    """`state` as a `PaperState` (a shared state gains C.1's fields at their start values)."""
    if isinstance(state, PaperState):
        return state
    return PaperState(**{f.name: getattr(state, f.name) for f in fields(state)})


class TailSievePaperController(Controller):
    """C.1's rate balance for q, C.2's radius for m (module docstring)."""

    state_type: ClassVar[type[ControlState]] = PaperState

    def update(self, state: ControlState, obs: StepObservation) -> ControlState:
        """Learn from the step; move q (inner loop) or, once q holds, m (outer loop)."""
        learnt, pred = self.learn(state, obs)
        s = paper_state(learnt)
        if obs.warmup:
            return replace(s, decision=Decision(s.q, s.m, Reason.WARMUP))
        if s.m > 0:
            s, moved = self.inner(s, obs)
            if moved:
                return s
        if s.hold > 0:
            return replace(s, hold=s.hold - 1, decision=Decision(s.q, s.m, Reason.HOLD))
        if self.router.replicas < 2:
            return replace(s, decision=Decision(s.q, s.m, Reason.STAY))
        return self.outer(s, pred)

    def inner(self, state: PaperState, obs: StepObservation) -> tuple[PaperState, bool]:
        """C.1: q toward q* = N·r̄_tail/(r̄_bulk + r̄_tail), damped momentum, bounded step, gain threshold, holds."""
        n, cfg, alpha = self.router.groups, self.config.paper, self.config.ema
        if obs.q <= 0 or obs.m <= 0 or obs.tail_s <= 0 or obs.bulk_s <= 0 or state.hold > 0:
            return state, False
        rt = ema(state.rate_tail, obs.q / obs.tail_s, alpha)
        rb = ema(state.rate_bulk, (n - obs.q) / obs.bulk_s, alpha)
        state = replace(state, rate_tail=rt, rate_bulk=rb)
        q, qmax = min(state.q, self.q_limit()), self.q_limit()
        target = n * rt / (rb + rt)
        v = cfg.momentum * state.velocity + (1 - cfg.momentum) * (target - q)
        step = round(v)
        if step == 0 and abs(target - q) >= 1:
            step = int(np.sign(target - q))
        new_q = int(np.clip(q + np.clip(step, -cfg.max_q_step, cfg.max_q_step), 1, qmax))

        def cost(x: int) -> float:
            return max(x / rt, (n - x) / rb)

        if new_q == q or cost(new_q) > cost(q) * (1 - cfg.gain):
            return replace(state, q=q, velocity=v if new_q == q else v * 0.5), False
        decision = Decision(new_q, state.m, Reason.MOVE_Q, option=(new_q, state.m), gain_s=cost(q) - cost(new_q))
        return replace(state, q=new_q, velocity=v, hold=1 if new_q > q else 2, decision=decision), True

    def outer(self, state: PaperState, pred: Predictor) -> PaperState:
        """C.2: the splits within the radius at the current q, the fastest if it gains more than `gain` and is
        feasible; one replica per move."""
        q, m, r = max(state.q, 1), state.m, self.router.replicas
        rad, gain = self.config.paper.m_radius, self.config.paper.gain
        current = self._mean(state, pred, state.q, m)
        scored = sorted((self._mean(state, pred, 0 if mc == 0 else q, mc), mc)
                        for mc in range(max(0, m - rad), min(r - 1, m + rad) + 1) if mc != m)
        if not scored or scored[0][0] >= current:
            return replace(state, decision=Decision(state.q, m, Reason.STAY))
        best_t, best_m = scored[0]
        option = (0 if best_m == 0 else q, best_m)
        gain_s = current - best_t
        if best_t > current * (1 - gain):
            return replace(state, decision=Decision(state.q, m, Reason.STAY, option=option, gain_s=gain_s))
        if m > 0 and best_m > 0 and not self.feasible(state, pred, best_m, current):
            return replace(state, decision=Decision(state.q, m, Reason.INFEASIBLE, option=option, gain_s=gain_s))
        new_m = m + int(np.sign(best_m - m))
        new_q = 0 if new_m == 0 else q
        reason = Reason.LEAVE if m == 0 else Reason.RETURN if new_m == 0 else Reason.MOVE_M
        return replace(state, q=new_q, m=new_m, hold=1, velocity=0.0, rate_tail=math.nan, rate_bulk=math.nan,
                       decision=Decision(new_q, new_m, reason, option=option, gain_s=gain_s))

    def _mean(self, state: ControlState, pred: Predictor, q: int, m: int) -> float:
        """The calibrated T̂(q, m), the mean over the bootstrap pools."""
        return float(np.mean(self.times(state, pred, q, m)))
