"""`SampleWeights` (engines/rollout/sample_weights.py): a rollout's opt-in bias-correction weights per consumed group
(`analysis.weights`): None when off; exactly 1 when nothing was cut; with first attempts cut at long progress, the
long consumed groups weigh more than the short ones (mean 1); the window moves only on `commit` (a refused step
leaves it as it was). The estimator itself: tests/test_weights.py."""

from __future__ import annotations

import pytest

from tailsieve.analysis.weights import WeightState
from tailsieve.engines.rollout.sample_weights import SampleWeights
from tailsieve.policy.step import GroupOutcome, GroupRef, GroupStatus, Pool


def done(uid: int, length: int, cuts: int = 0) -> GroupOutcome:
    return GroupOutcome(GroupRef(uid, f"p{uid}", cuts), Pool.BULK, GroupStatus.DONE, 1.0, (length, length // 2), 2)


def cut(uid: int, progress: int) -> GroupOutcome:
    return GroupOutcome(GroupRef(uid, f"p{uid}"), Pool.BULK, GroupStatus.ABORTED, None, (progress, 3), 0)


CONSUMED = (done(0, 10), done(1, 20), done(2, 30), done(3, 400))


def test_off_every_weight_is_none_and_the_window_stays() -> None:
    w = SampleWeights(False)
    window, weights = w.weigh((*CONSUMED, cut(4, 300)), CONSUMED)
    assert w.weigher is None and weights == [None] * 4 and window is w.window == WeightState()


def test_without_a_cut_every_weight_is_exactly_one() -> None:
    w = SampleWeights(True)
    window, weights = w.weigh(CONSUMED, CONSUMED)
    assert weights == [1.0] * 4 and len(window.history) == 1


def test_cut_first_attempts_weigh_long_groups_up_and_the_window_moves_only_on_commit() -> None:
    w = SampleWeights(True)
    outcomes = (*CONSUMED, cut(4, 300), cut(5, 350))
    window, weights = w.weigh(outcomes, CONSUMED)
    assert all(isinstance(x, float) for x in weights)
    ws = [float(x or 0.0) for x in weights]
    assert sum(ws) / len(ws) == pytest.approx(1.0)
    assert ws[3] > 1.0 > ws[0]  # the long group stands for the cut ones
    assert w.window == WeightState()  # not before commit: a refused step runs again on the same window
    assert w.weigh(outcomes, CONSUMED)[1] == weights
    w.commit(window)
    assert w.window is window and len(w.window.history) == 1
