"""`tailsieve`: one paired decision rule over every option (issue 40; docs/controller.md, "The rule").

After each steady step the options are the uniform boundary (requests dealt, or whole groups) and every tail-pool
size m of `m_grid` at its best q (`Controller.best_q`). Each is priced on the same bootstrap pools, drawn by history
step (`policy.paired`), and the controller moves to the option whose value horizon·(ḡ − z·s) − C is largest, when it
is positive; C is what the move costs once: the measured restart seconds when m changes, and for a return to the
uniform boundary the excess of its first step, which runs the E waiting candidates to completion. There is no dwell,
no confirmation and no reversal back-off: a move that was noise has, by construction, a paired gain within z·s.
C.2's feasibility stays for moves between two splits.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from tailsieve.policy.calibration import factors
from tailsieve.policy.control_state import ControlState, StepObservation
from tailsieve.policy.controller_base import register
from tailsieve.policy.decision import Decision, Reason
from tailsieve.policy.paired import Paired, paired_gain, value
from tailsieve.policy.paper import TailSievePaperController
from tailsieve.policy.predictor import FloatArray, Predictor

__all__ = ["Option", "TailSieveController"]

Option = tuple[int, int, str]  # (q, m, placement at the uniform boundary: "request" or "group"; "" for a split)


@register("tailsieve")
class TailSieveController(TailSievePaperController):
    """The paper's controller with its two loops replaced by the paired rule over (q, m) jointly."""

    def initial(self) -> ControlState:
        """(q0, m0) as the paper, but a split at the pinned redraw limit isolates every candidate from the start (the
        rule's q there, `Controller.best_q`); the uniform boundary deals requests unless a prompt prefill makes that
        costly."""
        state = super().initial()
        if state.m > 0 and self.router.max_redraws <= 1:
            state = replace(state, q=self.q_limit(), decision=Decision(self.q_limit(), state.m, Reason.START))
        return replace(state, uniform_dispatch="request" if self.prefill_s <= 0 else "group")

    def update(self, state: ControlState, obs: StepObservation) -> ControlState:
        """Learn from the step, then take the option of largest positive value (module docstring)."""
        state, pred = self.learn(state, obs)
        if obs.warmup:
            return replace(state, decision=Decision(state.q, state.m, Reason.WARMUP))
        return self.decide(state, pred)

    # hooks: the options a variant may narrow ---------------------------------------------------------------------
    def m_grid(self, m: int) -> list[int]:
        """Tail-pool sizes priced: every m of 1..R − 1 up to R = 17, else 12 spread over the range and m ± 2^i."""
        r = self.router.replicas
        if r <= 17:
            return list(range(1, r))
        ms = set(np.linspace(1, r - 1, 12).round().astype(int).tolist())
        if m > 0:
            ms |= {m + s * (1 << i) for i in range(8) for s in (-1, 1) if 1 <= m + s * (1 << i) <= r - 1} | {m}
        return sorted(ms)

    def placements(self) -> tuple[str, ...]:
        """Placements of the uniform boundary priced: dealt requests and whole groups."""
        return ("request", "group")

    # the rule --------------------------------------------------------------------------------------------------
    def options(self, state: ControlState, pred: Predictor) -> list[Option]:
        """Every option but the current one: the uniform placements and each m of `m_grid` at its best q."""
        out: list[Option] = [(0, 0, d) for d in self.placements()]
        for mc in self.m_grid(state.m):
            qc, _ = self.best_q(state, pred, mc, around=state.q if mc == state.m else None)
            out.append((qc, mc, ""))
        current = self._current(state)
        return [o for o in out if o != current]

    def _current(self, state: ControlState) -> Option:
        return (0, 0, state.uniform_dispatch) if state.m == 0 else (state.q, state.m, "")

    def cost(self, state: ControlState, pred: Predictor, option: Option) -> float:
        """One-time seconds of moving to `option`: a restart when m changes; for a return to the uniform boundary
        also its first step's excess, the E waiting candidates run to completion among its N groups."""
        _, m, dispatch = option
        c = self.move_cost(state) if m != state.m else 0.0
        if m == 0 and state.m > 0:
            dealt = dispatch == "request"
            excess = float(np.mean(pred.uniform_return_times(dealt))) - float(np.mean(pred.uniform_times(dealt)))
            c += max(0.0, excess) * factors(state)[2]
        return c

    def decide(self, state: ControlState, pred: Predictor) -> ControlState:
        """The option of largest value V = horizon·(ḡ − z·s) − C; a move when V > 0 (C.2's feasibility checked for
        moves between splits, in order of value)."""
        cfg = self.config
        cur = self._current(state)
        here = self.times(state, pred, cur[0], cur[1], cur[2] or None)
        steps = len(state.history)
        scored: list[tuple[float, Option, Paired]] = []
        for opt in self.options(state, pred):
            g, se, dof = paired_gain(here, self._option_times(state, pred, opt), steps)
            p = value(g, se, dof, self.cost(state, pred, opt), cfg.z, cfg.horizon)
            scored.append((p.value_s, opt, p))
        scored.sort(key=lambda x: (-x[0], x[1][1], x[1][0]))
        if not scored:
            return replace(state, decision=Decision(state.q, state.m, Reason.STAY))
        deadline = float(np.mean(here))
        refused: tuple[Option, Paired] | None = None
        for v, opt, p in scored:
            if v <= 0:
                break
            m = opt[1]
            if state.m > 0 and m > 0 and m != state.m and not self.feasible(state, pred, m, deadline):
                refused = refused or (opt, p)
                continue
            return self._move(state, opt, p)
        if refused is not None:
            return replace(state, decision=self._decision(state, Reason.INFEASIBLE, *refused))
        v, opt, p = scored[0]
        if not math.isfinite(v):  # fewer than two history steps: nothing to compare on yet
            return replace(state, decision=Decision(state.q, state.m, Reason.STAY))
        unpaid = [(o, x) for _, o, x in scored if x.beyond_noise]  # beyond noise, not worth its cost
        if unpaid:
            return replace(state, decision=self._decision(state, Reason.UNPAID, *unpaid[0]))
        return replace(state, decision=self._decision(state, Reason.STAY, opt, p))

    def _option_times(self, state: ControlState, pred: Predictor, opt: Option) -> FloatArray:
        q, m, dispatch = opt
        return self.times(state, pred, q, m, dispatch or None)

    def _move(self, state: ControlState, opt: Option, p: Paired) -> ControlState:
        q, m, dispatch = opt
        if m == 0:
            reason = Reason.RETURN if state.m > 0 else Reason.PLACEMENT
            return replace(state, q=0, m=0, uniform_dispatch=dispatch,
                           decision=self._decision(state, reason, opt, p, (0, 0)))
        reason = Reason.LEAVE if state.m == 0 else Reason.MOVE_M if m != state.m else Reason.MOVE_Q
        return replace(state, q=q, m=m, decision=self._decision(state, reason, opt, p, (q, m)))

    @staticmethod
    def _decision(state: ControlState, reason: Reason, opt: Option, p: Paired,
                  to: tuple[int, int] | None = None) -> Decision:
        q, m = to if to is not None else (state.q, state.m)
        return Decision(q, m, reason, option=(opt[0], opt[1]), gain_s=p.gain_s, se_s=p.se_s, cost_s=p.cost_s)
