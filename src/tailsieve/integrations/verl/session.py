"""One TailSieve step as a framework sees it, with no framework imported (the verl plugin's core).

`StepSession` wraps the shared step loop (`tailsieve.loop.StepLoop`): `begin()` asks the router for the next plan
and turns every planned group into an `Assignment` (pool, replica per member, a group key and one stable request
id per member); the framework reports each group's completion (`mark_done`); `cut_ready()` says when the step can
be cut (every tail group and every pinned bulk group complete, and the bulk quota reached: the step contract's
`tailsieve.policy.step.Cutoff`, which every executor applies); `kept()` are the exactly N consumed groups and
`leftovers()` the rest, whose requests are aborted and whose groups the router carries to the next step, where they
are regenerated from scratch under new request ids (never resumed). `finish()` builds the `StepResult` and completes
the step through the loop (contract check, controller update). Policy decides, the framework acts: nothing here
re-implements the router or the controller.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, fields
from typing import Any

from tailsieve.errors import ConfigError
from tailsieve.inputs import excerpt
from tailsieve.loop import LoopState, StepLoop, StepOutput, build_loop
from tailsieve.policy.control_state import ControllerConfig
from tailsieve.policy.controller import CONTROLLERS
from tailsieve.policy.controller_knobs import controller_from_mapping
from tailsieve.policy.router import RouterConfig, RouterKnobs
from tailsieve.policy.router_knobs import router_values
from tailsieve.policy.spec import FleetCost, PolicySpec
from tailsieve.policy.step import Cutoff, GroupOutcome, GroupRef, GroupStatus, Pool, StepPlan, StepResult

ROUTE_FIELD = "tailsieve_route"  # per-prompt field: the group's route (`Assignment.route`)
CUT_TAG = "tailsieve_cut"  # TransferQueue tag on a cut group's key: its unsent members are never sent
_REQUEST_ID = re.compile(r"^ts-(\d+)-(\d+)-(\d+)-(\d+)$")
_ROUTE = re.compile(r"^(ts-(\d+)-(\d+)-a(\d+))@(\d+(?:,\d+)*)$")


def request_id(step: int, uid: int, member: int, attempt: int) -> str:
    """The stable request id of one member of one attempt of a group: `ts-{step}-{uid}-{member}-{attempt}`."""
    return f"ts-{step}-{uid}-{member}-{attempt}"


def parse_request_id(rid: str) -> tuple[int, int, int, int] | None:
    """(step, uid, member, attempt) of a TailSieve request id, None for any other id."""
    m = _REQUEST_ID.match(rid)
    return None if m is None else (int(m[1]), int(m[2]), int(m[3]), int(m[4]))


def group_key(rid: str) -> str | None:
    """The group key (`Assignment.key`, `ts-{step}-{uid}-a{attempt}`) of a TailSieve request id, else None."""
    parsed = parse_request_id(rid)
    return None if parsed is None else f"ts-{parsed[0]}-{parsed[1]}-a{parsed[3]}"


@dataclass(frozen=True, slots=True)
class Routed:
    """The request a running member sends: its TailSieve request id and the replica the plan gave it."""

    request_id: str
    replica: int


_CURRENT: ContextVar[Routed | None] = ContextVar("tailsieve_routed", default=None)


def member_route(route: str, member: int) -> Routed:
    """The request id and replica of `member` of the group whose route is `route` (ConfigError if malformed)."""
    m = _ROUTE.match(route)
    if m is None:
        raise ConfigError(f"malformed TailSieve route {excerpt(route)} (expected ts-STEP-UID-aATTEMPT@R0,R1,...)")
    replicas = [int(r) for r in m[5].split(",")]
    if not 0 <= member < len(replicas):
        raise ConfigError(f"member {member} out of range for route {excerpt(route)} ({len(replicas)} members)")
    return Routed(request_id(int(m[2]), int(m[3]), member, int(m[4])), replicas[member])


@contextlib.contextmanager
def routed(route: Routed) -> Iterator[Routed]:
    """Within this context (this task and what it awaits), requests go out as `route` (see `current_route`)."""
    token = _CURRENT.set(route)
    try:
        yield route
    finally:
        _CURRENT.reset(token)


def current_route() -> Routed | None:
    """The route set by the enclosing `routed(...)`, None outside one."""
    return _CURRENT.get()


@dataclass(frozen=True, slots=True)
class TailSieveSettings(RouterKnobs):
    """The plugin's settings (verl: `trainer.v1.tailsieve.*`); N and G come from the framework's batch shape, the
    router's knobs (`rho`, `dispatch`, `max_redraws`, `ranking`) are `RouterKnobs`' own fields."""

    policy: str = "tailsieve"  # controller by name (`tailsieve.policy.controller.CONTROLLERS`)
    q: int | None = None  # static policy only
    m: int | None = None
    q0: int | None = None  # adaptive controllers' initial q and m (None: `ControllerConfig`'s; also `controller`)
    m0: int | None = None
    # any `ControllerConfig` field by name (`+trainer.v1.tailsieve.controller.z=1.5`; `controller_from_mapping`)
    controller: Mapping[str, Any] | None = None
    curve: str = "h100-llama3-8b"  # the cost model: a curve or `tailsieve profile`'s model file (τ(b) and kv term)
    tail_curve: str | None = None  # the tail pool's own measured curve (None: `curve`)
    kv_ms_per_1k: float | None = None  # the controller's KV-traffic term (None: the `curve` model file's, else 0)
    poll_s: float = 0.2  # how often the replay buffer looks for completed groups
    abort_timeout_s: float = 60.0  # how long end of sampling waits for aborted leftovers to settle

    def __post_init__(self) -> None:
        CONTROLLERS.check(self.policy)
        if not self.poll_s > 0 or not self.abort_timeout_s > 0:
            raise ConfigError("trainer.v1.tailsieve.poll_s and abort_timeout_s must be > 0")
        self.controller_config()  # a bad controller field fails at construction, in one line

    def controller_config(self) -> ControllerConfig:
        """`controller` (field name → value, each checked once) with `q0` and `m0` on top; a field given both ways
        is a ConfigError."""
        where = "trainer.v1.tailsieve.controller"
        if self.controller is not None and not isinstance(self.controller, Mapping):
            raise ConfigError(f"{where} must be a mapping of controller fields, got {type(self.controller).__name__}")
        table = dict(self.controller or {})
        for name in ("q0", "m0"):
            value = getattr(self, name)
            if value is not None and name in table:
                raise ConfigError(f"trainer.v1.tailsieve.{name} and trainer.v1.tailsieve.controller.{name} are both "
                                  "set: give one")
            if value is not None:
                table[name] = value
        return controller_from_mapping(table, where)

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any] | None) -> TailSieveSettings:
        """From a config mapping; unknown keys are a ConfigError naming the valid ones."""
        raw = dict(raw or {})
        valid = [f.name for f in fields(cls)]
        unknown = sorted(set(raw) - set(valid))
        if unknown:
            raise ConfigError(f"unknown trainer.v1.tailsieve key(s) {', '.join(unknown)} (valid: {', '.join(valid)})")
        if isinstance(raw.get("controller"), Mapping):  # hydra's DictConfig: a plain dict of its values
            raw["controller"] = dict(raw["controller"])
        return cls(**raw)

    def spec(self, groups: int, group_size: int, replicas: int) -> PolicySpec:
        """The `PolicySpec` for N groups of G on `replicas` servers: every policy check, once."""
        rc = RouterConfig(groups=groups, group_size=group_size, replicas=replicas, **router_values(self))
        cost = FleetCost.load(self.curve, tail_curve=self.tail_curve, kv_ms_per_1k=self.kv_ms_per_1k)
        return PolicySpec(self.policy, rc, cost, self.controller_config(), q=self.q, m=self.m)

    def loop(self, groups: int, group_size: int, replicas: int, prompts: Sequence[str]) -> StepLoop:
        """The step loop (router + controller) for N groups of G on `replicas` servers drawing from `prompts`
        (`tailsieve.loop.build_loop`: the same assembly as `simulate` and `Rollout`)."""
        return build_loop(self.spec(groups, group_size, replicas), prompts)


@dataclass(frozen=True, slots=True)
class Assignment:
    """One planned group: pool, replica per member, attempt (= times cut before), key and request ids."""

    step: int
    ref: GroupRef
    pool: Pool
    replicas: tuple[int, ...]
    pinned: bool

    @property
    def attempt(self) -> int:
        """0 for a fresh group, k for the k-th regeneration of a carried group."""
        return self.ref.cuts

    @property
    def key(self) -> str:
        """The group's key for this attempt (verl: the prompt uid in TransferQueue); new on every attempt."""
        return f"ts-{self.step}-{self.ref.uid}-a{self.attempt}"

    @property
    def route(self) -> str:
        """What travels with the prompt to the agent loop: the key and every member's replica."""
        return f"{self.key}@{','.join(map(str, self.replicas))}"

    @property
    def request_ids(self) -> tuple[str, ...]:
        """One stable, abortable request id per member."""
        return tuple(request_id(self.step, self.ref.uid, j, self.attempt) for j in range(len(self.replicas)))


class StepSession:
    """Runs the step loop one step at a time for a framework (see the module docstring)."""

    def __init__(self, loop: StepLoop, state: LoopState | None = None) -> None:
        self.loop = loop
        self.state = state or loop.initial()
        self.plan: StepPlan | None = None
        self.assignments: dict[int, Assignment] = {}
        self._done: dict[int, tuple[float, tuple[int, ...]]] = {}  # uid → (seconds since begin, member lengths)
        self._progress: dict[int, tuple[int, ...]] = {}
        self._t0 = 0.0

    @property
    def group_size(self) -> int:
        """G."""
        return self.loop.router.config.group_size

    def begin(self) -> tuple[Assignment, ...]:
        """Plan the next step: every group's assignment, tail pool first (carried groups come back here)."""
        if self.plan is not None:
            raise RuntimeError(f"step {self.plan.step} is still open: finish() it before the next begin()")
        plan = self.loop.plan(self.state)
        pool_of = {r.uid: Pool.TAIL for r in plan.tail} | {r.uid: Pool.BULK for r in plan.bulk}
        self.plan = plan
        self.assignments = {r.uid: Assignment(plan.step, r, pool_of[r.uid], plan.placement[r.uid],
                                              r.uid in plan.pinned) for r in (*plan.tail, *plan.bulk)}
        self._done, self._progress = {}, {}
        self._t0 = time.perf_counter()
        return tuple(self.assignments.values())

    def by_key(self) -> dict[str, Assignment]:
        """This step's assignments by group key."""
        return {a.key: a for a in self.assignments.values()}

    def mark_done(self, uid: int, lengths: Sequence[int]) -> None:
        """Group `uid` completed now with these member lengths (first report wins)."""
        if uid not in self.assignments:
            raise KeyError(f"group {uid} is not part of the open step")
        if uid not in self._done:
            lens = tuple(int(x) for x in lengths)
            lens = lens + (0,) * (self.group_size - len(lens))
            self._done[uid] = (time.perf_counter() - self._t0, lens[: self.group_size])

    def mark_progress(self, uid: int, lengths: Sequence[int]) -> None:
        """Tokens generated so far by an unfinished group's members (for the cut groups' outcomes)."""
        self._progress[uid] = tuple(int(x) for x in lengths)

    def _rule(self) -> Cutoff:
        """The open step's cutoff rule (the step contract's `Cutoff`)."""
        return Cutoff.of(self._plan())

    def _kept_bulk(self) -> tuple[int, ...]:
        by_time = [u for _, u in sorted((t, u) for u, (t, _) in self._done.items())]  # completion order
        return self._rule().kept_bulk(by_time)

    def cut_ready(self) -> bool:
        """Whether the step can be cut now: tail and pinned groups complete, the bulk quota reached."""
        return self._rule().ready(self._done)

    def kept(self) -> tuple[Assignment, ...]:
        """The consumed groups once `cut_ready()`: exactly N, tail pool first."""
        rule = self._rule()
        keep = rule.tail | rule.pinned | set(self._kept_bulk())
        return tuple(a for u, a in self.assignments.items() if u in keep)

    def leftovers(self) -> tuple[Assignment, ...]:
        """The groups cut at this step (aborted now, carried and regenerated from scratch next step)."""
        keep = {a.ref.uid for a in self.kept()}
        return tuple(a for u, a in self.assignments.items() if u not in keep)

    def result(self) -> StepResult:
        """The step's `StepResult` (call once `cut_ready()`)."""
        if not self.cut_ready():
            raise RuntimeError("the step is not ready to be cut: tail/pinned groups or the bulk quota are missing")
        keep = {a.ref.uid for a in self.kept()}
        out: list[GroupOutcome] = []
        for uid, a in self.assignments.items():
            if uid in keep:
                t, lens = self._done[uid]
                out.append(GroupOutcome(a.ref, a.pool, GroupStatus.DONE, t, lens, self.group_size))
            else:
                done = self._done.get(uid)
                lens = done[1] if done else self._progress.get(uid, (0,) * self.group_size)
                finished = self.group_size if done else 0
                out.append(GroupOutcome(a.ref, a.pool, GroupStatus.ABORTED, None, lens, finished))
        tail_s = max((o.finish_s or 0.0 for o in out if o.pool is Pool.TAIL), default=0.0)
        bulk_s = max((o.finish_s or 0.0 for o in out if o.pool is Pool.BULK and o.finish_s is not None), default=0.0)
        return StepResult(self._plan().step, tuple(out), tail_s, bulk_s, max(tail_s, bulk_s))

    def finish(self) -> StepOutput:
        """Complete the step through the loop (contract check, controller update); the state moves on."""
        out = self.loop.complete(self.state, self._plan(), self.result())
        self.state = out.state
        self.plan = None
        return out

    def _plan(self) -> StepPlan:
        if self.plan is None:
            raise RuntimeError("no open step: call begin() first")
        return self.plan
