"""Redraw limit (issue 14): a group is cut at most `max_redraws` times; a pinned group's next attempt completes in
the bulk pool (the cutoff waits for it) in the router, the simulator and the engine executor alike."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import numpy as np
import pytest
from numpy.typing import NDArray

from conftest import make_curve
from engine_fake import FakeServer
from tailsieve.engines.rollout.engine_executor import EngineExecutor, GroupSpec
from tailsieve.engines.transport.engine_client import ClientOptions, EngineClient, SamplingParams
from tailsieve.engines.transport.health import FaultPolicy, Replicas
from tailsieve.engines.transport.types import Endpoint
from tailsieve.errors import ConfigError
from tailsieve.model.curves import TpotCurve
from tailsieve.policy.router import Router, RouterConfig, RouterState
from tailsieve.policy.step import GroupRef, GroupStatus, InvariantError, Pool, StepPlan
from tailsieve.policy.stream import PromptStream
from tailsieve.simulation.executor import SimExecutor
from tailsieve.simulation.replica import ReplicaConfig, resume_replica, run_replica
from tailsieve.workloads.workload import ReplayMode, Workload
from test_sim import fake_workload

WL = fake_workload(60)
CURVE = make_curve()


def test_redraw_limits_are_validated() -> None:
    assert RouterConfig().max_redraws == 1
    for bad in (0, -1):
        with pytest.raises(ConfigError, match=f"max_redraws must be an integer >= 1, got {bad}"):
            RouterConfig(max_redraws=bad)


def test_pinned_candidates_are_not_forced_into_the_tail_but_pinned_in_the_bulk() -> None:
    rc = RouterConfig(groups=8, group_size=2, replicas=4, rho=0.5, max_redraws=2)
    router = Router(rc, WL.prompts)
    cands = (GroupRef(1, "p1", 1), GroupRef(2, "p2", 2), GroupRef(3, "p3", 2))
    plan = router.plan(RouterState(stream=router.initial_state().stream, candidates=cands), 1, 1)
    assert plan.tail == (cands[0],) and plan.bulk[:2] == cands[1:] and plan.bulk_quota == 7
    assert plan.pinned == frozenset({2, 3})


def test_pinned_groups_beyond_the_quota_keep_their_place_in_the_queue() -> None:
    rc = RouterConfig(groups=2, group_size=1, replicas=3, rho=1.0)  # E = 2
    router = Router(rc, WL.prompts)
    waiting = tuple(GroupRef(100 + i, f"p{i}", 1) for i in range(3))  # pinned, in the requeue
    state = RouterState(stream=router.initial_state().stream, requeue=waiting, candidates=(GroupRef(7, "p7", 1),))
    plan = router.plan(state, 1, 1)  # q = 1: quota 1, so one pinned group fits the bulk pool
    assert plan.tail == (GroupRef(7, "p7", 1),) and plan.bulk_quota == 1
    assert plan.bulk[0] == waiting[0] and plan.pinned == frozenset({100})
    assert [r.uid for r in plan.bulk[1:]] == [0, 1]  # fresh draws fill the pool
    assert plan.requeue_after == waiting[1:]


def cut_state(router: Router, cuts: tuple[int, ...]) -> RouterState:
    """A state whose candidates are the stream's first draws, cut `cuts` times each (draw accounting balanced)."""
    stream = PromptStream.from_state(router.prompts, router.initial_state().stream)  # type: ignore[arg-type]
    cands = tuple(GroupRef(p.index, p.prompt_id, c) for p, c in zip(stream.take(len(cuts)), cuts, strict=True))
    return RouterState(stream=stream.state(), candidates=cands)


class Fixed:
    """Length source: fixed lengths per prompt (every generation)."""

    def __init__(self, table: dict[str, list[int]]) -> None:
        self.table = table

    def lengths(self, prompt_id: str, generation: int, step: int, group_size: int) -> NDArray[np.int64]:
        return np.array(self.table[prompt_id], dtype=np.int64)


def fixed_workload(table: dict[str, list[int]]) -> Workload:
    """Prompts in table order (the stream draws them so), fixed lengths."""
    return Workload("fixed", tuple(table), None, ReplayMode.RESAMPLE, 0, Fixed(table))


@pytest.mark.parametrize("groups", [2, 3])
def test_a_pinned_slowest_bulk_group_is_waited_for_and_consumed(groups: int) -> None:
    rc = RouterConfig(groups=groups, group_size=2, replicas=3, rho=1.0)  # E = N, max_redraws 1
    table = {"a": [5, 6], "b": [900, 950], "c": [40, 30], "d": [300, 310], "e": [200, 210], "f": [250, 260]}
    wl = fixed_workload(table)
    router = Router(rc, wl.prompts)
    state = cut_state(router, (1, 1))  # a and b cut once: pinned
    cands = state.candidates
    plan = router.plan(state, 1, 1)  # tail a; bulk b (pinned) + fresh; quota N − 1, so N − 2 free completions
    assert plan.tail == cands[:1] and plan.bulk[0] == cands[1] and plan.pinned == frozenset({1})
    assert [r.prompt_id for r in plan.bulk] == ["b", "c", "d", "e", "f"][: 2 * groups - 1]
    ex = SimExecutor(wl, CURVE, rc)
    res = ex.execute(plan)
    got = {o.ref.prompt_id: o for o in res.outcomes}
    done = {p for p, o in got.items() if o.status is GroupStatus.DONE}
    assert done == ({"a", "b"} if groups == 2 else {"a", "b", "c"})
    b = got["b"]
    assert b.lengths == (900, 950) and res.bulk_s == b.finish_s and res.makespan_s == b.finish_s
    tau = CURVE.table(8)
    if groups == 2:  # no free completion needed: the fresh groups never start, b runs alone from t = 0
        assert b.finish_s == 950 * tau[1]
        assert all(o.lengths == (0, 0) and o.finished_members == 0 for o in got.values() if o.status == "aborted")
    else:  # cut at c's finish; b's members then run alone, faster than with the aborted groups beside them
        plain = SimExecutor(wl, CURVE, rc).execute(
            StepPlan(plan.step, plan.tail, plan.bulk, plan.placement, plan.tail_replicas, plan.bulk_replicas,
                     plan.bulk_quota, False, plan.stream_after, plan.requeue_after))
        assert res.bulk_s == b.finish_s > got["c"].finish_s and b.finish_s < 950 * tau[3]
        assert next(o for o in plain.outcomes if o.ref.uid == 1).status is GroupStatus.ABORTED  # unpinned: cut
        assert all(0 < max(o.lengths) < 300 for o in got.values() if o.status == "aborted")
    nxt = router.observe(state, plan, res)
    assert nxt.consumed == groups and all(c.cuts == 1 for c in nxt.candidates)


def test_observe_refuses_a_cut_pinned_group_and_an_over_cut_consumed_group() -> None:
    rc = RouterConfig(groups=2, group_size=2, replicas=3, rho=1.0, max_redraws=2)
    router = Router(rc, WL.prompts)
    state = cut_state(router, (1, 2))
    plan = router.plan(state, 1, 1)
    assert plan.pinned == frozenset({1})
    res = SimExecutor(WL, CURVE, rc).execute(plan)
    router.observe(state, plan, res)
    with pytest.raises(InvariantError, match="pinned group was not completed"):
        router.observe(state, plan, _swap(res, 1))  # type: ignore[arg-type]
    three = GroupRef(0, plan.tail[0].prompt_id, 3)
    over = replace(plan, tail=(three,))
    outs = tuple(replace(o, ref=three) if o.ref.uid == 0 else o for o in res.outcomes)
    with pytest.raises(InvariantError, match="cut more than 2 times"):
        router.observe(state, over, type(res)(res.step, outs, res.tail_s, res.bulk_s, res.makespan_s))


def _swap(res: object, uid: int) -> object:
    """The result with the pinned group `uid` reported aborted and another aborted bulk group done instead."""
    outs = res.outcomes  # type: ignore[attr-defined]
    other = next(o for o in outs if o.status is GroupStatus.ABORTED and o.pool is Pool.BULK)
    new = tuple(replace(o, status=GroupStatus.ABORTED, finish_s=None) if o.ref.uid == uid
                else replace(o, status=GroupStatus.DONE, finish_s=1.0, finished_members=2, lengths=(1, 1))
                if o is other else o for o in outs)
    return replace(res, outcomes=new)  # type: ignore[type-var]


def test_engine_executor_does_not_cancel_a_pinned_bulk_group() -> None:
    rc = RouterConfig(groups=3, group_size=2, replicas=2, rho=1.0)  # E = 3
    router = Router(rc, WL.prompts)
    state = cut_state(router, (1, 1))
    plan = router.plan(state, 1, 1)  # tail 0; bulk 1 (pinned) + 4 fresh; quota 2: cut at 1 free completion
    assert plan.pinned == frozenset({1}) and plan.bulk_quota == 2 and len(plan.bulk) == 5
    fast = plan.bulk[1].uid
    tokens = {0: 20, 1: 120, fast: 4}

    def spec(ref: GroupRef) -> GroupSpec:
        n = tokens.get(ref.uid, 200)
        return GroupSpec(f"prompt {ref.uid}", (None, None), (n, n))

    async def go() -> object:
        with FakeServer(tpot_s=0.002) as a, FakeServer(tpot_s=0.002) as b:
            client = EngineClient(ClientOptions(api_key_env=None))
            async with client:
                reps = Replicas([Endpoint(a.url), Endpoint(b.url)], client, FaultPolicy())
                try:
                    ex = EngineExecutor(reps, "fake", SamplingParams(max_tokens=500, ignore_eos=True), 2)
                    return await ex.execute(plan, spec)
                finally:
                    await reps.close()

    res = asyncio.run(go())
    outs = {o.ref.uid: o for o in res.outcomes}  # type: ignore[attr-defined]
    assert outs[1].status is GroupStatus.DONE and outs[1].lengths == (120, 120)
    assert outs[fast].status is GroupStatus.DONE and outs[0].status is GroupStatus.DONE
    cut = [o for o in outs.values() if o.status is GroupStatus.ABORTED]
    assert len(cut) == 3 and all(max(o.lengths) < 200 for o in cut)
    assert res.bulk_s == outs[1].finish_s > outs[fast].finish_s  # type: ignore[attr-defined]
    nxt = router.observe(state, plan, res)  # type: ignore[arg-type]
    assert nxt.consumed == 3 and len(nxt.candidates) == 3


def brute_cut(lengths: list[int], prompts: list[int], keep: list[bool], cut_s: float, curve: TpotCurve,
              cfg: ReplicaConfig) -> list[float]:
    """Iteration by iteration: at the first iteration boundary at or after cut_s the unkept requests leave (running
    or queued), then FCFS admission (prefill stall), then one decode iteration. Finish times (inf: aborted)."""
    n = len(lengths)
    cap = n if cfg.max_num_seqs is None else cfg.max_num_seqs
    tau = curve.table(max(n, 1))
    rem, ctx = list(lengths), [float(p) for p in prompts]
    finish = [float("inf")] * n
    queue, running, t, cut = list(range(n)), [], 0.0, False
    while True:
        if not cut and t >= cut_s:
            cut = True
            queue, running = [i for i in queue if keep[i]], [i for i in running if keep[i]]
        if len(running) < cap and queue:
            take, queue = queue[: cap - len(running)], queue[cap - len(running):]
            t += cfg.prefill_ms_per_token / 1e3 * sum(prompts[i] for i in take)
            for i in take:
                if rem[i] == 0:
                    finish[i] = t
                else:
                    running.append(i)
        if not running:
            if not queue:
                return finish
            continue
        t += float(tau[len(running)]) + cfg.kv_ms_per_1k_tokens / 1e6 * sum(ctx[i] for i in running)
        for i in running:
            rem[i] -= 1
            ctx[i] += 1
            if rem[i] == 0:
                finish[i] = t
        running = [i for i in running if rem[i] > 0]


DYADIC = TpotCurve(name="dyadic", batch=(1, 9), tpot_ms=(1.953125, 3.90625))  # 2^-9 s .. 2^-8 s, exact sums


@pytest.mark.parametrize("cfg", [ReplicaConfig(), ReplicaConfig(max_num_seqs=2), ReplicaConfig(
    kv_ms_per_1k_tokens=976.5625 / 64), ReplicaConfig(max_num_seqs=3, prefill_ms_per_token=1.953125,
                                                     kv_ms_per_1k_tokens=976.5625 / 64)])
def test_resume_replica_equals_the_iteration_by_iteration_cut(cfg: ReplicaConfig) -> None:
    rng = np.random.default_rng(3)
    for case in range(60):
        n = int(rng.integers(1, 7))
        lengths = rng.integers(1, 30, n).tolist()
        prompts = rng.integers(0, 8, n).tolist()
        keep = (rng.random(n) < 0.5).tolist()
        run = run_replica(lengths, DYADIC, cfg, prompts)
        cuts = [0.0, float(rng.uniform(0, run.makespan)), float(run.finish_s[int(rng.integers(n))])]
        for cut_s in cuts:
            got = resume_replica(run, keep, cut_s, DYADIC, cfg, prompts)
            want = brute_cut(lengths, prompts, keep, cut_s, DYADIC, cfg)
            assert got.tolist() == want, (case, cut_s, got, want)  # inf: aborted before its end
    everything = run_replica([5, 9], DYADIC, cfg, [1, 2])
    assert resume_replica(everything, [True, True], 0.01, DYADIC, cfg, [1, 2]).tolist() == everything.finish_s.tolist()
