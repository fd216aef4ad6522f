"""Router (§3.1): plan shapes, dispatch, queue order, candidate ranking, and the exactly-once contract, property-tested
over hundreds of simulated steps with random N, G, R, ρ, dispatch and policies."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import make_curve
from tailsieve.errors import ConfigError
from tailsieve.loop import StepLoop
from tailsieve.policy.controller import CONTROLLERS, Controller, ControllerConfig, ControlState, StepObservation
from tailsieve.policy.ranking import RANKINGS, ranking
from tailsieve.policy.router import Dispatch, Router, RouterConfig, RouterState, pool_split
from tailsieve.policy.step import GroupOutcome, GroupRef, GroupStatus, InvariantError, Pool, StepPlan, StepResult
from tailsieve.registry import PluginError
from tailsieve.simulation.executor import SimExecutor
from tailsieve.simulation.replica import ReplicaConfig
from test_sim import fake_workload

CURVE = make_curve()
WL = fake_workload(60)


def warm(rc: RouterConfig) -> tuple[Router, SimExecutor, RouterState]:
    """Router, executor and the state after one warm-up step."""
    router, ex = Router(rc, WL.prompts), SimExecutor(WL, CURVE, rc)
    s0 = router.initial_state()
    plan = router.plan(s0, 1, 1)
    return router, ex, router.observe(s0, plan, ex.execute(plan))


def test_extra_and_config_errors() -> None:
    assert RouterConfig(groups=64, rho=0.1).extra == 7
    assert RouterConfig(groups=64, rho=0.05).extra == 4
    assert RouterConfig(groups=10, rho=0.0).extra == 0
    for kw in ({"groups": 0}, {"group_size": 0}, {"replicas": 0}, {"rho": 1.5}, {"rho": float("nan")}):
        with pytest.raises(ConfigError):
            RouterConfig(**kw)  # type: ignore[arg-type]
    router = Router(RouterConfig(replicas=4), WL.prompts)
    with pytest.raises(ConfigError, match=r"^m must lie in 0..3 \(R=4 replicas\), got m=4$"):
        router.plan(router.initial_state(), 1, 4)


@pytest.mark.parametrize("dispatch", list(Dispatch))
def test_dispatch_by_request_or_by_group(dispatch: Dispatch) -> None:
    rc = RouterConfig(groups=6, group_size=3, replicas=4, rho=0.5, dispatch=dispatch)
    router = Router(rc, WL.prompts)
    plan = router.plan(router.initial_state(), 1, 1)
    assert plan.warmup and len(plan.bulk) == 9
    got = [plan.placement[r.uid] for r in plan.bulk]
    if dispatch is Dispatch.GROUP:  # whole groups round-robin: a prompt's prefix stays on one replica
        assert got == [(i % 4,) * 3 for i in range(9)]
    else:  # request round-robin continuing across groups (§3.1)
        assert got == [tuple((3 * i + j) % 4 for j in range(3)) for i in range(9)]
    router2, _, state = warm(rc)
    plan = router2.plan(state, 2, 2)
    tail = [plan.placement[r.uid] for r in plan.tail]
    bulk = [plan.placement[r.uid] for r in plan.bulk]
    assert {x for t in tail for x in t} <= {2, 3} and {x for b in bulk for x in b} <= {0, 1}
    if dispatch is Dispatch.REQUEST:
        assert tail == [(2, 3, 2), (3, 2, 3)]
    else:
        assert tail == [(2, 2, 2), (3, 3, 3)]


def test_uniform_plan_is_group_atomic_and_requeues_candidates() -> None:
    rc = RouterConfig(groups=8, group_size=4, replicas=3, rho=0.25)
    router, _, state = warm(rc)
    plan = router.plan(state, 0, 0)
    assert not plan.warmup and plan.q == 0 and plan.m == 0 and plan.bulk_quota == 8
    assert list(plan.bulk[:2]) == list(state.candidates)  # waiting candidates run first
    assert all(len(set(plan.placement[r.uid])) == 1 for r in plan.bulk)


def test_warmup_runs_n_plus_e_and_cuts_at_n() -> None:
    rc = RouterConfig(groups=10, group_size=3, replicas=4, rho=0.3)
    router, ex = Router(rc, WL.prompts), SimExecutor(WL, CURVE, rc)
    s0 = router.initial_state()
    plan = router.plan(s0, 5, 2)
    assert plan.warmup and plan.q == 0 and plan.m == 0 and plan.bulk_replicas == (0, 1, 2, 3)
    assert len(plan.bulk) == 13 and plan.bulk_quota == 10
    assert [r.uid for r in plan.bulk] == list(range(13))
    res = ex.execute(plan)
    done_at = sorted(o.finish_s or 0.0 for o in res.outcomes if o.status is GroupStatus.DONE)
    assert len(done_at) == 10 and res.bulk_s == done_at[-1] and res.tail_s == 0.0
    state = router.observe(s0, plan, res)
    assert len(state.candidates) == 3 and state.consumed == 10 and all(c.cuts == 1 for c in state.candidates)


def test_steady_step_composition() -> None:
    rc = RouterConfig(groups=10, group_size=2, replicas=5, rho=0.3)
    router, ex, state = warm(rc)
    plan = router.plan(state, 2, 2)
    assert not plan.warmup and plan.q == 2 and plan.m == 2
    assert plan.tail == state.candidates[:2]
    assert len(plan.bulk) == 10 - 2 + 3 and plan.bulk_quota == 10 - 2
    assert plan.tail_replicas == (3, 4) and plan.bulk_replicas == (0, 1, 2)
    res = ex.execute(plan)
    nxt = router.observe(state, plan, res)
    aborted = {o.ref.uid for o in res.outcomes if o.status is GroupStatus.ABORTED}
    assert {c.uid for c in nxt.candidates} == aborted and len(aborted) == 3
    assert nxt.consumed == state.consumed + 10
    # q is capped by the candidates available and never below 1 on a two-pool step
    assert router.plan(state, 50, 2).q == 3
    assert router.plan(state, 0, 2).q == 1


def test_non_isolated_candidates_go_to_the_front_of_the_queue() -> None:
    rc = RouterConfig(groups=8, group_size=2, replicas=4, rho=0.5)
    router = Router(rc, WL.prompts)
    cands = tuple(GroupRef(100 + i, f"p{i}", cuts=1) for i in range(5))
    waiting = (GroupRef(200, "p9"),)
    state = RouterState(step=3, stream=router.initial_state().stream, requeue=waiting, candidates=cands)
    plan = router.plan(state, 2, 1)
    assert plan.tail == cands[:2]
    assert plan.bulk[:3] == cands[2:]  # same refs: their cut counts carry on
    assert plan.bulk[3] == waiting[0]
    assert [r.uid for r in plan.bulk[4:]] == list(range(6))  # then fresh draws from the stream
    assert len(plan.bulk) == 8 - 2 + 4


def test_candidates_ranked_by_least_progress() -> None:
    rc = RouterConfig(groups=2, group_size=2, replicas=2, rho=1.0)
    router = Router(rc, WL.prompts)
    s0 = router.initial_state()
    plan = router.plan(s0, 1, 1)  # warm-up: uids 0..3, quota 2
    assert [r.uid for r in plan.bulk] == [0, 1, 2, 3]
    refs = plan.bulk
    outs = (
        GroupOutcome(refs[0], Pool.BULK, GroupStatus.DONE, 1.0, (5, 5), 2),
        GroupOutcome(refs[1], Pool.BULK, GroupStatus.DONE, 2.0, (5, 5), 2),
        GroupOutcome(refs[2], Pool.BULK, GroupStatus.ABORTED, None, (7, 9), 0),  # no member done, 16 tokens
        GroupOutcome(refs[3], Pool.BULK, GroupStatus.ABORTED, None, (3, 4), 0),  # no member done, 7 tokens
    )
    nxt = router.observe(s0, plan, StepResult(0, outs, 0.0, 2.0, 2.0))
    assert [c.uid for c in nxt.candidates] == [3, 2]
    outs2 = (*outs[:3], GroupOutcome(refs[3], Pool.BULK, GroupStatus.ABORTED, None, (9, 1), 1))  # one member done
    assert [c.uid for c in router.observe(s0, plan, StepResult(0, outs2, 0.0, 2.0, 2.0)).candidates] == [2, 3]
    # a group already cut before outranks both (starvation guard)
    outs3 = (*outs[:2], replace(outs[2], ref=replace(refs[2], cuts=1)), outs[3])
    plan3 = replace(plan, bulk=(refs[0], refs[1], replace(refs[2], cuts=1), refs[3]))
    assert [c.uid for c in router.observe(s0, plan3, StepResult(0, outs3, 0.0, 2.0, 2.0)).candidates] == [2, 3]


def test_observe_rejects_broken_results() -> None:
    rc = RouterConfig(groups=6, group_size=2, replicas=3, rho=0.5)
    router, ex, state = warm(rc)
    plan = router.plan(state, 2, 1)
    res = ex.execute(plan)
    router.observe(state, plan, res)
    outs = res.outcomes

    def bad(outcomes: tuple[GroupOutcome, ...], p: StepPlan = plan) -> None:
        with pytest.raises(InvariantError):
            router.observe(state, p, replace(res, outcomes=outcomes))

    bad(outs[:-1])  # a group lost
    bad((*outs, outs[0]))  # duplicated
    i = next(k for k, o in enumerate(outs) if o.status is GroupStatus.ABORTED)
    bad((*outs[:i], replace(outs[i], status=GroupStatus.DONE), *outs[i + 1 :]))  # N + 1 complete groups
    bad((replace(outs[0], status=GroupStatus.ABORTED), *outs[1:]))  # tail group not completed
    bad((replace(outs[0], pool=Pool.BULK), *outs[1:]))  # wrong pool
    j = next(k for k, o in enumerate(outs) if o.status is GroupStatus.DONE and o.pool is Pool.BULK)
    bad((*outs[:j], replace(outs[j], finished_members=1), *outs[j + 1 :]))  # "done" with an unfinished member
    bad(outs, replace(plan, requeue_after=(plan.bulk[0],)))  # a group both run and waiting


class Scripted(Controller):
    """A test controller (not registered): (q, m) from a fixed schedule, one entry per step; m clamped to R − 1."""

    def __init__(self, rc: RouterConfig, controls: list[tuple[int, int]]) -> None:
        super().__init__(rc, CURVE)
        self.controls = controls

    def _at(self, step: int) -> ControlState:
        q, m = self.controls[step % len(self.controls)]
        return ControlState(q=q, m=min(m, self.router.replicas - 1))

    def initial(self) -> ControlState:
        """The schedule's first entry."""
        return self._at(0)

    def update(self, state: ControlState, obs: StepObservation) -> ControlState:
        """The schedule's entry for the next step."""
        return self._at(obs.step + 1)


def drive(rc: RouterConfig, steps: int, policy: str, controls: list[tuple[int, int]], replica: ReplicaConfig) -> int:
    """Run the shared step loop and check every step's batch, exactly-once consumption and the redraw limit
    independently; returns how many pinned groups ran."""
    ctl = (CONTROLLERS["tailsieve"](rc, CURVE, ControllerConfig(m0=min(1, rc.replicas - 1))) if policy
           else Scripted(rc, controls))
    loop, ex = StepLoop(Router(rc, WL.prompts), ctl), SimExecutor(WL, CURVE, rc, replica)
    state = loop.initial()
    consumed: Counter[int] = Counter()
    pinned_seen = [0]
    for _ in range(steps):
        out = loop.step(state, ex)
        state = out.state
        done = [o for o in out.result.outcomes if o.status is GroupStatus.DONE]
        assert [o.ref.uid for o in done] == [o.ref.uid for o in out.consumed]
        assert len(done) == rc.groups and all(len(o.lengths) == rc.group_size for o in done)
        assert all(o.finished_members == rc.group_size for o in done)
        assert out.batch.shape == (rc.groups, rc.group_size) and out.record.q == out.plan.q
        assert all(o.ref.cuts <= rc.max_redraws for o in done)  # no group redrawn beyond the limit
        assert out.plan.pinned <= {o.ref.uid for o in done if o.pool is Pool.BULK}  # every pinned group completes
        pinned_seen[0] += len(out.plan.pinned)
        consumed.update(o.ref.uid for o in done)
    rstate = state.router
    assert max(consumed.values()) == 1  # none duplicated
    pending = [r.uid for r in (*rstate.candidates, *rstate.requeue)]
    assert len(pending) == len(set(pending)) and not set(pending) & set(consumed)
    assert set(consumed) | set(pending) == set(range(rstate.stream.position if rstate.stream else 0))  # none lost
    assert sum(consumed.values()) == rc.groups * steps == rstate.consumed
    return pinned_seen[0]


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 20), g=st.integers(1, 4), r=st.integers(1, 6), rho=st.sampled_from([0.0, 0.05, 0.1, 0.3, 1.0]),
    dispatch=st.sampled_from(list(Dispatch)), steps=st.integers(1, 40), adaptive=st.booleans(),
    controls=st.lists(st.tuples(st.integers(0, 25), st.integers(0, 5)), min_size=1, max_size=6),
    cap=st.sampled_from([None, None, 2, 5]), max_redraws=st.integers(1, 3),
)
def test_exactly_n_complete_groups_and_every_draw_consumed_once(
    n: int, g: int, r: int, rho: float, dispatch: Dispatch, steps: int, adaptive: bool,
    controls: list[tuple[int, int]], cap: int | None, max_redraws: int,
) -> None:
    rc = RouterConfig(groups=n, group_size=g, replicas=r, rho=rho, dispatch=dispatch, max_redraws=max_redraws)
    drive(rc, steps, "tailsieve" if adaptive and r >= 2 else "", controls, ReplicaConfig(max_num_seqs=cap))


def test_three_hundred_steps_of_random_splits() -> None:
    rng = np.random.default_rng(5)
    controls = [(int(rng.integers(0, 12)), int(rng.integers(0, 4))) for _ in range(300)]
    assert drive(RouterConfig(groups=12, group_size=3, replicas=4, rho=0.25), 300, "", controls, ReplicaConfig()) > 0
    assert drive(RouterConfig(groups=12, group_size=3, replicas=4, rho=0.25, dispatch=Dispatch.GROUP), 120,
                 "tailsieve", controls, ReplicaConfig(max_num_seqs=5)) > 0
    # stream order: a group cut twice is not always isolated first
    assert drive(RouterConfig(groups=12, group_size=3, replicas=4, rho=0.25, max_redraws=2, ranking="stream-order"),
                 300, "", controls, ReplicaConfig()) > 0


def test_rankings_are_named_and_replaceable() -> None:
    """Candidate ranking is chosen by name; a registered function replaces it; a non-permutation is refused."""
    with pytest.raises(ConfigError, match="unknown candidate ranking 'nope'.*least-progress"):
        RouterConfig(ranking="nope")
    rc = RouterConfig(groups=8, group_size=2, replicas=3, rho=0.5)
    default = warm(rc)[2].candidates
    by_stream = warm(replace(rc, ranking="stream-order"))[2].candidates
    assert sorted(r.uid for r in default) == [r.uid for r in by_stream]  # same cut groups, stream order
    expected = sorted(default, key=lambda r: r.uid)
    assert list(by_stream) == expected

    @ranking("test-reverse")
    def reverse(cut: Sequence[GroupOutcome]) -> list[GroupOutcome]:
        return sorted(cut, key=lambda o: -o.ref.uid)

    @ranking("test-drops-one")
    def drops(cut: Sequence[GroupOutcome]) -> list[GroupOutcome]:
        return list(cut)[1:]

    try:
        assert [r.uid for r in warm(replace(rc, ranking="test-reverse"))[2].candidates] == sorted(
            (r.uid for r in default), reverse=True)
        with pytest.raises(PluginError, match="'test-drops-one' returned 3 outcomes that are not a permutation"):
            warm(replace(rc, ranking="test-drops-one"))
    finally:
        del RANKINGS["test-reverse"], RANKINGS["test-drops-one"]


def test_pool_split_is_the_plans_pools() -> None:
    assert pool_split(5, 2) == ((3, 4), (0, 1, 2)) and pool_split(3, 0) == ((), (0, 1, 2))
    router = Router(RouterConfig(groups=6, group_size=2, replicas=5), WL.prompts)
    state = warm(RouterConfig(groups=6, group_size=2, replicas=5))[2]
    plan = router.plan(state, 2, 2)
    assert (plan.tail_replicas, plan.bulk_replicas) == pool_split(5, 2)
    assert {r for ref in plan.tail for r in plan.placement[ref.uid]} <= set(plan.tail_replicas)
    assert {r for ref in plan.bulk for r in plan.placement[ref.uid]} <= set(plan.bulk_replicas)
