"""Sim/real equivalence: the same plans run through `SimExecutor` (virtual time) and through `EngineExecutor` (HTTP,
against `sequenced_fake.SequencedFake`) give the same statuses, pools, consumed sets, progress of the cut groups and
candidate order, step after step (property-tested over seeds and step shapes).

The workload draws lengths that are unique over every (prompt, generation, member), and the simulator runs a flat
TPOT curve with every request admitted: request j then finishes at L_j·τ and has generated min(L_j, t/τ) tokens at
time t, on any replica, in any batch. The fake server plays exactly that order (see its module docstring), so ties,
the only freedom the two executors have, never arise. Times are never compared, only what the router consumes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray

from sequenced_fake import SequencedFake, StepLog, member_of
from tailsieve.engines.rollout.engine_executor import EngineExecutor, ExecutedStep, GroupSpec, RequestMode
from tailsieve.engines.transport.engine_client import ClientOptions, SamplingParams
from tailsieve.engines.transport.health import FaultPolicy, Replicas
from tailsieve.model.curves import TpotCurve
from tailsieve.policy.router import Dispatch, Router, RouterConfig, RouterState
from tailsieve.policy.step import GroupRef, GroupStatus, StepPlan, StepResult
from tailsieve.simulation.executor import SimExecutor
from tailsieve.workloads.workload import ReplayMode, Workload

pytestmark = pytest.mark.slow
MAX_REPLICAS = 4
FLAT = TpotCurve(name="flat", batch=(1, 1024), tpot_ms=(1.0, 1.0))  # τ(b) = 1 ms: finish = L·τ, no batch effect


class UniqueLengths:
    """Length source: a seeded permutation of 1..K over the index of (generation, prompt, member), K = every index
    the run can use, so no two requests of a run share a length (nor a finish time)."""

    def __init__(self, prompts: Sequence[str], group_size: int, generations: int, seed: int) -> None:
        self.pos = {p: i for i, p in enumerate(prompts)}
        self.g, self.gens = group_size, generations
        self.table = np.random.default_rng(seed).permutation(len(prompts) * generations * group_size) + 1

    def lengths(self, prompt_id: str, generation: int, step: int, group_size: int) -> NDArray[np.int64]:
        assert group_size == self.g and generation < self.gens, (generation, self.gens)
        base = (generation * len(self.pos) + self.pos[prompt_id]) * self.g
        return self.table[base : base + self.g].astype(np.int64)


def unique_workload(rc: RouterConfig, steps: int, seed: int) -> Workload:
    """Enough prompts that the stream never wraps, so a prompt runs at most once per step (generation < steps)."""
    prompts = tuple(f"q{i}" for i in range(steps * (rc.groups + rc.extra) + 1))
    return Workload("unique", prompts, None, ReplayMode.RESAMPLE, seed, UniqueLengths(prompts, rc.group_size,
                                                                                        steps, seed))


@dataclass(frozen=True)
class StepCheck:
    """One step as both executors ran it (for the readable test's extra assertions)."""

    plan: StepPlan
    sim: StepResult
    real: ExecutedStep
    log: StepLog
    state: RouterState


def _rows(res: StepResult) -> list[tuple[object, ...]]:
    """Everything the router and the trainer consume from a result, in plan order (no times)."""
    return [(o.ref.uid, o.ref.prompt_id, o.ref.cuts, o.pool.value, o.status.value, o.lengths, o.finished_members)
            for o in res.outcomes]


async def _run_step(fake: SequencedFake, ex: EngineExecutor, plan: StepPlan, spec: dict[int, GroupSpec],
                    requests: int) -> tuple[ExecutedStep, StepLog]:
    seq = asyncio.wrap_future(fake.begin(plan.step, requests))
    task = asyncio.ensure_future(ex.execute(plan, lambda r: spec[r.uid]))
    await asyncio.wait({seq, task}, timeout=60, return_when=asyncio.FIRST_EXCEPTION)
    if not (seq.done() and task.done()):  # one side failed (or both hang): stop the other, report the failure
        for f in (seq, task):
            f.cancel()
        errors = await asyncio.gather(seq, task, return_exceptions=True)
        for e in errors:
            if isinstance(e, Exception):
                raise e
        raise AssertionError(f"step {plan.step}: neither the executor nor the sequencer finished within 60 s")
    return task.result(), seq.result()


def launched(plan: StepPlan) -> tuple[GroupRef, ...]:
    """The groups an executor sends: the tail, the pinned bulk groups, and the rest of the bulk pool unless its
    cutoff needs no completion of theirs (quota − pinned ≤ 0)."""
    free = [r for r in plan.bulk if r.uid not in plan.pinned]
    pinned = [r for r in plan.bulk if r.uid in plan.pinned]
    return (*plan.tail, *pinned, *(free if plan.bulk_quota > len(pinned) else ()))


def check_step(plan: StepPlan, sim: StepResult, sent: NDArray[np.int64], real: ExecutedStep, log: StepLog) -> None:
    """The equivalence of one step (everything but times), with the server's view as a cross-check."""
    g = sent.shape[1]
    groups = (*plan.tail, *plan.bulk)
    row = {ref.uid: i for i, ref in enumerate(groups)}
    # the server saw each launched request once, on its planned replica, with the simulator's length
    for rid, (replica, length) in log.requests.items():
        step, uid, j, attempt = member_of(rid)
        assert (step, attempt) == (plan.step, 0), rid
        assert replica == plan.placement[uid][j], (rid, replica, plan.placement[uid])
        assert length == sent[row[uid], j], (rid, length, sent[row[uid]])
    assert len(log.requests) == g * len(launched(plan))
    assert _rows(real.result) == _rows(sim)
    done = {o.ref.uid for o in sim.outcomes if o.status is GroupStatus.DONE}
    assert {o.ref.uid for o in real.result.outcomes if o.status is GroupStatus.DONE} == done
    # a cut request reports what the server streamed before the client closed it
    for rid, sent_tokens in log.cut.items():
        _, uid, j, _ = member_of(rid)
        assert real.result.outcomes[row[uid]].lengths[j] == sent_tokens, rid


async def run_equivalence(fake: SequencedFake, rc: RouterConfig, controls: Sequence[tuple[int, int]], seed: int,
                          mode: RequestMode = RequestMode.SPLIT) -> list[StepCheck]:
    """Plan each step with one `Router`, run the plan through both executors, compare, observe both results."""
    wl = unique_workload(rc, len(controls), seed)
    router = Router(rc, wl.prompts)
    sim = SimExecutor(wl, FLAT, rc)
    state = router.initial_state()
    generation: dict[str, int] = {}
    out: list[StepCheck] = []
    client = fake.client(ClientOptions(api_key_env=None, stall_timeout_s=60.0))
    async with client:
        replicas = Replicas(fake.endpoints[: rc.replicas], client, FaultPolicy())
        ex = EngineExecutor(replicas, "fake", SamplingParams(max_tokens=1 << 20, ignore_eos=True), rc.group_size,
                            mode)
        try:
            for q, m in controls:
                plan = router.plan(state, q, min(m, rc.replicas - 1))
                sim_res = sim.execute(plan)
                spec: dict[int, GroupSpec] = {}
                for ref in (*plan.tail, *plan.bulk):  # as Rollout: the real side's own generation counter
                    a = generation.get(ref.prompt_id, 0)
                    generation[ref.prompt_id] = a + 1
                    lens = wl.lengths(ref.prompt_id, a, plan.step, rc.group_size)
                    spec[ref.uid] = GroupSpec(f"prompt {ref.prompt_id}", (None,) * rc.group_size,
                                              tuple(int(x) for x in lens))
                sent = np.array([spec[r.uid].max_tokens for r in (*plan.tail, *plan.bulk)], dtype=np.int64)
                assert np.array_equal(sent, sim.last_lengths)  # both sides drew the same generations
                real, log = await _run_step(fake, ex, plan, spec, len(launched(plan)) * rc.group_size)
                check_step(plan, sim_res, sent, real, log)
                s_sim = router.observe(state, plan, sim_res)
                state = router.observe(state, plan, real.result)
                assert [c.uid for c in state.candidates] == [c.uid for c in s_sim.candidates]
                assert state == s_sim
                out.append(StepCheck(plan, sim_res, real, log, state))
        finally:
            await replicas.close()
    return out


@pytest.fixture(scope="module")
def fake() -> Iterator[SequencedFake]:
    with SequencedFake(MAX_REPLICAS) as server:
        yield server


@pytest.mark.timeout(60)
def test_fixed_seed_steps_match(fake: SequencedFake) -> None:
    """Warm-up, two-pool steps (request and group dispatch), a uniform step: every step equal, and not vacuous."""
    rc = RouterConfig(groups=4, group_size=3, replicas=3, rho=0.5)  # E = 2
    controls = [(1, 1), (2, 1), (0, 0), (1, 2), (1, 2), (2, 1)]  # a uniform step requeues: warm-up again
    steps = asyncio.run(run_equivalence(fake, rc, controls, seed=3))
    assert [s.plan.warmup for s in steps] == [True, False, False, True, False, False]
    assert [(s.plan.q, s.plan.m) for s in steps] == [(0, 0), (2, 1), (0, 0), (0, 0), (1, 2), (2, 1)]
    cut = [o for s in steps for o in s.sim.outcomes if o.status is GroupStatus.ABORTED]
    assert len(cut) == 2 * 5  # E groups cut in each two-pool step and in each warm-up
    assert any(0 < o.finished_members < rc.group_size for o in cut)  # a partly finished group
    cut_requests = [(sent, s.log.requests[rid][1]) for s in steps for rid, sent in s.log.cut.items()]
    assert len(cut_requests) >= 2 * 5 and all(0 < sent < length for sent, length in cut_requests)
    assert [s.state.consumed for s in steps] == [4 * (i + 1) for i in range(len(steps))]
    assert [len(s.plan.pinned) for s in steps] == [0, 0, 2, 0, 1, 0]  # max_redraws 1: cut groups run to the end


@pytest.mark.timeout(60)
def test_pinned_groups_match_with_two_redraws(fake: SequencedFake) -> None:
    """max_redraws 2: groups cut twice are pinned in the bulk pool; both executors still agree step by step."""
    rc = RouterConfig(groups=4, group_size=2, replicas=3, rho=1.0, max_redraws=2)  # E = 4
    steps = asyncio.run(run_equivalence(fake, rc, [(1, 1)] * 6, seed=5))
    assert any(s.plan.pinned for s in steps)
    for s in steps:
        done = {o.ref.uid for o in s.real.result.outcomes if o.status is GroupStatus.DONE}
        assert s.plan.pinned <= done and all(o.ref.cuts <= 2 for o in s.real.result.outcomes if o.ref.uid in done)


@pytest.mark.timeout(60)
def test_zero_bulk_quota_matches(fake: SequencedFake) -> None:
    """q = N isolated candidates (ρ = 1): bulk quota 0, the bulk pool is never launched and reports no progress."""
    rc = RouterConfig(groups=2, group_size=2, replicas=3, rho=1.0, dispatch=Dispatch.GROUP)
    steps = asyncio.run(run_equivalence(fake, rc, [(1, 1), (2, 2), (3, 1)], seed=7))
    assert [s.plan.bulk_quota for s in steps] == [2, 0, 0]
    for s in steps[1:]:
        assert len(s.log.requests) == 2 * 2 and not s.log.cut
        assert all(o.lengths == (0, 0) and o.finished_members == 0 for o in s.real.result.outcomes if o.pool == "bulk")


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[RouterConfig, list[tuple[int, int]], int, RequestMode]:
    n = draw(st.integers(1, 5))
    rc = RouterConfig(groups=n, group_size=draw(st.integers(1, 3)), replicas=draw(st.integers(2, MAX_REPLICAS)),
                      rho=draw(st.sampled_from([0.0, 0.2, 0.5, 1.0])), dispatch=draw(st.sampled_from(list(Dispatch))),
                      max_redraws=draw(st.sampled_from([1, 2])))
    controls = draw(st.lists(st.tuples(st.integers(0, n + 1), st.integers(0, MAX_REPLICAS - 1)), min_size=2,
                             max_size=5))
    return rc, controls, draw(st.integers(0, 2**16)), draw(st.sampled_from(list(RequestMode)))


@pytest.mark.timeout(120)
@settings(max_examples=50, deadline=None)
@given(sc=scenarios())
def test_same_plans_same_results_over_seeds(fake: SequencedFake,
                                             sc: tuple[RouterConfig, list[tuple[int, int]], int, RequestMode]) -> None:
    rc, controls, seed, mode = sc
    asyncio.run(run_equivalence(fake, rc, controls, seed, mode))


def test_unique_lengths_are_unique() -> None:
    rc = RouterConfig(groups=5, group_size=3, replicas=2, rho=1.0)
    wl = unique_workload(rc, 5, seed=11)
    got = np.concatenate([wl.lengths(p, a, 0, 3) for p in wl.prompts for a in range(5)])
    assert np.unique(got).size == got.size and got.min() >= 1


def test_sim_progress_on_flat_curve_is_min_of_length_and_cut() -> None:
    """The premise the fake server plays: on a flat curve an aborted request reports min(L, L_cut)."""
    rc = RouterConfig(groups=3, group_size=2, replicas=2, rho=1.0)
    wl = unique_workload(rc, 1, seed=5)
    router = Router(rc, wl.prompts)
    plan = router.plan(router.initial_state(), 1, 1)
    res = SimExecutor(wl, FLAT, rc).execute(plan)
    lens = {r.uid: wl.lengths(r.prompt_id, 0, 0, 2) for r in plan.bulk}
    cut_len = max(int(lens[o.ref.uid].max()) for o in res.outcomes if o.status is GroupStatus.DONE)
    for o in res.outcomes:
        if o.status is GroupStatus.ABORTED:
            assert list(o.lengths) == [min(int(x), cut_len) for x in lens[o.ref.uid]]
            assert o.finished_members == int((lens[o.ref.uid] < cut_len).sum())

