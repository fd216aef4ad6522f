"""Simulated rollouts (mechanism): `SimExecutor` runs a `StepPlan` on simulated replicas; `run_policy` loops steps.

The executor draws each group's lengths from the workload (generation a of prompt p: fresh draws every time a
prompt is regenerated), runs every replica with `replica.run_replica`, completes the tail pool, cuts the bulk
pool at its quota-th group completion and reports a `StepResult`. The router and controller it drives are the
same objects a real-engine run uses.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from tailsieve.controller import CONTROLLERS, ControllerConfig, ControlState, StepObservation
from tailsieve.curves import TpotCurve
from tailsieve.errors import ConfigError
from tailsieve.replica import ReplicaConfig, ReplicaRun, run_replica
from tailsieve.router import (
    Dispatch,
    GroupOutcome,
    GroupStatus,
    InvariantError,
    Pool,
    Router,
    RouterConfig,
    RouterState,
    StepPlan,
    StepResult,
)
from tailsieve.workloads import Workload


class SimExecutor:
    """Executes plans in virtual time; owns the per-prompt generation counters (common random numbers)."""

    def __init__(
        self, workload: Workload, curve: TpotCurve, router: RouterConfig, replica: ReplicaConfig | None = None
    ) -> None:
        self.workload = workload
        self.curve = curve
        self.router = router
        self.replica = replica or ReplicaConfig()
        self.generation: dict[str, int] = defaultdict(int)

    def draw(self, prompt_id: str, step: int) -> NDArray[np.int64]:
        """Lengths of the next generation of a prompt (a counts every generation of p in this run)."""
        a = self.generation[prompt_id]
        self.generation[prompt_id] = a + 1
        return self.workload.lengths(prompt_id, a, step, self.router.group_size)

    def execute(self, plan: StepPlan) -> StepResult:
        """Run one step: tail pool to completion, bulk pool cut after `bulk_quota` complete groups."""
        g = self.router.group_size
        groups = [*plan.tail, *plan.bulk]
        lengths = {ref.uid: self.draw(ref.prompt_id, plan.step) for ref in groups}
        pid = {ref.uid: ref.prompt_id for ref in groups}
        per_replica: dict[int, list[tuple[int, int]]] = defaultdict(list)
        for ref in groups:
            for j, rep in enumerate(plan.placement[ref.uid]):
                per_replica[rep].append((ref.uid, j))
        runs: dict[int, tuple[ReplicaRun, list[tuple[int, int]]]] = {}
        finish: dict[int, NDArray[np.float64]] = {ref.uid: np.zeros(g) for ref in groups}
        for rep, members in per_replica.items():
            lens = np.array([lengths[u][j] for u, j in members], dtype=np.int64)
            prompts = None
            if self.replica.prefill_ms_per_token > 0:
                prompts = np.array([self.workload.prompt_tokens(pid[u]) or 0 for u, _ in members])
            run = run_replica(lens, self.curve, self.replica, prompts)
            runs[rep] = (run, members)
            for (u, j), f in zip(members, run.finish_s, strict=True):
                finish[u][j] = f
        done_at = {u: float(f.max()) for u, f in finish.items()}
        tail_s = max((done_at[r.uid] for r in plan.tail), default=0.0)
        order = sorted(plan.bulk, key=lambda r: (done_at[r.uid], r.uid))
        quota = min(plan.bulk_quota, len(order))
        kept = {r.uid for r in order[:quota]}
        bulk_s = done_at[order[quota - 1].uid] if quota > 0 else 0.0
        tokens_at_cut: dict[int, NDArray[np.int64]] = {u: np.zeros(g, np.int64) for u in lengths}
        for run, members in runs.values():
            toks = run.tokens_at(bulk_s)
            for (u, j), t in zip(members, toks, strict=True):
                tokens_at_cut[u][j] = t
        outcomes = [
            GroupOutcome(r, Pool.TAIL, GroupStatus.DONE, done_at[r.uid], tuple(int(x) for x in lengths[r.uid]), g)
            for r in plan.tail
        ]
        for r in plan.bulk:
            if r.uid in kept:
                outcomes.append(
                    GroupOutcome(
                        r, Pool.BULK, GroupStatus.DONE, done_at[r.uid], tuple(int(x) for x in lengths[r.uid]), g
                    )
                )
            else:
                toks = tokens_at_cut[r.uid]
                outcomes.append(
                    GroupOutcome(
                        r,
                        Pool.BULK,
                        GroupStatus.ABORTED,
                        None,
                        tuple(int(x) for x in toks),
                        int((finish[r.uid] <= bulk_s).sum()),
                    )
                )
        return StepResult(plan.step, tuple(outcomes), tail_s, bulk_s, max(tail_s, bulk_s))


@dataclass(frozen=True, slots=True)
class StepRecord:
    """Per-step measurements reported by `simulate --json` and `rollout`."""

    step: int
    makespan_s: float
    tail_s: float
    bulk_s: float
    q: int
    m: int
    candidates: int
    wasted_tokens: int
    batch_mean_length: float
    warmup: bool = False
    note: str = ""


@dataclass(frozen=True, slots=True)
class PolicyRun:
    """A policy's whole run: step records and the consumed batches' lengths (for App. E bias)."""

    policy: str
    steps: tuple[StepRecord, ...]
    batch_lengths: tuple[NDArray[np.int64], ...] = field(repr=False)
    consumed_uids: tuple[int, ...] = field(repr=False)

    def mean_step_s(self, skip: int = 2) -> float:
        """Mean makespan over all steps but the first `skip` (warm-up and first steady step)."""
        xs = [s.makespan_s for s in self.steps[skip:]] or [s.makespan_s for s in self.steps]
        return float(np.mean(xs))


@dataclass(frozen=True, slots=True)
class SimConfig:
    """One simulated run: step shape, replica options, controller constants, static (q, m), seeds."""

    router: RouterConfig = field(default_factory=RouterConfig)
    replica: ReplicaConfig = field(default_factory=ReplicaConfig)
    controller: ControllerConfig = field(default_factory=ControllerConfig)
    steps: int = 20
    q: int | None = None
    m: int | None = None
    shuffle: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ConfigError(f"steps must be >= 1, got {self.steps}")


def run_policy(name: str, workload: Workload, curve: TpotCurve, config: SimConfig) -> PolicyRun:
    """Simulate `config.steps` steps of one controller policy; checks exactly-once consumption throughout."""
    if name not in CONTROLLERS:
        raise ConfigError(f"unknown policy '{name}' (known: {', '.join(sorted(CONTROLLERS))})")
    rc = config.router
    controller = CONTROLLERS[name](rc, curve, config.controller, q=config.q, m=config.m)
    router = Router(rc, workload.prompts, shuffle=config.shuffle, seed=config.seed)
    executor = SimExecutor(workload, curve, rc, config.replica)
    rstate: RouterState = router.initial_state()
    cstate: ControlState = controller.initial()
    records: list[StepRecord] = []
    batches: list[NDArray[np.int64]] = []
    consumed: list[int] = []
    seen: set[int] = set()
    dispatch = Dispatch.GROUP if name == "uniform" else rc.dispatch
    for _ in range(config.steps):
        plan = router.plan(rstate, cstate.q, cstate.m, dispatch=dispatch)
        result = executor.execute(plan)
        rstate = router.observe(rstate, plan, result)
        done = [o for o in result.outcomes if o.status is GroupStatus.DONE]
        for o in done:
            if o.ref.uid in seen:
                raise InvariantError(f"prompt draw {o.ref.uid} consumed twice")
            seen.add(o.ref.uid)
            consumed.append(o.ref.uid)
        batch = np.array([o.lengths for o in done], dtype=np.int64)
        wasted = sum(o.tokens for o in result.outcomes if o.status is GroupStatus.ABORTED)
        obs = StepObservation(
            plan.step, plan.q, plan.m, plan.warmup, len(rstate.candidates), result.tail_s, result.bulk_s, batch
        )
        cstate = controller.update(cstate, obs)
        records.append(
            StepRecord(
                plan.step,
                result.makespan_s,
                result.tail_s,
                result.bulk_s,
                plan.q,
                plan.m,
                len(rstate.candidates),
                int(wasted),
                float(batch.mean()),
                plan.warmup,
                cstate.note,
            )
        )
        batches.append(batch)
    pending = {r.uid for r in (*rstate.candidates, *rstate.requeue)}
    drawn = rstate.stream.position if rstate.stream else 0
    if pending & seen or len(pending) + len(seen) != drawn:
        raise InvariantError("prompt draws lost or duplicated across steps")
    return PolicyRun(name, tuple(records), tuple(batches), tuple(consumed))
