"""The outer loop (§3.2, App. C.2): which tail-pool size m to run next, and when to leave or return to the uniform
boundary. A mixin of `Controller` (`policy/controller.py`), pure like it: a frozen state and the predictor in, a new
state out. The flags that switch `tailsieve`'s rules beyond C.2 on (`jump_from_uniform`, `guard_reversal`,
`price_return`, `choose_placement`, `scan_m`, `noise_gate`) are class variables of `Controller`.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import ClassVar

import numpy as np

from tailsieve.policy.calibration import factors, forecast_noise, history_variance
from tailsieve.policy.control_state import ControllerConfig, ControlState
from tailsieve.policy.predictor import Predictor
from tailsieve.policy.router import RouterConfig

__all__ = ["OuterLoop"]


class OuterLoop:
    """C.2 and its extensions; the inner loop's pieces it prices moves with (`best_q`, `_calibrated`) are
    `Controller`'s."""

    router: RouterConfig
    config: ControllerConfig
    jump_from_uniform: ClassVar[bool]
    guard_reversal: ClassVar[bool]
    price_return: ClassVar[bool]
    choose_placement: ClassVar[bool]
    scan_m: ClassVar[bool]
    noise_gate: ClassVar[bool]
    by_step: ClassVar[bool]

    def _calibrated(self, state: ControlState, pred: Predictor, q: int, m: int) -> float:
        """The calibrated forecast T̂(q, m) (`Controller._calibrated`)."""
        raise NotImplementedError

    def best_q(self, state: ControlState, pred: Predictor, m: int, *, coarse: bool = False) -> tuple[int, float]:
        """argmin_q T̂(q, m) and its value (`Controller.best_q`, the inner loop's target)."""
        raise NotImplementedError

    def move_cost(self, state: ControlState) -> float:
        """Seconds a pool move costs: the measured restart EMA, else the configured prior."""
        return self.config.move_cost_s if math.isnan(state.move_cost_s) else state.move_cost_s

    def m_candidates(self, m: int) -> list[int]:
        """Tail-pool sizes the outer loop scores from m: C.2's radius around m and, with `scan_m`, the whole range
        1..R − 1 (every m up to 16 replicas, else a grid of 12 plus the radius): from the uniform boundary the best
        split of a large fleet is far beyond the radius (m = 16–24 of R = 64)."""
        r, rad = self.router.replicas, self.config.m_radius
        near = set(range(max(1, m - rad), min(r - 1, m + rad) + 1))
        if self.scan_m:
            near |= set(range(1, r)) if r <= 17 else set(np.linspace(1, r - 1, 12).round().astype(int).tolist())
        return sorted(near - {m})

    def m_step(self, distance: int = 0) -> int:
        """Most replicas one move between two-pool splits shifts toward a split `distance` replicas away: 1 on small
        fleets, R/16 on large ones (the whole range is then crossed in a bounded number of decisions); where the
        range is scanned on a grid (R > 17, `m_candidates`) also half the distance, so that a move is never finer
        than the search that chose its target and a far target is reached in log₂ steps, never overshot."""
        r = self.router.replicas
        if not self.scan_m:
            return 1
        base = max(1, -(-r // 16))
        return max(base, distance // 2) if r > 17 else base

    def uniform_option(self, state: ControlState, pred: Predictor) -> tuple[float, str]:
        """The calibrated uniform forecast T̂(0, 0) and its placement: with `choose_placement`, whichever of
        dealing requests or whole groups forecasts faster (prefill per distinct prompt per replica included)."""
        if not self.choose_placement:
            return self._calibrated(state, pred, 0, 0), state.uniform_dispatch
        return min((self._calibrated(replace(state, uniform_dispatch=d), pred, 0, 0), d) for d in ("request", "group"))

    def outer(self, state: ControlState, pred: Predictor) -> ControlState:
        """C.2: candidate splits (`m_candidates`) plus (0, 0); feasibility G_tail(m) ≥ D_bulk(m); moves of at most
        `m_step` replicas between splits."""
        q, m = state.q, state.m
        t_uniform, dealt = self.uniform_option(state, pred)
        state = replace(state, uniform_dispatch=dealt)
        current = t_uniform if m == 0 else self._calibrated(state, pred, q, m)
        options: list[tuple[float, int, int]] = [(current, q, m)]
        if m > 0 and state.dwell >= self.config.min_dwell:
            options.append((t_uniform, 0, 0))
        # a return to uniform is not reversed before `min_dwell` uniform steps either: a round trip costs a return
        # step and a warm-up, and one that soon follows the return is chasing the forecast's noise (kodcode-tests)
        settling = self.guard_reversal and m == 0 and state.returns > 0 and state.dwell < self.config.min_dwell
        for mc in () if settling else self.m_candidates(m):
            if self.guard_reversal and m > 0 and np.sign(mc - m) == -state.move_dir \
                    and state.since_move < self.reversal_dwell(state):
                continue  # no reversal of the last move before its dwell: its forecast is not yet calibrated
            qc, tc = self.split_q(state, pred, mc)
            options.append((tc, qc, mc))
        # the fastest option that is feasible; C.2's feasibility (a bisection per split) is tested in that order,
        # only until one passes: the same choice as testing every split first
        best_t, best_q, best_m = next(o for o in sorted(options)
                                      if o[2] in (m, 0) or m == 0 or self.feasible(state, pred, q, m, o[2], current))
        if best_m == m:
            return self._no_leave(state, self._stay_note(state, settling))
        gate = self.leave_gain(state, pred, best_q, best_m) if m == 0 else self.config.m_gain
        if best_t > current * (1 - gate):
            return self._no_leave(state, self._stay_note(state, settling, (best_q, best_m, 1 - best_t / current, gate)))
        if m == 0 and state.leave_streak + 1 < self.leave_confirm(state):
            return replace(state, leave_streak=state.leave_streak + 1,
                           note=f"m 0->{best_m} passed the leave test {state.leave_streak + 1} time(s) in a row")
        if (current - best_t) * self.config.move_horizon < self.move_cost(state):
            return replace(state, note=f"m {m}->{best_m} would not repay its restart")
        if best_m == 0 and (current - best_t) * self.config.move_horizon < self.return_cost(state, pred):
            return replace(state, note=f"m {m}->0 would not repay the waiting candidates")
        step = int(np.sign(best_m - m))
        # bounded moves between splits; leaving uniform goes straight to the best split: the next step is a
        # warm-up on all replicas whatever m is, and an intermediate split would only cost steps at a worse m
        jump = (m == 0 or best_m == 0) and self.jump_from_uniform
        new_m = best_m if jump else m + step * min(abs(best_m - m), self.m_step(abs(best_m - m)))
        new_q = 0 if new_m == 0 else self.q_after_move(state, pred, new_m, best_q if new_m == best_m else None)
        between = new_m > 0 and m > 0
        return replace(
            state,
            m=new_m,
            q=new_q,
            hold=1,
            dwell=0 if (new_m == 0) != (m == 0) else state.dwell,
            move_dir=step if between else 0,
            reversals=state.reversals + 1 if between and step == -state.move_dir else 0,
            returns=state.returns + 1 if new_m == 0 else state.returns,
            since_move=0,
            leave_streak=0,
            velocity=0.0,
            settled=0,
            rate_tail=math.nan,
            rate_bulk=math.nan,
            note=f"m {m}->{new_m}",
        )

    def leave_gain(self, state: ControlState, pred: Predictor | None = None, q: int = 0, m: int = 0) -> float:
        """Least forecast gain for leaving the uniform boundary for (q, m): `m_gain` and, with `noise_gate`, the
        forecasts' noise (`calibration.forecast_noise`, its history term measured on the predictor's pools by
        `history_variance` when `pred` is given). Uniform with dealt requests is what a user runs already; a split
        whose forecast gain is within the noise of the forecasts is a coin toss that costs a warm-up and, when it
        loses, a return (kodcode-tests: two round trips in 30 steps, 4.5% of the run)."""
        gain = self.config.m_gain
        if not self.noise_gate:
            return gain
        history = None
        if pred is not None and m > 0:
            ct, cb, cu = factors(state)
            split = pred.split_times(q, m, ct, cb) * math.exp(state.bias_step)
            uniform = pred.uniform_times(state.uniform_dispatch == "request") * cu
            history = history_variance(split, uniform, len(state.history) if self.by_step else 0)
        return max(gain, forecast_noise(state, self.config.bias_ema, history))

    def _stay_note(self, state: ControlState, settling: bool,
                   missed: tuple[int, int, float, float] | None = None) -> str:
        """Why a decision at the uniform boundary stays there (empty in a split): `min_dwell` holds a return, no
        split forecasts faster, or `missed` = (q, m, forecast gain, gate): the best split's gain is within the gate."""
        if state.m > 0:
            return ""
        if missed is not None:
            q, m, gain, gate = missed
            return f"stay uniform: ({q}, {m}) forecasts {gain:+.1%}, within the {gate:.1%} gate"
        if settling:
            return f"stay uniform: {state.dwell} of {self.config.min_dwell} steps since the return"
        return "stay uniform: no split forecasts faster"

    @staticmethod
    def _no_leave(state: ControlState, why: str = "") -> ControlState:
        """`state` after a decision that does not leave the uniform boundary on its forecasts, its note `why`: a
        leave test passed on earlier decisions in a row (`leave_streak`) is not confirmed, and its count starts
        over."""
        if state.m > 0 or state.leave_streak == 0:
            return replace(state, note=why) if why else state
        note = f"leave not confirmed ({state.leave_streak} pass(es) in a row)"
        return replace(state, leave_streak=0, note=f"{note}; {why}" if why else note)

    def leave_confirm(self, state: ControlState) -> int:
        """Decisions in a row the leave test must pass before the uniform boundary is left: 1 until the first
        return, then `leave_confirm` (`tailsieve`, `guard_reversal`). The test is taken every uniform step, so on
        an optimum flatter than the forecasts' noise one step's forecast passes it now and then; a return is the
        evidence that such a leave was a coin toss (a warm-up, a stint and a return step later the split was not
        faster), and after one a leave must hold on consecutive steps' forecasts."""
        return self.config.leave_confirm if self.guard_reversal and state.returns > 0 else 1

    def return_cost(self, state: ControlState, pred: Predictor) -> float:
        """One-time seconds of returning to uniform from a split: the first uniform step also runs the E waiting
        candidates to completion (T̂ of `Predictor.uniform_return_times` over the steady T̂(0, 0), calibrated as
        the uniform boundary). A return must repay it within `move_horizon` steps, like a restart."""
        if not self.price_return:
            return 0.0
        cu = factors(state)[2]
        dealt = state.uniform_dispatch == "request"
        steady = float(np.mean(pred.uniform_times(dealt)))
        return max(0.0, float(np.mean(pred.uniform_return_times(dealt))) - steady) * cu

    def reversal_dwell(self, state: ControlState) -> int:
        """Steps after a move of m before it may be reversed: `min_dwell`, doubled for every reversal in a row
        (A → B → A → …). A split that keeps flipping between two neighbours is chasing the step-to-step noise of its
        calibration (each side's factors are learnt at the other side), not the workload: back off, hold."""
        return self.config.min_dwell << min(state.reversals, 8)

    # hooks of the outer loop (C.2); defaults: the predictive choice of q ----------------------------------------
    def split_q(self, state: ControlState, pred: Predictor, m: int) -> tuple[int, float]:
        """The q a candidate split with m tail replicas would run, and its calibrated T̂(q, m) (a coarse q grid for
        splits beyond C.2's radius of the current one)."""
        return self.best_q(state, pred, m, coarse=abs(m - state.m) > self.config.m_radius)

    def q_after_move(self, state: ControlState, pred: Predictor, new_m: int, best: int | None) -> int:
        """q after the outer loop moves one replica to `new_m` > 0 (`best`: the candidate split's q, when the move
        reaches that split)."""
        return best if best is not None else self.best_q(state, pred, new_m)[0]

    def feasible(self, state: ControlState, pred: Predictor, q: int, m: int, mc: int, deadline: float) -> bool:
        """C.2 deadline feasibility at the current predicted barrier: the pool gaining a replica must absorb at least
        the groups the losing pool can no longer finish by the deadline (G_tail(m) ≥ D_bulk(m), or mirrored)."""
        n = self.router.groups
        ct, cb, _ = factors(state)
        if mc > m:
            qmax = min(n - 1, 4 * self.router.extra + 4)
            gained = max(0, pred.tail_capacity(deadline / ct, mc, qmax) - q)
            dropped = max(0, (n - q) - pred.bulk_capacity(deadline / cb, q, mc))
        else:
            gained = max(0, pred.bulk_capacity(deadline / cb, q, mc) - (n - q))
            dropped = max(0, q - pred.tail_capacity(deadline / ct, mc, q))
        return gained >= dropped
