"""Simulated rollouts (mechanism): `SimExecutor` runs a `StepPlan` on simulated replicas; `run_policy` loops steps.

The executor draws each group's lengths from the workload (generation a of prompt p: fresh draws every time a
prompt is regenerated), runs every replica with `replica.run_replica`, completes the tail pool, cuts the bulk
pool at its quota-th group completion and reports a `StepResult`. The router and controller it drives are the
same objects a real-engine run uses. The known-length oracles (App. A.2) are applied per step to the batches a
`uniform` run consumed: same prompts, same draws, exact makespans. Per-pool speculative decoding (§3.4,
`SimConfig.spec`) gives tail replicas the tail curve and the others the bulk curve (docs/speculative.md).
Details: docs/simulate.md.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import cast

import numpy as np
from numpy.typing import NDArray

from tailsieve.baselines import GroupBatch, get_policy
from tailsieve.controller import CONTROLLERS, ControllerConfig, ControlState, StepObservation
from tailsieve.curves import TpotCurve
from tailsieve.errors import ConfigError
from tailsieve.replica import ReplicaConfig, ReplicaRun, run_replica
from tailsieve.router import (
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
from tailsieve.speculative import PoolSpec
from tailsieve.workloads import Workload

ORACLES: tuple[str, ...] = ("uniform-oracle", "streamrl-oracle", "seer-oracle", "topq-best")  # App. A.2, known lengths
SKIP_STEPS = 2  # summaries skip the warm-up and the first steady step (§4.2 evaluates the steady state)


class SimExecutor:
    """Executes plans in virtual time; owns the per-prompt generation counters (common random numbers)."""

    def __init__(
        self,
        workload: Workload,
        curve: TpotCurve,
        router: RouterConfig,
        replica: ReplicaConfig | None = None,
        *,
        tail_curve: TpotCurve | None = None,
    ) -> None:
        self.workload = workload
        self.curve = curve  # bulk replicas (every replica in uniform and warm-up steps)
        self.tail_curve = curve if tail_curve is None else tail_curve  # the plan's tail replicas (§3.4)
        self.router = router
        self.replica = replica or ReplicaConfig()
        self.generation: dict[str, int] = defaultdict(int)
        self.last_lengths: NDArray[np.int64] = np.zeros((0, router.group_size), dtype=np.int64)  # last step, plan order

    def draw(self, prompt_id: str, step: int) -> NDArray[np.int64]:
        """Lengths of the next generation of a prompt (a counts every generation of p in this run)."""
        a = self.generation[prompt_id]
        self.generation[prompt_id] = a + 1
        return self.workload.lengths(prompt_id, a, step, self.router.group_size)

    def prompt_tokens(self, prompt_ids: Sequence[str]) -> NDArray[np.int64] | None:
        """Prompt tokens per id when the prefill option is on (0 where the trace does not record them)."""
        if self.replica.prefill_ms_per_token <= 0:
            return None
        return np.array([self.workload.prompt_tokens(p) or 0 for p in prompt_ids], dtype=np.int64)

    def execute(self, plan: StepPlan) -> StepResult:
        """Run one step: tail pool to completion, bulk pool cut after `bulk_quota` complete groups."""
        groups = (*plan.tail, *plan.bulk)
        q = len(plan.tail)
        lengths = np.stack([self.draw(ref.prompt_id, plan.step) for ref in groups])  # (n, G) in plan order
        self.last_lengths = lengths
        place = np.array([plan.placement[ref.uid] for ref in groups], dtype=np.int64)
        flat_len, flat_rep = lengths.ravel(), place.ravel()
        ptoks = self.prompt_tokens([ref.prompt_id for ref in groups])
        flat_ptok = None if ptoks is None else np.repeat(ptoks, lengths.shape[1])
        by_rep = np.argsort(flat_rep, kind="stable")  # requests grouped by replica, plan order inside each
        bounds = np.flatnonzero(np.diff(flat_rep[by_rep])) + 1
        finish = np.zeros(flat_len.size)
        runs: list[tuple[ReplicaRun, NDArray[np.intp]]] = []
        tail_reps = set(plan.tail_replicas)
        for idx in np.split(by_rep, bounds):
            curve = self.tail_curve if int(flat_rep[idx[0]]) in tail_reps else self.curve
            run = run_replica(flat_len[idx], curve, self.replica, None if flat_ptok is None else flat_ptok[idx])
            finish[idx] = run.finish_s
            runs.append((run, idx))
        fin = finish.reshape(lengths.shape)
        done_at = fin.max(axis=1)
        tail_s = float(done_at[:q].max()) if q else 0.0
        bulk_uid = np.array([ref.uid for ref in plan.bulk], dtype=np.int64)
        order = np.lexsort((bulk_uid, done_at[q:]))  # completion order, ties by stream position
        quota = min(plan.bulk_quota, order.size)
        kept = np.zeros(len(groups), dtype=bool)
        kept[:q] = True
        kept[q + order[:quota]] = True
        bulk_s = float(done_at[q + order[quota - 1]]) if quota > 0 else 0.0
        at_cut = flat_len.copy()
        for run, idx in runs:
            at_cut[idx] = run.tokens_at(bulk_s)
        cut_tokens = cast(list[list[int]], at_cut.reshape(lengths.shape).tolist())
        full: list[list[int]] = lengths.tolist()
        finished: list[int] = (fin <= bulk_s).sum(axis=1).tolist()
        g = lengths.shape[1]
        outcomes = tuple(
            GroupOutcome(ref, Pool.TAIL if i < q else Pool.BULK, GroupStatus.DONE, float(done_at[i]), tuple(full[i]), g)
            if kept[i]
            else GroupOutcome(ref, Pool.BULK, GroupStatus.ABORTED, None, tuple(cut_tokens[i]), finished[i])
            for i, ref in enumerate(groups)
        )
        return StepResult(plan.step, outcomes, tail_s, bulk_s, max(tail_s, bulk_s))


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
    """A policy's whole run: step records and the consumed batches (lengths, prompt ids) for App. E bias."""

    policy: str
    steps: tuple[StepRecord, ...]
    batch_lengths: tuple[NDArray[np.int64], ...] = field(repr=False)
    consumed_uids: tuple[int, ...] = field(repr=False)
    batch_prompts: tuple[tuple[str, ...], ...] = field(default=(), repr=False)

    def mean_step_s(self, skip: int = SKIP_STEPS) -> float:
        """Mean makespan over all steps but the first `skip` (warm-up and first steady step)."""
        xs = [s.makespan_s for s in self.steps[skip:]] or [s.makespan_s for s in self.steps]
        return float(np.mean(xs))

    @property
    def final_q(self) -> int:
        """q of the last executed step."""
        return self.steps[-1].q if self.steps else 0

    @property
    def final_m(self) -> int:
        """m of the last executed step."""
        return self.steps[-1].m if self.steps else 0


@dataclass(frozen=True, slots=True)
class SimConfig:
    """One simulated run: step shape, replica options, controller constants, static (q, m), seeds, speculation."""

    router: RouterConfig = field(default_factory=RouterConfig)
    replica: ReplicaConfig = field(default_factory=ReplicaConfig)
    controller: ControllerConfig = field(default_factory=ControllerConfig)
    steps: int = 20
    q: int | None = None
    m: int | None = None
    shuffle: bool = False
    seed: int = 0
    spec: PoolSpec = field(default_factory=PoolSpec)  # per-pool speculative decoding (§3.4); off by default
    restart_s: float = 0.0  # seconds a step pays when m changed (a launcher restarting the moved replicas)

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ConfigError(f"steps must be >= 1, got {self.steps}")
        if not (self.restart_s >= 0 and math.isfinite(self.restart_s)):
            raise ConfigError(f"restart_s must be >= 0 and finite, got {self.restart_s}")


OnStep = Callable[[str, int], None]  # (policy, steps done so far) after every simulated step


def policy_names() -> tuple[str, ...]:
    """Every policy `run_policy` knows: uniform, the oracles, then the other controllers (`simulate --policy all`)."""
    ordered = ("uniform", *ORACLES, "static", "tailsieve-fixed", "tailsieve", "tailsieve-paper")
    return tuple(dict.fromkeys((*ordered, *CONTROLLERS)))


def check_policy(name: str, replicas: int) -> None:
    """ConfigError for an unknown policy (listing the valid ones) or one that needs a tail pool with R < 2."""
    if name not in CONTROLLERS and name not in ORACLES:
        raise ConfigError(f"unknown policy '{name}' (valid: {', '.join(policy_names())}, or all)")
    needs_two = (name in CONTROLLERS and name != "uniform") or get_policy(name).min_replicas > 1
    if needs_two and replicas < 2:
        raise ConfigError(f"policy {name} needs at least 2 replicas (a tail and a bulk pool), got R={replicas}")


def run_policy(
    name: str,
    workload: Workload,
    curve: TpotCurve,
    config: SimConfig,
    *,
    reference: PolicyRun | None = None,
    on_step: OnStep | None = None,
) -> PolicyRun:
    """Simulate `config.steps` steps of one policy; an oracle replays `reference` (a `uniform` run, made if None)."""
    check_policy(name, config.router.replicas)
    if name in ORACLES:
        if reference is None or reference.policy != "uniform" or len(reference.steps) != config.steps:
            reference = _run_controller("uniform", workload, curve, config, None)
        return _run_oracle(name, reference, workload, curve, config, on_step)
    return _run_controller(name, workload, curve, config, on_step)


def run_policies(
    names: Sequence[str], workload: Workload, curve: TpotCurve, config: SimConfig, *, on_step: OnStep | None = None
) -> dict[str, PolicyRun]:
    """Several policies on the same prompt stream and draws; `uniform` always runs (first) as the reference."""
    names = list(dict.fromkeys(["uniform", *names]))
    for name in names:
        check_policy(name, config.router.replicas)
    uniform = run_policy("uniform", workload, curve, config, on_step=on_step)
    out = {"uniform": uniform}
    for name in names[1:]:
        out[name] = run_policy(name, workload, curve, config, reference=uniform, on_step=on_step)
    return out


def _run_controller(
    name: str, workload: Workload, curve: TpotCurve, config: SimConfig, on_step: OnStep | None
) -> PolicyRun:
    """The router + executor + controller loop; checks exactly-once consumption throughout."""
    rc = config.router
    tail_curve, bulk_curve = config.spec.curves(curve)
    controller = CONTROLLERS[name](rc, bulk_curve, config.controller, q=config.q, m=config.m, tail_curve=tail_curve,
                                   kv_s_per_token=config.replica.kv_ms_per_1k_tokens / 1e6)
    router = Router(rc, workload.prompts, shuffle=config.shuffle, seed=config.seed)
    executor = SimExecutor(workload, bulk_curve, rc, config.replica, tail_curve=tail_curve)
    rstate: RouterState = router.initial_state()
    cstate: ControlState = controller.initial()
    records: list[StepRecord] = []
    batches: list[NDArray[np.int64]] = []
    prompts: list[tuple[str, ...]] = []
    consumed: list[int] = []
    seen: set[int] = set()
    last_m = 0  # the first step starts from every replica as bulk, as a launcher does
    for i in range(config.steps):
        plan = router.plan(rstate, cstate.q, cstate.m)
        restart = config.restart_s if plan.m != last_m else 0.0  # moved replicas restart in parallel
        last_m = plan.m
        result = executor.execute(plan)
        rstate = router.observe(rstate, plan, result)
        done = [o for o in result.outcomes if o.status is GroupStatus.DONE]
        uids = [o.ref.uid for o in done]
        if seen.intersection(uids):
            raise InvariantError(f"step {plan.step}: a prompt draw was consumed twice")
        seen.update(uids)
        consumed.extend(uids)
        batch = np.array([o.lengths for o in done], dtype=np.int64)
        wasted = sum(o.tokens for o in result.outcomes if o.status is GroupStatus.ABORTED)
        obs = StepObservation(
            plan.step, plan.q, plan.m, plan.warmup, len(rstate.candidates), result.tail_s, result.bulk_s, batch,
            restart,
        )
        cstate = controller.update(cstate, obs)
        records.append(
            StepRecord(plan.step, restart + result.makespan_s, result.tail_s, result.bulk_s, plan.q, plan.m,
                       len(rstate.candidates), int(wasted), float(batch.mean()), plan.warmup, cstate.note)
        )
        batches.append(batch)
        prompts.append(tuple(o.ref.prompt_id for o in done))
        if on_step is not None:
            on_step(name, i + 1)
    pending = {r.uid for r in (*rstate.candidates, *rstate.requeue)}
    drawn = rstate.stream.position if rstate.stream else 0
    if pending & seen or len(pending) + len(seen) != drawn:
        raise InvariantError("prompt draws lost or duplicated across steps")
    return PolicyRun(name, tuple(records), tuple(batches), tuple(consumed), tuple(prompts))


def _run_oracle(
    name: str, ref: PolicyRun, workload: Workload, curve: TpotCurve, config: SimConfig, on_step: OnStep | None
) -> PolicyRun:
    """A known-length baseline applied per step to uniform's batches (same prompts, same draws): exact makespans.

    With speculation on, every replica runs the bulk pool's configuration (the per-pool split is TailSieve's)."""
    policy = get_policy(name)
    r = config.router.replicas
    curve = config.spec.bulk.curve(curve)
    ex = SimExecutor(workload, curve, config.router, config.replica)
    records: list[StepRecord] = []
    for i, (rec, lens) in enumerate(zip(ref.steps, ref.batch_lengths, strict=True)):
        a = policy.assign(GroupBatch(lens), r, curve)
        spans = np.asarray(a.replica_makespans_s, dtype=np.float64)
        if not config.replica.all_admit:  # the same replica model as the simulator (request order: batch order)
            ptoks = ex.prompt_tokens(ref.batch_prompts[i]) if ref.batch_prompts else None
            flat_p = None if ptoks is None else np.repeat(ptoks, lens.shape[1])
            flat_l, flat_r = lens.ravel(), a.replica.ravel()
            spans = np.array([
                run_replica(flat_l[flat_r == k], curve, config.replica,
                            None if flat_p is None else flat_p[flat_r == k]).makespan
                for k in range(r)
            ])
        q, m = int(a.info.get("q", 0)), int(a.info.get("m", a.info.get("dedicated", 0)))
        tail_s = float(spans[r - m :].max()) if m > 0 else 0.0
        bulk_s = float(spans[: r - m].max())
        note = " ".join(f"{k}={v}" for k, v in a.info.items() if k in ("q", "m", "dedicated", "isolated_requests"))
        records.append(
            StepRecord(rec.step, max(tail_s, bulk_s), tail_s, bulk_s, q, m, 0, 0, rec.batch_mean_length, False, note)
        )
        if on_step is not None:
            on_step(name, i + 1)
    return PolicyRun(name, tuple(records), ref.batch_lengths, ref.consumed_uids, ref.batch_prompts)
