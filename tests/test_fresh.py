"""The controller's fresh-work sample (`policy.fresh`): the step's fresh groups, cut members completed by censored
resampling from lengths at least as long (issue 22: a consumed batch under-states fresh work where the cut groups'
regenerations are shorter than what was cut)."""

from __future__ import annotations

import numpy as np

from tailsieve.policy.control_state import StepWork
from tailsieve.policy.fresh import fresh_sample


def work(*, lengths: list[list[int]], tail: int, kept: list[bool], fresh: list[bool], finished: list[int]
         ) -> StepWork:
    a = np.array(lengths, dtype=np.int64)
    return StepWork(a, np.zeros_like(a), tail, np.array(kept), np.array(fresh), np.array(finished, dtype=np.int64))


def test_tail_groups_and_returning_candidates_are_not_fresh_work() -> None:
    w = work(lengths=[[9, 9], [5, 6], [1, 2], [3, 4]], tail=1, kept=[True, True, True, True],
             fresh=[False, False, True, True], finished=[2, 2, 2, 2])
    assert fresh_sample(w, (), 0).tolist() == [[1, 2], [3, 4]]
    none = work(lengths=[[9, 9]], tail=0, kept=[True], fresh=[False], finished=[2])
    assert fresh_sample(none, (), 0) is None


def test_a_cut_members_length_is_drawn_from_lengths_at_least_its_progress() -> None:
    """Group 2 was cut with one member finished (10 tokens) and one at 500: the finished (shortest) member keeps
    its 10, the other is drawn from the step's and history's member lengths ≥ 500: {600, 900} (never below 500)."""
    w = work(lengths=[[100, 120], [10, 500]], tail=0, kept=[True, False], fresh=[True, True], finished=[2, 1])
    hist = (np.array([[600, 20], [900, 30]], dtype=np.int64),)
    draws = {tuple(fresh_sample(w, hist, step)[1].tolist()) for step in range(40)}
    assert draws == {(10, 600), (10, 900)}
    assert fresh_sample(w, hist, 3).tolist() == fresh_sample(w, hist, 3).tolist()  # seeded by the step
    lone = work(lengths=[[100, 120], [700, 800]], tail=0, kept=[True, False], fresh=[True, True], finished=[2, 0])
    assert fresh_sample(lone, (), 0)[1].tolist() == [700, 800]  # nothing that long seen: the progress itself
