"""`tailsieve-fixed`: the paper's fixed-allocation variant (§4.4), m = R/2 for the whole run; q by the paired rule
(`tailsieve_rule.py`) over that one split."""

from __future__ import annotations

from dataclasses import replace

from tailsieve.policy.control_state import ControlState
from tailsieve.policy.controller_base import register
from tailsieve.policy.decision import Decision, Reason
from tailsieve.policy.tailsieve_rule import TailSieveController

__all__ = ["TailSieveFixedController"]


@register("tailsieve-fixed")
class TailSieveFixedController(TailSieveController):
    """The paired rule over q at m = R // 2; never the uniform boundary."""

    def initial(self) -> ControlState:
        """(q0, R // 2); q = E at the pinned redraw limit (`TailSieveController.initial`)."""
        r = self.router.replicas
        m = r // 2 if r >= 2 else 0
        q = self.q_limit() if m > 0 and self.router.max_redraws <= 1 else max(self.config.q0, 1)
        return replace(super().initial(), q=q, m=m, decision=Decision(q, m, Reason.START))

    def m_grid(self, m: int) -> list[int]:
        """The one split."""
        return [self.router.replicas // 2]

    def placements(self) -> tuple[str, ...]:
        """None: the uniform boundary is not an option."""
        return ()
