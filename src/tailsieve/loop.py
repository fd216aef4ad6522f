"""The step loop (§3.1–3.2), written once: plan → execute → observe → observation → controller update → record.

```
LoopState ──► StepLoop.plan ──► StepPlan ──► executor.execute (SimExecutor | EngineExecutor) ──► StepResult
                                                                                                   │
LoopState' ◄── StepLoop.complete: Router.observe, StepObservation, Controller.update, StepRecord ◄──┘
```

`StepLoop` binds one `Router` and one controller; it is the only caller of `Router.observe` and
`Controller.update`, so the simulator, real rollouts and the tests run the same step. It holds no mutable state:
`LoopState` (router state, controller state) goes in and comes out. An executor is anything with
`execute(plan) -> StepResult` (`Executor`), or the awaitable form (`AsyncExecutor`, real engines). A pool hook
(`PoolHook`: the launcher, or the simulator's restart model) receives each plan's pools before it runs and
returns the seconds spent restarting replicas, which count in the step's makespan and teach the controller the
price of a pool move.
"""

from __future__ import annotations

import abc
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Generic, Protocol, TypeVar

import numpy as np
from numpy.typing import NDArray

from tailsieve.model.curves import TpotCurve
from tailsieve.policy.control_state import StepWork
from tailsieve.policy.controller import CONTROLLERS, Controller, ControllerConfig, ControlState, StepObservation
from tailsieve.policy.decision import Decision
from tailsieve.policy.peers import PeerPolicy, PeerState, PeerStep
from tailsieve.policy.router import Dispatch, Router, RouterConfig, RouterState
from tailsieve.policy.spec import PolicySpec
from tailsieve.policy.step import GroupOutcome, GroupStatus, InvariantError, StepPlan, StepResult

SKIP_STEPS = 2  # summaries skip the warm-up and the first steady step (§4.2 evaluates the steady state)


class Executor(Protocol):
    """Runs one plan to its result (the simulator; a test's scripted executor)."""

    def execute(self, plan: StepPlan) -> StepResult:
        """Every planned group's outcome, T_tail, T_bulk (the cutoff) and the makespan."""


class AsyncExecutor(Protocol):
    """The awaitable form (real engines)."""

    def execute(self, plan: StepPlan) -> Awaitable[StepResult]:
        """As `Executor.execute`."""


PoolHook = Callable[[StepPlan], float]  # pools of the coming step in, restart seconds out
AsyncPoolHook = Callable[[StepPlan], Awaitable[float]]


@dataclass(frozen=True, slots=True)
class StepRecord:
    """Per-step measurements reported by `simulate --json` and `rollout` (build with keyword arguments)."""

    step: int
    makespan_s: float  # restart seconds included
    tail_s: float
    bulk_s: float
    q: int
    m: int
    candidates: int
    wasted_tokens: int
    batch_mean_length: float
    warmup: bool = False
    note: str = ""  # the decision's note (`Decision.note`); a peer's or a baseline's own remark
    redraws_max: int = 0  # most times a consumed group of this step had been cut before (GroupRef.cuts)
    dealt: bool = False  # a uniform step whose groups were dealt over several replicas (not uniform's group routing)
    decision: Decision | None = None  # the controller's decision after this step (None: a peer, a baseline)
    preemptions: int = 0  # the engines' preemptions in this step (`StepResult`; simulated paged replicas)
    recomputed_tokens: int = 0  # tokens prefilled again after a preemption
    prefix_hit_tokens: int = 0  # prompt tokens a prefix-cache hit did not prefill

    def to_json(self) -> dict[str, Any]:
        """Every field as plain JSON (the decision by `Decision.to_json`, null when none): a rollout's step line."""
        return {f.name: getattr(self, f.name) for f in fields(self)} | {
            "decision": None if self.decision is None else self.decision.to_json()}


@dataclass(frozen=True, slots=True)
class PolicyRun:
    """A policy's whole run: step records and the consumed batches (lengths, prompt ids) for App. E bias, with
    the fidelity inputs: redraws per consumed group, and truncation (explicit flags, else `length >= length_cap`)."""

    policy: str
    steps: tuple[StepRecord, ...]
    batch_lengths: tuple[NDArray[np.int64], ...] = field(repr=False)
    consumed_uids: tuple[int, ...] = field(repr=False)
    batch_prompts: tuple[tuple[str, ...], ...] = field(default=(), repr=False)
    batch_redraws: tuple[NDArray[np.int64], ...] = field(default=(), repr=False)  # per step: cuts per group; () = 0
    # per step: (N, G) flags (real runs: finish_reason "length"), None where unknown; () = use `length_cap`
    batch_truncated: tuple[NDArray[np.bool_] | None, ...] = field(default=(), repr=False)
    length_cap: int | None = None  # truncated = length >= cap (simulation: Workload.max_length); None = unknown
    # per step: bias-correction weight per consumed group (`analysis.weights`, opt-in); () = off
    batch_weights: tuple[NDArray[np.float64], ...] = field(default=(), repr=False)
    # batch fidelity (`analysis.fidelity.batch_fidelity`), per step and consumed group; () = none (every value 0):
    batch_delays: tuple[NDArray[np.int64], ...] = field(default=(), repr=False)  # steps since first dispatched
    batch_offpolicy: tuple[NDArray[np.int64], ...] = field(default=(), repr=False)  # tokens made in earlier steps
    step_dropped: tuple[int, ...] = field(default=(), repr=False)  # per step: prompts dropped unconsumed
    own_routing: bool = False  # routes unlike uniform at every step with m = 0 (the peers): never "uniform's routing"

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
class LoopState:
    """Everything a policy carries between steps (saved and restored by real runs)."""

    router: RouterState
    control: ControlState


@dataclass(frozen=True, slots=True)
class StepOutput:
    """One completed step: its plan and result, the state after it, what the controller saw, the record."""

    plan: StepPlan
    result: StepResult  # an executor may return a richer subclass (engines: samples, re-dispatches)
    state: LoopState
    observation: StepObservation
    record: StepRecord
    consumed: tuple[GroupOutcome, ...]  # the N complete groups in plan order (tail pool first)
    restart_s: float = 0.0

    @property
    def batch(self) -> NDArray[np.int64]:
        """(N, G) lengths of the consumed groups."""
        return self.observation.consumed_lengths


def make_controller(
    name: str, router: RouterConfig, *, bulk_curve: TpotCurve, tail_curve: TpotCurve | None = None,
    config: ControllerConfig | None = None, q: int | None = None, m: int | None = None, kv_s_per_token: float = 0.0,
    prefill_s: float = 0.0, kv_tokens: int = 0, prompt_tokens: float = 0.0,
) -> Controller:
    """The controller `name` (registry `CONTROLLERS`) for a fleet whose pools run these curves, KV term and prompt
    prefill (`prefill_s`: seconds to prefill one prompt on one replica) (§3.2); the simulator and real rollouts
    build theirs here, so both give it the same cost model."""
    cls = CONTROLLERS.resolve(name)
    if kv_tokens:  # the KV capacity only where the model holds one: a plugin controller need not take it
        return cls(router, bulk_curve, config, q=q, m=m, tail_curve=tail_curve, kv_s_per_token=kv_s_per_token,
                   prefill_s=prefill_s, kv_tokens=kv_tokens, prompt_tokens=prompt_tokens)
    return cls(router, bulk_curve, config, q=q, m=m, tail_curve=tail_curve, kv_s_per_token=kv_s_per_token,
               prefill_s=prefill_s)


def build_loop(spec: PolicySpec, prompts: Sequence[str]) -> StepLoop:
    """The one assembly point: router + controller + step loop for a validated `PolicySpec`, drawing from `prompts`
    (the prompt ids in stream order). `simulate`, `plan`, `rollout`, `Rollout` and the verl and slime adapters all
    build their loop here, so every driver gives the controller the same curves, KV term and constants."""
    c = spec.cost
    controller = make_controller(spec.policy, spec.router, bulk_curve=c.bulk_curve, tail_curve=c.tail_curve,
                                 config=spec.controller, q=spec.q, m=spec.m, kv_s_per_token=c.kv_s_per_token,
                                 prefill_s=c.prefill_s, kv_tokens=c.kv_tokens, prompt_tokens=c.prompt_tokens)
    return StepLoop(Router(spec.router, prompts, shuffle=spec.shuffle, seed=spec.seed), controller)


def step_work(plan: StepPlan, result: StepResult) -> StepWork:
    """The step's requests as they ran, plan order (tail first): tokens (a cut request's at the cutoff), replica,
    which groups were consumed and which were drawn fresh (what `policy.observed` forecasts for exactly this work,
    and the controller's sample of fresh group work)."""
    outcome = {o.ref.uid: o for o in result.outcomes}
    groups = (*plan.tail, *plan.bulk)
    g = len(plan.placement[groups[0].uid]) if groups else 0
    lengths = np.array([outcome[ref.uid].lengths for ref in groups], dtype=np.int64).reshape(len(groups), g)
    lanes = np.array([plan.placement[ref.uid] for ref in groups], dtype=np.int64).reshape(len(groups), g)
    kept = np.array([outcome[ref.uid].status is GroupStatus.DONE for ref in groups], dtype=bool)
    fresh = np.array([ref.cuts == 0 for ref in groups], dtype=bool)
    finished = np.array([outcome[ref.uid].finished_members for ref in groups], dtype=np.int64)
    uids = np.array([ref.uid for ref in groups], dtype=np.int64)
    return StepWork(lengths, lanes, len(plan.tail), kept, fresh, finished, uids)


def _pinned_after_tail(plan: StepPlan, done: tuple[GroupOutcome, ...]) -> int:
    """How many consumed groups right after the q tail groups are pinned candidates (they lead the bulk queue);
    0 unless exactly the pinned groups sit there."""
    k, q = len(plan.pinned), len(plan.tail)
    if k == 0 or {o.ref.uid for o in done[q:q + k]} != plan.pinned:
        return 0
    return k


S = TypeVar("S")  # what a loop carries between steps (`LoopState`, `PeerState`)
Out = TypeVar("Out")  # what one step gives back (`StepOutput`, `PeerOutput`)


class Loop(abc.ABC, Generic[S, Out]):
    """A step loop's step, written once for TailSieve's loop and the peers': plan → the pool hook (restart seconds)
    → execute → complete; `astep` for awaitable executors and pool hooks (real engines, launchers)."""

    @abc.abstractmethod
    def plan(self, state: S) -> StepPlan:
        """The next step's plan."""

    @abc.abstractmethod
    def complete(self, state: S, plan: StepPlan, result: StepResult, restart_s: float = 0.0) -> Out:
        """Observe the executed plan, record it, and return the state after it."""

    def step(self, state: S, executor: Executor, pools: PoolHook | None = None) -> Out:
        """Plan, give the pool hook the plan's pools, execute, complete."""
        plan = self.plan(state)
        restart_s = 0.0 if pools is None else float(pools(plan))
        return self.complete(state, plan, executor.execute(plan), restart_s)

    async def astep(self, state: S, executor: AsyncExecutor, pools: AsyncPoolHook | None = None) -> Out:
        """`step` for awaitable executors and pool hooks (real engines, launchers)."""
        plan = self.plan(state)
        restart_s = 0.0 if pools is None else float(await pools(plan))
        return self.complete(state, plan, await executor.execute(plan), restart_s)


class StepLoop(Loop[LoopState, StepOutput]):
    """One policy's step loop over a `Router` and a controller (see the module docstring)."""

    def __init__(self, router: Router, controller: Controller) -> None:
        self.router = router
        self.controller = controller

    def initial(self) -> LoopState:
        """State before the first step."""
        return LoopState(self.router.initial_state(), self._checked(self.controller.initial(), "initial"))

    def _checked(self, state: object, method: str) -> ControlState:
        """A controller's `initial()`/`update()` result: a `ControlState`, else one line naming the policy and what
        its method returned (a plugin's wrong type never reaches the router)."""
        if not isinstance(state, ControlState):
            name = self.controller.name or type(self.controller).__qualname__
            raise CONTROLLERS.returned(name, state, f"a ControlState from {method}()")
        return state

    def plan(self, state: LoopState) -> StepPlan:
        """§3.1: the next step's plan at the controller's (q, m)."""
        return self.router.plan(state.router, state.control.q, state.control.m,
                                uniform_dispatch=Dispatch(state.control.uniform_dispatch))

    def complete(self, state: LoopState, plan: StepPlan, result: StepResult, restart_s: float = 0.0) -> StepOutput:
        """Check the step contract (`Router.observe`), show the controller the step, record it."""
        rstate = self.router.observe(state.router, plan, result)
        done = tuple(o for o in result.outcomes if o.status is GroupStatus.DONE)
        batch = np.array([o.lengths for o in done], dtype=np.int64).reshape(len(done), self.router.config.group_size)
        wasted = sum(o.tokens for o in result.outcomes if o.status is GroupStatus.ABORTED)
        obs = StepObservation(
            step=plan.step, q=plan.q, m=plan.m, warmup=plan.warmup, tail_s=result.tail_s, bulk_s=result.bulk_s,
            consumed_lengths=batch, restart_s=restart_s, pinned=_pinned_after_tail(plan, done),
            work=step_work(plan, result),
        )
        cstate = self._checked(self.controller.update(state.control, obs), "update")
        record = StepRecord(
            step=plan.step, makespan_s=restart_s + result.makespan_s, tail_s=result.tail_s, bulk_s=result.bulk_s,
            q=plan.q, m=plan.m, candidates=len(rstate.candidates), wasted_tokens=int(wasted),
            batch_mean_length=float(batch.mean()) if batch.size else 0.0, warmup=plan.warmup, note=cstate.note,
            redraws_max=max((o.ref.cuts for o in done), default=0),
            dealt=plan.m == 0 and not plan.warmup and any(len(set(plan.placement[r.uid])) > 1 for r in plan.bulk),
            decision=cstate.decision, preemptions=result.preemptions, recomputed_tokens=result.recomputed_tokens,
            prefix_hit_tokens=result.prefix_hit_tokens,
        )
        return StepOutput(plan, result, LoopState(rstate, cstate), obs, record, done, restart_s)



@dataclass(frozen=True, slots=True)
class PeerOutput:
    """One completed step of a peer: plan, result, the peer's state after it, what it observed, the record."""

    plan: StepPlan
    result: StepResult
    state: PeerState
    observed: PeerStep
    record: StepRecord
    restart_s: float = 0.0


class PeerLoop(Loop[PeerState, PeerOutput]):
    """The step loop of a peer policy (`tailsieve.policy.peers`): plan → pool hook → execute → the peer's own
    observe (its step check, carry and token ledger) → record. The simulator and real rollouts both drive it."""

    def __init__(self, peer: PeerPolicy) -> None:
        self.peer = peer

    def initial(self) -> PeerState:
        """State before the first step."""
        return self.peer.initial_state()

    def complete(self, state: PeerState, plan: StepPlan, result: StepResult, restart_s: float = 0.0) -> PeerOutput:
        """Observe the step and record it (q = m = 0: every replica bulk)."""
        new, got = self.peer.observe(state, plan, result)
        g = self.peer.router.group_size
        batch = np.array([o.lengths for o in got.consumed], dtype=np.int64).reshape(len(got.consumed), g)
        note = "long round" if got.long_round else (f"resumed {len(plan.resume)}" if plan.resume else "")
        record = StepRecord(step=plan.step, makespan_s=restart_s + result.makespan_s, tail_s=0.0, bulk_s=result.bulk_s,
                            q=0, m=0, candidates=len(new.waiting), wasted_tokens=got.wasted_tokens,
                            batch_mean_length=float(batch.mean()) if batch.size else 0.0, note=note,
                            redraws_max=max((o.ref.cuts for o in got.consumed), default=0),
                            preemptions=result.preemptions, recomputed_tokens=result.recomputed_tokens,
                            prefix_hit_tokens=result.prefix_hit_tokens)
        return PeerOutput(plan, result, new, got, record, restart_s)

    def plan(self, state: PeerState) -> StepPlan:
        """The peer's plan for the next step (every replica bulk)."""
        return self.peer.plan(state)


class RunLog:
    """Accumulates a run's records and consumed batches; holds exactly-once consumption across the whole run."""

    def __init__(self, policy: str) -> None:
        self.policy = policy
        self.records: list[StepRecord] = []
        self.lengths: list[NDArray[np.int64]] = []
        self.uids: list[int] = []
        self.prompts: list[tuple[str, ...]] = []
        self.redraws: list[NDArray[np.int64]] = []
        self.weights: list[NDArray[np.float64]] = []
        self.delays: list[NDArray[np.int64]] = []
        self.offpolicy: list[NDArray[np.int64]] = []
        self.dropped: list[int] = []
        self._seen: set[int] = set()
        self._first: dict[int, int] = {}  # uid → step it was first dispatched in (`track`)

    def add(self, record: StepRecord, lengths: NDArray[np.int64], uids: list[int], prompts: tuple[str, ...],
            redraws: list[int] | None = None, weights: NDArray[np.float64] | None = None) -> None:
        """One step's record and consumed batch (redraws: cuts per consumed group, default 0; weights: bias
        correction, kept only when every step has them); InvariantError if a prompt draw is consumed a second time."""
        if self._seen.intersection(uids) or len(set(uids)) != len(uids):
            raise InvariantError(f"step {record.step}: a prompt draw was consumed twice")
        self._seen.update(uids)
        self.records.append(record)
        self.lengths.append(lengths)
        self.uids.extend(uids)
        self.prompts.append(prompts)
        self.redraws.append(np.asarray(redraws if redraws is not None else [0] * len(uids), dtype=np.int64))
        if weights is not None:
            self.weights.append(np.asarray(weights, dtype=np.float64))

    def fidelity(self, delays: list[int], offpolicy: list[int] | None = None, dropped: int = 0) -> None:
        """The last added step's batch fidelity: per consumed group the steps since its prompt was first dispatched
        and its tokens generated in earlier steps (default 0), and the prompts dropped this step."""
        self.delays.append(np.asarray(delays, dtype=np.int64))
        self.offpolicy.append(np.asarray(offpolicy if offpolicy is not None else [0] * len(delays), dtype=np.int64))
        self.dropped.append(int(dropped))

    def track(self, step: int, dispatched: list[int], consumed: list[int]) -> list[int]:
        """Remember the step each uid was first dispatched in; the delays (steps since then) of the consumed ones."""
        for uid in dispatched:
            self._first.setdefault(uid, step)
        return [step - self._first.pop(uid) for uid in consumed]

    def add_output(self, out: StepOutput, weights: NDArray[np.float64] | None = None) -> None:
        """`add` for a step the loop completed, with its delays (a regenerated cut group: 1 step, or more if it
        waited in the queue); nothing of a StepLoop step is off-policy or dropped."""
        uids = [o.ref.uid for o in out.consumed]
        self.add(out.record, out.batch, uids, tuple(o.ref.prompt_id for o in out.consumed),
                 [o.ref.cuts for o in out.consumed], weights)
        ran = [ref.uid for ref in (*out.plan.tail, *out.plan.bulk)]
        self.fidelity(self.track(out.plan.step, ran, uids))

    def add_peer(self, out: PeerOutput) -> None:
        """`add` and `fidelity` for a step of a peer's loop (its delays, off-policy tokens and drops)."""
        got = out.observed
        g = len(out.plan.placement[got.consumed[0].ref.uid]) if got.consumed else 0
        batch = np.array([o.lengths for o in got.consumed], dtype=np.int64).reshape(len(got.consumed), g)
        self.add(out.record, batch, [o.ref.uid for o in got.consumed], tuple(o.ref.prompt_id for o in got.consumed),
                 [o.ref.cuts for o in got.consumed])
        self.fidelity(list(got.delays), list(got.offpolicy), got.dropped)

    def check_final(self, state: RouterState) -> None:
        """No draw lost or duplicated overall: consumed + waiting = drawn, and none both (InvariantError)."""
        pending = {r.uid for r in (*state.candidates, *state.requeue)}
        drawn = state.stream.position if state.stream else 0
        if pending & self._seen or len(pending) + len(self._seen) != drawn:
            raise InvariantError("prompt draws lost or duplicated across steps")

    def run(self) -> PolicyRun:
        """The run so far."""
        weights = tuple(self.weights) if len(self.weights) == len(self.records) else ()
        full = len(self.delays) == len(self.records)
        return PolicyRun(self.policy, tuple(self.records), tuple(self.lengths), tuple(self.uids), tuple(self.prompts),
                         tuple(self.redraws), batch_weights=weights,
                         batch_delays=tuple(self.delays) if full else (),
                         batch_offpolicy=tuple(self.offpolicy) if full else (),
                         step_dropped=tuple(self.dropped) if full else ())
