"""`tailsieve-fixed`: the paper's fixed-allocation variant (§4.4), m = R/2 for the whole run; q by the paired rule
(`paired_rule.py`) over that one split, never the uniform boundary."""

from __future__ import annotations

from dataclasses import replace

from tailsieve.policy import paired_rule
from tailsieve.policy.control_state import ControlState, StepObservation
from tailsieve.policy.controller_base import Controller
from tailsieve.policy.decision import Decision, Reason
from tailsieve.policy.paired_rule import Option
from tailsieve.policy.predictor import Predictor

__all__ = ["TailSieveFixedController"]


class TailSieveFixedController(Controller):
    """The paired rule over q at m = R // 2; never the uniform boundary."""

    def start_m(self) -> int:
        """R // 2 whatever `m0` says."""
        return self.router.replicas // 2

    def initial(self) -> ControlState:
        """(q0, R // 2), q = E under the pinned redraw limit (`paired_rule.initial`)."""
        return paired_rule.initial(self, super().initial())

    def update(self, state: ControlState, obs: StepObservation) -> ControlState:
        """Learn from the step, then the paired rule over the one split's q."""
        state, pred = self.learn(state, obs)
        if obs.warmup:
            return replace(state, decision=Decision(state.q, state.m, Reason.WARMUP))
        return self.decide(state, pred)

    def m_grid(self, m: int) -> list[int]:
        """The one split."""
        return [self.router.replicas // 2]

    def placements(self) -> tuple[str, ...]:
        """None: the uniform boundary is not an option."""
        return ()

    def options(self, state: ControlState, pred: Predictor) -> list[Option]:
        """The one split at its best q, unless it is the current option (`paired_rule.options`)."""
        return paired_rule.options(self, state, pred, self.m_grid(state.m), self.placements())

    def cost(self, state: ControlState, pred: Predictor, option: Option) -> float:
        """One-time seconds of moving to `option` (`paired_rule.move_cost`)."""
        return paired_rule.move_cost(self, state, pred, option)

    def decide(self, state: ControlState, pred: Predictor) -> ControlState:
        """The option of largest value, a move when it is positive (`paired_rule.decide`)."""
        return paired_rule.decide(self, state, pred, self.options(state, pred), self.cost)
