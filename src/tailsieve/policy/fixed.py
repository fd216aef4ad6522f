"""`tailsieve-fixed`: the paper's fixed-allocation variant (§4.4), m = R/2 for the whole run; q by the paired rule
(`tailsieve_rule.py`) over that one split."""

from __future__ import annotations

from tailsieve.policy.controller_base import register
from tailsieve.policy.tailsieve_rule import TailSieveController

__all__ = ["TailSieveFixedController"]


@register("tailsieve-fixed")
class TailSieveFixedController(TailSieveController):
    """The paired rule over q at m = R // 2; never the uniform boundary."""

    def start_m(self) -> int:
        """R // 2 whatever `m0` says (q = E at the pinned redraw limit: `TailSieveController.initial`)."""
        return self.router.replicas // 2

    def m_grid(self, m: int) -> list[int]:
        """The one split."""
        return [self.router.replicas // 2]

    def placements(self) -> tuple[str, ...]:
        """None: the uniform boundary is not an option."""
        return ()
