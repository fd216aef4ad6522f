"""The step loop (`tailsieve.loop`): the simulator's runs are the loop; the awaitable form (real engines, an RL
framework's in-process engine) gives the same steps; restart seconds reach the record and the controller; the run
log refuses a draw consumed twice; the controller factory hands every controller the same cost model."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import numpy as np
import pytest

from conftest import make_curve
from tailsieve.loop import (
    LoopState,
    PolicyRun,
    RunLog,
    StepLoop,
    StepOutput,
    StepRecord,
    make_controller,
)
from tailsieve.policy.controller import ControllerConfig
from tailsieve.policy.router import Router, RouterConfig
from tailsieve.policy.step import GroupStatus, InvariantError, StepPlan, StepResult
from tailsieve.simulation.executor import SimExecutor, SimRestarts
from tailsieve.simulation.runs import SimConfig, run_policy
from test_sim import fake_workload

CURVE = make_curve()
WL = fake_workload(50)


def make_loop(*, policy: str = "tailsieve", rc: RouterConfig | None = None, kv_ms: float = 0.0) -> StepLoop:
    """A loop over the test workload with keyword defaults (R = 4, N = 12 × G = 3, ρ = 0.25)."""
    rc = rc or RouterConfig(groups=12, group_size=3, replicas=4, rho=0.25)
    ctl = make_controller(policy, rc, bulk_curve=CURVE, config=ControllerConfig(m0=1), kv_s_per_token=kv_ms / 1e6)
    return StepLoop(Router(rc, WL.prompts), ctl)


def run_sync(loop: StepLoop, steps: int, restart_s: float = 0.0) -> list[StepOutput]:
    ex = SimExecutor(WL, CURVE, loop.router.config)
    hook = SimRestarts(restart_s)
    state, outs = loop.initial(), []
    for _ in range(steps):
        out = loop.step(state, ex, hook)
        outs.append(out)
        state = out.state
    return outs


class AsyncSim:
    """An awaitable executor (the shape of a real-engine or RL-framework adapter) around the simulator."""

    def __init__(self, inner: SimExecutor) -> None:
        self.inner = inner
        self.plans: list[StepPlan] = []

    async def execute(self, plan: StepPlan) -> StepResult:
        self.plans.append(plan)
        await asyncio.sleep(0)
        return self.inner.execute(plan)


def test_simulated_runs_are_the_shared_loop() -> None:
    """`run_policy` produces exactly the records of driving `StepLoop` by hand with `SimExecutor`."""
    rc = RouterConfig(groups=12, group_size=3, replicas=4, rho=0.25)
    cfg = SimConfig(router=rc, controller=ControllerConfig(m0=1), steps=12, restart_s=2.5)
    run = run_policy("tailsieve", WL, CURVE, cfg)
    outs = run_sync(make_loop(rc=rc), 12, restart_s=2.5)
    assert run.steps == tuple(o.record for o in outs)
    assert run.consumed_uids == tuple(o.ref.uid for out in outs for o in out.consumed)
    assert any(s.m > 0 for s in run.steps)  # the controller left the uniform boundary: two-pool steps ran


def test_awaitable_executor_gives_the_same_steps() -> None:
    loop = make_loop()
    sync = run_sync(loop, 8)
    ex = AsyncSim(SimExecutor(WL, CURVE, loop.router.config))

    async def go() -> list[StepOutput]:
        state, outs = loop.initial(), []
        for _ in range(8):
            out = await loop.astep(state, ex)
            outs.append(out)
            state = out.state
        return outs

    outs = asyncio.run(go())
    assert [o.record for o in outs] == [o.record for o in sync]
    assert [o.plan for o in outs] == ex.plans == [o.plan for o in sync]


def test_complete_checks_the_contract_and_counts_restarts() -> None:
    loop = make_loop()
    state = loop.initial()
    plan = loop.plan(state)
    result = SimExecutor(WL, CURVE, loop.router.config).execute(plan)
    out = loop.complete(state, plan, result, restart_s=4.0)
    assert out.record.makespan_s == pytest.approx(4.0 + result.makespan_s)
    assert out.observation.restart_s == 4.0 and out.restart_s == 4.0
    assert out.batch.shape == (12, 3) and out.record.batch_mean_length == pytest.approx(float(out.batch.mean()))
    assert out.record.wasted_tokens == sum(o.tokens for o in result.outcomes if o.status is GroupStatus.ABORTED)
    assert out.state.router.consumed == 12 and out.record.candidates == len(out.state.router.candidates)
    lost = replace(result, outcomes=result.outcomes[:-1])
    with pytest.raises(InvariantError):
        loop.complete(state, plan, lost)


def test_sim_restarts_charge_a_changed_pool_only() -> None:
    hook = SimRestarts(7.0)
    loop = make_loop()
    plan = loop.plan(loop.initial())
    assert hook(plan) == 0.0  # warm-up: every replica bulk, as at start
    assert hook(replace(plan, tail_replicas=(3,))) == 7.0
    assert hook(replace(plan, tail_replicas=(3,))) == 0.0
    assert hook(replace(plan, tail_replicas=())) == 7.0


def test_run_log_refuses_a_draw_consumed_twice_and_a_lost_one() -> None:
    outs = run_sync(make_loop(policy="static"), 4)  # a split at every step: candidates wait after each cut
    log = RunLog("tailsieve")
    for out in outs:
        log.add_output(out)
    log.check_final(outs[-1].state.router)
    run = log.run()
    assert isinstance(run, PolicyRun) and len(run.steps) == 4 and len(run.consumed_uids) == 48
    rec = StepRecord(step=9, makespan_s=1.0, tail_s=0.0, bulk_s=1.0, q=0, m=0, candidates=0, wasted_tokens=0,
                     batch_mean_length=1.0)
    with pytest.raises(InvariantError, match="consumed twice"):
        log.add(rec, np.ones((1, 3), np.int64), [run.consumed_uids[0]], ("p0",))
    short = replace(outs[-1].state.router, candidates=outs[-1].state.router.candidates[1:])
    assert outs[-1].state.router.candidates  # E = 3 groups wait as candidates after every cut
    with pytest.raises(InvariantError, match="lost or duplicated"):
        log.check_final(short)


def test_make_controller_gives_every_controller_the_same_cost_model() -> None:
    rc = RouterConfig(groups=12, group_size=3, replicas=4)
    tail = make_curve(tpot_ms=(5.0, 7.0, 9.0, 12.0))
    for name in ("uniform", "static", "tailsieve", "tailsieve-paper", "tailsieve-fixed"):
        ctl = make_controller(name, rc, bulk_curve=CURVE, tail_curve=tail, kv_s_per_token=3e-8, q=1, m=1)
        assert ctl.curve is CURVE and ctl.tail_curve is tail and ctl.kv_s_per_token == 3e-8
    assert LoopState(Router(rc, WL.prompts).initial_state(), ctl.initial()).control.m >= 0
