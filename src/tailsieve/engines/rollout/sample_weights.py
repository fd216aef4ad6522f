"""Opt-in bias-correction weights of a `Rollout`'s consumed groups (`RolloutConfig.bias_correction`,
`tailsieve.analysis.weights`, docs/simulate.md "Bias correction"): each step's outcomes update a window of the last
steps' observations, and every consumed group gets a weight (mean 1 over the batch). The window advances only when
the step is consumed, and is not saved (it refills after a resume). Off: every weight is None."""

from __future__ import annotations

from collections.abc import Sequence

from tailsieve.analysis.weights import BiasWeights, WeightState, observe
from tailsieve.policy.step import GroupOutcome

__all__ = ["SampleWeights"]


class SampleWeights:
    """The weigher and its window (see the module docstring)."""

    def __init__(self, on: bool) -> None:
        self.weigher = BiasWeights() if on else None
        self.window = WeightState()

    def weigh(self, outcomes: Sequence[GroupOutcome],
              consumed: Sequence[GroupOutcome]) -> tuple[WeightState, list[float | None]]:
        """The window after this step and one weight per consumed group (None each when off); nothing is kept until
        `commit`."""
        if self.weigher is None:
            return self.window, [None] * len(consumed)
        window, w = self.weigher.update(self.window, observe(outcomes, consumed))
        return window, [float(x) for x in w]

    def commit(self, window: WeightState) -> None:
        """The step was consumed: its window is the run's."""
        self.window = window
