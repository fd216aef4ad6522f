"""`tailsieve`: the paired decision rule (`paired_rule.py`; docs/controller.md, "The rule") over every option: the
uniform boundary, dealt by request or by whole group, and every tail-pool size m of `m_grid` at its best q."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from tailsieve.policy import paired_rule
from tailsieve.policy.control_state import ControlState, StepObservation
from tailsieve.policy.controller_base import Controller
from tailsieve.policy.decision import Decision, Reason
from tailsieve.policy.paired_rule import Option
from tailsieve.policy.predictor import Predictor

__all__ = ["Option", "TailSieveController"]


class TailSieveController(Controller):
    """The paired rule over (q, m) jointly and the uniform boundary's placement."""

    def initial(self) -> ControlState:
        """`Controller.initial`, q = E at a split under the pinned redraw limit, requests dealt at the uniform
        boundary unless a prefill makes that costly (`paired_rule.initial`)."""
        return paired_rule.initial(self, super().initial())

    def update(self, state: ControlState, obs: StepObservation) -> ControlState:
        """Learn from the step, then take the option of largest positive value (`paired_rule.decide`)."""
        state, pred = self.learn(state, obs)
        if obs.warmup:
            return replace(state, decision=Decision(state.q, state.m, Reason.WARMUP))
        return self.decide(state, pred)

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

    def options(self, state: ControlState, pred: Predictor) -> list[Option]:
        """Every option but the current one (`paired_rule.options` over `m_grid` and `placements`)."""
        return paired_rule.options(self, state, pred, self.m_grid(state.m), self.placements())

    def cost(self, state: ControlState, pred: Predictor, option: Option) -> float:
        """One-time seconds of moving to `option` (`paired_rule.move_cost`)."""
        return paired_rule.move_cost(self, state, pred, option)

    def decide(self, state: ControlState, pred: Predictor) -> ControlState:
        """The option of largest value, a move when it is positive (`paired_rule.decide`)."""
        return paired_rule.decide(self, state, pred, self.options(state, pred), self.cost)
