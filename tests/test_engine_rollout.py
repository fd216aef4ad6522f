"""Rollout + EngineExecutor against fake servers: step contract, cutoff aborts, request modes, save/restore."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from engine_fake import FakeServer
from tailsieve.engines.rollout.api import Batch, Rollout, RolloutConfig
from tailsieve.engines.rollout.engine_executor import EngineExecutor, ExecutedStep, GroupSpec, RequestMode
from tailsieve.engines.rollout.prompts import PromptRecord, Template
from tailsieve.engines.rollout.state import RolloutState
from tailsieve.engines.transport.engine_client import Api, SamplingParams
from tailsieve.engines.transport.health import Replicas
from tailsieve.errors import ConfigError
from tailsieve.policy.controller import ControllerConfig
from tailsieve.policy.step import GroupRef, GroupStatus, Pool, StepPlan
from tailsieve.workloads import load_workload

PROMPTS = tuple(PromptRecord(f"p{i}", f"prompt number {i}") for i in range(40))


@pytest.fixture
def servers() -> Iterator[list[FakeServer]]:
    with FakeServer() as a, FakeServer() as b:
        yield [a, b]

ONE_REPLICA = r"^policy tailsieve needs at least 2 replicas \(a tail and a bulk pool\), got R=1$"


def config(**kw: object) -> RolloutConfig:
    base = RolloutConfig(groups=4, group_size=4, rho=0.5, policy="static", q=1, m=1,
                         sampling=SamplingParams(max_tokens=60))
    return replace(base, **kw)  # type: ignore[arg-type]


async def steps(urls: list[str], cfg: RolloutConfig, k: int, state: RolloutState | None = None,
                prompts: tuple[PromptRecord, ...] = PROMPTS) -> tuple[list[Batch], RolloutState]:
    async with Rollout(urls, cfg, prompts, state=state) as r:
        out = [await r.step() for _ in range(k)]
        return out, r.state()


def test_warmup_cut_aborts_then_two_pools(servers: list[FakeServer]) -> None:
    batches, state = asyncio.run(steps([s.url for s in servers], config(), 3))
    warm, steady = batches[0], batches[1]
    assert warm.record.warmup and warm.record.candidates == 2
    assert sum(o.status is GroupStatus.ABORTED for o in warm.outcomes) == 2
    assert sum(s.aborted for s in servers) > 0 and all(s.wait_idle() for s in servers)
    for b in batches:
        assert len(b.groups) == 4 and all(len(g.samples) == 4 for g in b.groups)
        assert all(g.lengths == tuple(s.tokens for s in g.samples) for g in b.groups)
        assert all(r in ("stop", "length") for g in b.groups for r in g.finish_reasons)
    assert steady.record.q == 1 and steady.record.m == 1 and steady.groups[0].pool is Pool.TAIL
    assert steady.record.tail_s > 0 and steady.record.bulk_s > 0
    assert {s.replica for s in steady.groups[0].samples} == {1}  # the tail pool is replica R−1
    consumed = [g.uid for b in batches for g in b.groups]
    pending = [r.uid for r in (*state.router.candidates, *state.router.requeue)]
    assert state.router.stream is not None
    assert sorted(consumed + pending) == list(range(state.router.stream.position))


def test_uniform_runs_to_completion_without_aborts(servers: list[FakeServer]) -> None:
    batches, _ = asyncio.run(steps([s.url for s in servers], config(policy="uniform"), 2))
    assert all(o.status is GroupStatus.DONE for b in batches for o in b.outcomes)
    assert sum(s.aborted for s in servers) == 0 and batches[0].record.wasted_tokens == 0


def test_seeds_are_per_member_and_repeat_per_generation(servers: list[FakeServer]) -> None:
    asyncio.run(steps([s.url for s in servers], config(policy="uniform"), 1))
    bodies = [b for s in servers for b in s.bodies]
    seeds = [b["seed"] for b in bodies]
    assert len(bodies) == 16 and len(set(seeds)) == 16
    before = sorted(seeds)
    for s in servers:
        s.bodies.clear()
    asyncio.run(steps([s.url for s in servers], config(policy="uniform"), 1))
    assert sorted(b["seed"] for s in servers for b in s.bodies) == before
    asyncio.run(steps([s.url for s in servers], config(policy="uniform", seed=None), 1))
    assert all("seed" not in b for s in servers for b in s.bodies[16:])


def test_request_mode_n_sends_one_request_per_group_and_replica(servers: list[FakeServer]) -> None:
    batches, _ = asyncio.run(steps([s.url for s in servers], config(policy="uniform",
                                                                        request_mode=RequestMode.N), 1))
    bodies = [b for s in servers for b in s.bodies]
    assert len(bodies) == 4 and all(b["n"] == 4 for b in bodies)  # uniform: whole groups round-robin
    assert all(len(g.samples) == 4 for g in batches[0].groups)


def test_replay_sets_ignore_eos_and_per_request_lengths(servers: list[FakeServer]) -> None:
    w = load_workload("kodcode-r1")
    prompts = tuple(PromptRecord(p, f"text {p}") for p in w.prompts[:20])
    cfg = config(policy="uniform", replay=w, length_scale=0.01)
    batches, _ = asyncio.run(steps([s.url for s in servers], cfg, 1, prompts=prompts))
    g = batches[0].groups[0]
    expect = tuple(max(1, round(int(x) * 0.01)) for x in w.lengths(g.prompt_id, 0, 0, 4))
    assert g.lengths == expect and set(g.finish_reasons) == {"length"}
    assert all(b["ignore_eos"] is True for s in servers for b in s.bodies)


def test_code_template_goes_through_chat(servers: list[FakeServer]) -> None:
    prompts = (PromptRecord("k", "Write `def f(x: int) -> int:` that doubles x."),) * 1
    cfg = config(policy="uniform", groups=1, template=Template.CODE, api=Api.CHAT)
    asyncio.run(steps([servers[0].url], cfg, 1, prompts=prompts))
    msgs = servers[0].bodies[0]["messages"]
    assert msgs[0] == {"role": "system", "content": "You are an expert Python programmer."}
    assert "Required function: def f(x: int) -> int:" in msgs[1]["content"]


def test_save_restore_neither_loses_nor_repeats(servers: list[FakeServer], tmp_path: Path) -> None:
    """A run saved after 3 steps and restored runs 3 more: the router, generation counters and controller state
    come back as saved (the controller state's own round trip: tests/test_control_state.py), and no prompt is lost
    or consumed twice over the 6 steps."""
    urls = [s.url for s in servers]
    cfg = config(policy="tailsieve", controller=replace(config().controller, m0=1))
    first, state = asyncio.run(steps(urls, cfg, 3))
    path = tmp_path / "state.json"
    state.save(path)
    loaded = RolloutState.load(path)
    assert loaded.router == state.router and loaded.generation == state.generation
    assert loaded.control.to_json() == state.control.to_json() and type(loaded.control) is type(state.control)
    assert state.control.decision is not None and loaded.control.note == state.control.note  # derived, not saved
    second, final = asyncio.run(steps(urls, cfg, 3, state=loaded))
    assert second[0].step == 3
    consumed = [g.uid for b in (*first, *second) for g in b.groups]
    pending = [r.uid for r in (*final.router.candidates, *final.router.requeue)]
    assert final.router.stream is not None
    assert len(consumed) == len(set(consumed)) == 6 * 4
    assert sorted(consumed + pending) == list(range(final.router.stream.position))
    assert json.loads(path.read_text())["policy"] == "tailsieve"


def test_restore_rejects_another_run_shape(servers: list[FakeServer]) -> None:
    _, state = asyncio.run(steps([s.url for s in servers], config(), 1))
    with pytest.raises(ConfigError, match="groups"):
        Rollout([s.url for s in servers], config(groups=5), PROMPTS, state=state)
    with pytest.raises(ConfigError, match=ONE_REPLICA.replace("tailsieve", "static")):
        Rollout([servers[0].url], config(), PROMPTS)
    with pytest.raises(ConfigError, match=r"^unknown policy 'seer-oracle' \(valid: uniform, static, "):
        config(policy="seer-oracle")  # the known-length oracles run only in `simulate`


def test_restarts_reported_by_the_pool_hook_reach_the_controller(servers: list[FakeServer]) -> None:
    """A launcher's pool hook receives each plan's explicit pools and returns the restart seconds of a pool move:
    they count in the step and the controller learns the price of a move from them."""
    calls: list[tuple[tuple[int, ...], tuple[int, ...]]] = []

    def pools(plan: StepPlan) -> float:
        calls.append((plan.tail_replicas, plan.bulk_replicas))
        return 3.0 if len(calls) > 1 and calls[-2] != calls[-1] else 0.0

    async def go() -> tuple[list[Batch], float]:
        cfg = config(policy="tailsieve", q=None, m=None, controller=ControllerConfig(m0=1))
        async with Rollout([s.url for s in servers], cfg, PROMPTS, pools=pools) as r:
            out = [await r.step() for _ in range(3)]
            return out, r.cstate.move_cost_s

    batches, learnt = asyncio.run(go())
    assert calls[:2] == [((), (0, 1)), ((1,), (0,))]  # warm-up on every replica, then replica 1 is the tail pool
    assert [b.restart_s for b in batches][:2] == [0.0, 3.0]
    assert batches[1].record.makespan_s >= 3.0 and learnt == 3.0


def test_an_adapter_replaces_the_executor_through_the_hook(servers: list[FakeServer]) -> None:
    """`Rollout.build_executor` is the override point for adapters: the subclass's executor runs every step."""
    plans: list[StepPlan] = []

    class Counting(EngineExecutor):
        async def execute(self, plan: StepPlan, spec: Callable[[GroupRef], GroupSpec] | None = None) -> ExecutedStep:
            plans.append(plan)
            return await super().execute(plan, spec)

    class Instrumented(Rollout):
        def build_executor(self, replicas: Replicas, model: str) -> EngineExecutor:
            base = super().build_executor(replicas, model)
            return Counting(replicas, model, base.params, base.g, base.mode, spec=base.spec)

    async def go() -> list[Batch]:
        async with Instrumented([s.url for s in servers], config(policy="static", q=1, m=1), PROMPTS) as r:
            return [await r.step() for _ in range(3)]

    batches = asyncio.run(go())
    assert [p.step for p in plans] == [b.step for b in batches] == [0, 1, 2]
    assert all(len(b.groups) == 4 for b in batches)
