"""The controllers (§3.2, App. C), pure: a frozen `ControlState` and a `StepObservation` in, a new state out, its
`Decision` (reason as data) attached. Registry `CONTROLLERS` (name → class, filled by `@register`):

| name | file | q | m |
|---|---|---|---|
| `uniform` | here | 0 | 0 |
| `static` | here | fixed | fixed |
| `tailsieve-paper` | `paper.py` | C.1's rate balance | C.2's radius, one replica per move |
| `tailsieve` | `tailsieve_rule.py` | the paired rule over every m at its best q and the uniform boundary ||
| `tailsieve-fixed` | `fixed.py` | the paired rule | R/2, never moves |

`Controller` holds what every adaptive policy shares: learning from a step (`learn`: the response-work history, the
model error, the price of a pool move) and pricing an option on the predictor (`times`, `best_q`, `feasible`). A
policy implements one method, `update`.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import ClassVar

from tailsieve.inputs import check_tail_replicas
from tailsieve.policy.control_state import ControllerConfig, ControlState, StepObservation
from tailsieve.policy.controller_base import CONTROLLERS, Controller, register
from tailsieve.policy.decision import Decision, Reason

__all__ = ["CONTROLLERS", "ControlState", "Controller", "ControllerConfig", "Decision", "Reason", "StepObservation",
           "TailSieveController", "TailSieveFixedController", "TailSievePaperController", "register"]


@register("uniform")
class UniformController(Controller):
    """Uniform group routing: (q, m) = (0, 0) forever."""

    min_replicas: ClassVar[int] = 1

    def initial(self) -> ControlState:
        """Always the uniform boundary."""
        return ControlState(q=0, m=0, decision=Decision(0, 0, Reason.FIXED))

    def update(self, state: ControlState, obs: StepObservation) -> ControlState:
        """Nothing to adapt."""
        return replace(state, decision=Decision(state.q, state.m, Reason.FIXED))


@register("static")
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


# the adaptive policies, one file each, registered after the two above (the registry lists names in this order)
from tailsieve.policy.fixed import TailSieveFixedController  # noqa: E402
from tailsieve.policy.paper import TailSievePaperController  # noqa: E402
from tailsieve.policy.tailsieve_rule import TailSieveController  # noqa: E402
