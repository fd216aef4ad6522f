"""The step contract's one cutoff rule (`policy.step.Cutoff`): checked against a brute-force reading of the rule,
and shown to be the rule the simulator applies (the engine executor and the verl session are covered by their own
tests and by tests/test_equivalence.py)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from numpy.typing import NDArray

from conftest import make_curve
from tailsieve.policy.router import Dispatch, RouterConfig, round_robin
from tailsieve.policy.step import Cutoff, GroupRef, GroupStatus, StepPlan
from tailsieve.policy.stream import StreamState
from tailsieve.simulation.executor import SimExecutor
from tailsieve.workloads import ReplayMode, Workload


def plan_of(tail: int, bulk: int, quota: int, pinned: tuple[int, ...] = (), g: int = 2, r: int = 3) -> StepPlan:
    """A plan with uids 0..tail-1 in the tail pool (replica r-1) and the next `bulk` in the bulk pool."""
    t = tuple(GroupRef(i, f"p{i}") for i in range(tail))
    b = tuple(GroupRef(tail + i, f"p{tail + i}") for i in range(bulk))
    rr = Dispatch.REQUEST
    place = round_robin(t, (r - 1,), g, rr) | round_robin(b, tuple(range(r - 1)), g, rr) if tail else \
        round_robin(b, tuple(range(r)), g, rr)
    return StepPlan(0, t, b, place, (r - 1,) if tail else (), tuple(range(r - 1 if tail else r)), quota, False,
                    StreamState(tail + bulk, False, 0, tail + bulk), (), frozenset(pinned))


def brute_kept(plan: StepPlan, order: list[int]) -> set[int]:
    """The rule as the paper states it, read literally: tail and pinned kept; walk the bulk completions and keep
    non-pinned ones until quota − pinned are kept."""
    kept = {r.uid for r in plan.tail} | set(plan.pinned)
    free_needed = plan.bulk_quota - len(plan.pinned)
    for uid in order:
        if free_needed <= 0:
            break
        if uid in {r.uid for r in plan.bulk} and uid not in plan.pinned:
            kept.add(uid)
            free_needed -= 1
    return kept


@pytest.mark.parametrize(("tail", "bulk", "quota", "pinned"),
                         [(1, 4, 3, ()), (0, 5, 4, ()), (1, 4, 3, (2,)), (2, 5, 3, (2, 3)), (0, 3, 3, (0, 1, 2)),
                          (1, 3, 1, (1, 2))])
def test_cutoff_keeps_what_the_rule_says_for_every_completion_order(tail: int, bulk: int, quota: int,
                                                                    pinned: tuple[int, ...]) -> None:
    plan = plan_of(tail, bulk, quota, pinned)
    rule = Cutoff.of(plan)
    assert rule.need == max(quota - len(pinned), 0)
    uids = [r.uid for r in (*plan.tail, *plan.bulk)]
    for order in itertools.permutations(uids):
        kept = rule.tail | rule.pinned | set(rule.kept_bulk(order))
        assert kept == brute_kept(plan, list(order))
        for k in range(len(order) + 1):  # ready exactly when every spared group and `need` others are complete
            done = set(order[:k])
            spared = rule.tail | rule.pinned
            assert rule.ready(done) == (spared <= done and len(done - spared) >= rule.need)
            assert rule.bulk_cut(done) == (len(done - spared) >= rule.need)


def test_cutoff_counts_only_pinned_groups_of_the_bulk_pool_and_never_a_negative_need() -> None:
    plan = plan_of(1, 3, 2, pinned=(0, 1))  # uid 0 is a tail group: listed as pinned, it is not a bulk pin
    rule = Cutoff.of(plan)
    assert rule.pinned == frozenset({1}) and rule.need == 1
    assert rule.spared(0) and rule.spared(1) and not rule.spared(2)
    over = Cutoff.of(plan_of(0, 3, 1, pinned=(0, 1)))  # more pinned than the quota: nothing free is kept
    assert over.need == 0 and over.kept_bulk([2, 0, 1]) == () and over.bulk_cut(set())


class Fixed:
    """Length source: the same lengths for every generation of a prompt."""

    def __init__(self, lens: dict[str, tuple[int, ...]]) -> None:
        self.lens = lens

    def lengths(self, prompt_id: str, generation: int, step: int, group_size: int) -> NDArray[np.int64]:
        return np.array(self.lens[prompt_id], dtype=np.int64)


def test_the_simulator_keeps_exactly_the_rules_groups() -> None:
    """SimExecutor on a step whose completion order is plain (lengths far apart): the tail group, the pinned group
    and the quota − pinned = 2 shortest free bulk groups are DONE, the rest ABORTED."""
    lens = {"p0": (400, 400), "p1": (200, 200), "p2": (300, 300), "p3": (3, 3), "p4": (50, 50), "p5": (1, 2)}
    w = Workload("fixed", tuple(lens), None, ReplayMode.RECORDED, 0, Fixed(lens))
    plan = plan_of(1, 5, 3, pinned=(4,))
    res = SimExecutor(w, make_curve(), RouterConfig(groups=3, group_size=2, replicas=3, rho=1.0)).execute(plan)
    done = {o.ref.uid for o in res.outcomes if o.status is GroupStatus.DONE}
    rule = Cutoff.of(plan)
    assert done == {0, 4, 3, 5} == rule.tail | rule.pinned | set(rule.kept_bulk([5, 3, 4, 1, 2]))
    assert {o.ref.uid: o.lengths for o in res.outcomes if o.status is GroupStatus.DONE}[4] == (50, 50)
