"""`static`: a fixed (q, m) the user chooses (`--q`, `--m`), never moved."""

from __future__ import annotations

import math
from dataclasses import replace

from tailsieve.inputs import check_tail_replicas
from tailsieve.policy.control_state import ControlState, StepObservation
from tailsieve.policy.controller_base import Controller
from tailsieve.policy.decision import Decision, Reason

__all__ = ["StaticController"]


class StaticController(Controller):
    """A fixed (q, m) chosen by the user."""

    def initial(self) -> ControlState:
        """The user's (q, m); defaults q = ⌈E/2⌉, m = R // 4 (at least 1)."""
        r = self.router.replicas
        q = self.fixed_q if self.fixed_q is not None else max(1, math.ceil(self.router.extra / 2))
        m = self.fixed_m if self.fixed_m is not None else max(1, r // 4)
        if r >= 2:
            check_tail_replicas(m, r)
        m = m if r >= 2 else 0
        return ControlState(q=q, m=m, decision=Decision(q, m, Reason.FIXED))

    def update(self, state: ControlState, obs: StepObservation) -> ControlState:
        """Nothing to adapt."""
        return replace(state, decision=Decision(state.q, state.m, Reason.FIXED))
