"""`uniform`: uniform group routing, (q, m) = (0, 0) forever (the paper's baseline, §4)."""

from __future__ import annotations

from dataclasses import replace
from typing import ClassVar

from tailsieve.policy.control_state import ControlState, StepObservation
from tailsieve.policy.controller_base import Controller
from tailsieve.policy.decision import Decision, Reason

__all__ = ["UniformController"]


class UniformController(Controller):
    """Uniform group routing: (q, m) = (0, 0) forever."""

    min_replicas: ClassVar[int] = 1

    def initial(self) -> ControlState:
        """Always the uniform boundary."""
        return ControlState(q=0, m=0, decision=Decision(0, 0, Reason.FIXED))

    def update(self, state: ControlState, obs: StepObservation) -> ControlState:
        """Nothing to adapt."""
        return replace(state, decision=Decision(state.q, state.m, Reason.FIXED))
