"""Step planning (§3.1), pure: router state + (q, m) in, a `StepPlan` out; a `StepResult` in, the next state out.

The same code drives the simulator and real engines: an executor runs the plan (dispatching each group's
requests to the replicas the plan names, cutting the bulk pool after `bulk_quota` complete groups) and reports a
`StepResult`. Every prompt drawn from the stream is consumed exactly once: a drawn prompt (a `GroupRef`, keyed
by its stream index `uid`) is either consumed in a step's batch or waits as a candidate / requeued group.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

import numpy as np

from tailsieve.errors import ConfigError
from tailsieve.inputs import MAX_INT, check_tail_replicas, excerpt, int_in, json_object
from tailsieve.policy.ranking import DEFAULT_RANKING, RANKINGS, rank
from tailsieve.policy.step import (
    GroupRef,
    GroupStatus,
    InvariantError,
    Pool,
    StepPlan,
    StepResult,
)
from tailsieve.policy.stream import PromptStream, StreamState

DEFAULT_REDRAWS = 1  # RouterConfig.max_redraws: an unfinished group is regenerated once (§3.1, App. E)


class Dispatch(StrEnum):
    """Round-robin unit inside a pool: each request (§3.1) or each whole group (keeps a prompt prefix together)."""

    REQUEST = "request"
    GROUP = "group"


def dispatch_of(value: object) -> Dispatch:
    """A `Dispatch` from itself or its text (the one check of a dispatch setting: flag, config key, argument)."""
    if isinstance(value, Dispatch):
        return value
    if value not in ("request", "group"):
        raise ConfigError(f"dispatch must be request or group, got {value!r}")
    return Dispatch(str(value))


def _knob(default: Any, help: str) -> Any:
    """A `RouterKnobs` field with its help line (as a flag's help: `%(default)s` stands for the default)."""
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True, slots=True, kw_only=True)
class RouterKnobs:
    """The router's knobs a run sets over its step shape, each declared once, here, with its help line: `RouterConfig`
    and every configuration that sets them extend it (`RolloutConfig`, verl's `TailSieveSettings`, slime's
    `SlimeSettings`), and the CLI flags and slime's settings are derived from its fields (`policy.router_knobs`).
    Checked when a `RouterConfig` is built from them."""

    rho: float = _knob(0.1, "over-provisioning ρ, E = ⌈ρN⌉ (default: %(default)s)")
    dispatch: Dispatch = _knob(Dispatch.REQUEST,  # noqa: RUF009 (an enum member is immutable)
                               "round-robin unit inside a pool: request (§3.1, default) or group")
    max_redraws: int = _knob(DEFAULT_REDRAWS, "times a prompt's group may be cut before its next attempt must complete "
                             "(default: %(default)s: regenerated once, App. E); larger values trade length bias for "
                             "speed")
    ranking: str = _knob(DEFAULT_RANKING, "candidate ranking: a registered name (least-progress, stream-order), a "
                         "plugin pkg.module:function or an entry point of tailsieve.rankings (default: %(default)s; "
                         "docs/architecture.md)")


@dataclass(frozen=True, slots=True)
class RouterConfig(RouterKnobs):
    """Step shape: N groups of G on R replicas, and the router's knobs (`RouterKnobs`): over-provisioning ρ
    (E = ⌈ρN⌉), dispatch, redraw limit, ranking.

    `max_redraws` (default 1): a group is cut at most this many times; a group cut that often is pinned, i.e. its
    next attempt runs to completion (in the tail pool, or the bulk cutoff waits for it), so a long draw is not
    redrawn until it happens to be short (App. E). Larger values trade length bias for speed.
    """

    groups: int = 64
    group_size: int = 8
    replicas: int = 8

    def __post_init__(self) -> None:
        object.__setattr__(self, "dispatch", dispatch_of(self.dispatch))
        if self.groups < 1:
            raise ConfigError(f"groups (N) must be >= 1, got {self.groups}")
        if self.group_size < 1:
            raise ConfigError(f"group size (G) must be >= 1, got {self.group_size}")
        if self.replicas < 1:
            raise ConfigError(f"replicas (R) must be >= 1, got {self.replicas}")
        if not (0.0 <= self.rho <= 1.0) or math.isnan(self.rho):
            raise ConfigError(f"rho must lie in [0, 1], got {self.rho}")
        if isinstance(self.max_redraws, bool) or not isinstance(self.max_redraws, int) or self.max_redraws < 1:
            raise ConfigError(f"max_redraws must be an integer >= 1, got {self.max_redraws!r}")
        RANKINGS.check(self.ranking)

    def pinned(self, ref: GroupRef) -> bool:
        """Whether a group was cut `max_redraws` times: its next attempt must complete."""
        return ref.cuts >= self.max_redraws

    @property
    def pins_candidates(self) -> bool:
        """Whether every candidate is pinned (the redraw limit is 1: a candidate was cut once, so its next attempt
        must complete, isolated or not)."""
        return self.max_redraws <= 1

    @property
    def extra(self) -> int:
        """E = ⌈ρN⌉ over-provisioned groups (§3.1); at least 1 when ρ > 0."""
        return math.ceil(self.rho * self.groups - 1e-9)


@dataclass(frozen=True, slots=True)
class RouterState:
    """Everything the router carries between steps (saved and restored by real runs)."""

    step: int = 0
    stream: StreamState | None = None
    requeue: tuple[GroupRef, ...] = ()
    candidates: tuple[GroupRef, ...] = ()  # ranked: most likely tail first
    consumed: int = 0

    @property
    def waiting(self) -> tuple[GroupRef, ...]:
        """Drawn groups not consumed yet: requeued, then candidates."""
        return (*self.requeue, *self.candidates)

    def to_json(self) -> dict[str, Any]:
        """Plain JSON-able dict (a group as [uid, prompt_id, cuts])."""
        return {"step": self.step, "stream": self.stream.to_json() if self.stream else None,
                "requeue": [_ref_json(r) for r in self.requeue], "candidates": [_ref_json(r) for r in self.candidates],
                "consumed": self.consumed}

    @classmethod
    def from_json(cls, obj: Any, where: str = "router") -> RouterState:
        """Inverse of `to_json`, field by field, with the router's bookkeeping checked: counters >= 0, every waiting
        group once, drawn before the stream's position, and consumed + waiting = drawn (a ConfigError naming the
        field otherwise)."""
        d = json_object(obj, where, ("step", "stream", "requeue", "candidates", "consumed"))
        stream = None if d["stream"] is None else StreamState.from_json(d["stream"], f"{where}.stream")
        step, consumed = (int_in(d[k], f"{where}.{k}", 0, MAX_INT) for k in ("step", "consumed"))
        state = cls(step, stream, _refs(d["requeue"], f"{where}.requeue"),
                    _refs(d["candidates"], f"{where}.candidates"), consumed)
        drawn = 0 if stream is None else stream.position
        uids = [r.uid for r in state.waiting]
        if len(set(uids)) != len(uids):
            dup = next(u for u in uids if uids.count(u) > 1)
            raise ConfigError(f"{where}: group uid {dup} waits twice (requeue and candidates hold each group once)")
        if any(u >= drawn for u in uids):
            raise ConfigError(f"{where}: waiting group uid {max(uids)} was never drawn (the stream is at {drawn})")
        if state.consumed + len(uids) != drawn:
            raise ConfigError(f"{where}: {state.consumed} consumed + {len(uids)} waiting groups != {drawn} drawn "
                              "from the stream")
        return state


def _ref_json(ref: GroupRef) -> list[Any]:
    return [ref.uid, ref.prompt_id, ref.cuts]


def _refs(rows: Any, where: str) -> tuple[GroupRef, ...]:
    """Saved groups: a list of [uid >= 0, prompt id (non-empty text), cuts >= 0]."""
    if not isinstance(rows, list):
        raise ConfigError(f"{where} must be a list of [uid, prompt_id, cuts], got {type(rows).__name__}")
    out = []
    for i, row in enumerate(rows):
        if not isinstance(row, list) or len(row) != 3 or not isinstance(row[1], str) or not row[1]:
            raise ConfigError(f"{where}[{i}] must be [uid, prompt_id, cuts] with a non-empty prompt id, "
                              f"got {excerpt(row)}")
        out.append(GroupRef(int_in(row[0], f"{where}[{i}] uid", 0, MAX_INT), row[1],
                            int_in(row[2], f"{where}[{i}] cuts", 0, MAX_INT)))
    return tuple(out)


def pool_split(replicas: int, m: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The router's pool convention (§3.1): the last m replica ids form the tail pool, the rest the bulk pool.
    Everything else (executors, launchers, reports) reads the pools from `StepPlan`, never from m."""
    return tuple(range(replicas - m, replicas)), tuple(range(replicas - m))


def round_robin(
    groups: Sequence[GroupRef], replicas: Sequence[int], g: int, dispatch: Dispatch
) -> dict[int, tuple[int, ...]]:
    """Round-robin inside one pool, by request (continuing across groups) or by group."""
    if not groups:
        return {}
    reps = np.asarray(replicas, dtype=np.int64)
    if dispatch is Dispatch.GROUP:
        slot = np.repeat(np.arange(len(groups))[:, None], g, axis=1)
    else:
        slot = np.arange(len(groups) * g).reshape(len(groups), g)
    rows: list[list[int]] = reps[slot % reps.size].tolist()
    return {ref.uid: tuple(row) for ref, row in zip(groups, rows, strict=True)}


class Router:
    """Plans steps for one prompt list and `RouterConfig`; holds no mutable state."""

    def __init__(self, config: RouterConfig, prompts: Sequence[str], *, shuffle: bool = False, seed: int = 0):
        self.config = config
        self.prompts = tuple(prompts)
        self._order = PromptStream(self.prompts, shuffle=shuffle, seed=seed)  # never drawn from: `prompt_at` only
        self._stream0 = self._order.state()

    @property
    def stream0(self) -> StreamState:
        """The prompt stream before the first step (size, shuffle, seed)."""
        return self._stream0

    def prompt_at(self, uid: int) -> str:
        """The prompt id drawn at stream position `uid` (the group `GroupRef(uid, …)` regenerates)."""
        return self._order.prompt_at(uid)

    def initial_state(self) -> RouterState:
        """State before the first step."""
        return RouterState(stream=self._stream0)

    def _draw(
        self, state: RouterState, front: Sequence[GroupRef], k: int, room: int
    ) -> tuple[list[GroupRef], StreamState, tuple[GroupRef, ...]]:
        """The next k groups of the queue (front, requeue, then fresh draws), at most `room` of them pinned (the
        bulk quota: more could not all be consumed); pinned groups beyond it keep their place in the queue."""
        taken: list[GroupRef] = []
        left: list[GroupRef] = []
        for ref in (*front, *state.requeue):
            pin = self.config.pinned(ref)
            if len(taken) < k and (room > 0 or not pin):
                taken.append(ref)
                room -= pin
            else:
                left.append(ref)
        stream = PromptStream.from_state(self.prompts, state.stream or self._stream0)
        taken += [GroupRef(p.index, p.prompt_id) for p in stream.take(k - len(taken))]
        return taken, stream.state(), tuple(left)

    def _pins(self, bulk: Sequence[GroupRef]) -> frozenset[int]:
        return frozenset(ref.uid for ref in bulk if self.config.pinned(ref))

    def warmup(self, state: RouterState, *, dispatch: Dispatch | None = None) -> StepPlan:
        """§3.1 warm-up: every replica bulk, N + E groups, cut when N are complete (the rest become candidates)."""
        cfg = self.config
        bulk, stream, left = self._draw(state, (), cfg.groups + cfg.extra, cfg.groups)
        reps = tuple(range(cfg.replicas))
        place = round_robin(bulk, reps, cfg.group_size, dispatch or cfg.dispatch)
        return StepPlan(state.step, (), tuple(bulk), place, (), reps, cfg.groups, True, stream, left, self._pins(bulk))

    def plan(self, state: RouterState, q: int, m: int, *, dispatch: Dispatch | None = None,
             uniform_dispatch: Dispatch = Dispatch.GROUP) -> StepPlan:
        """§3.1: uniform when m = 0 (or E = 0); warm-up when there are no candidates; else q candidates + fresh bulk.

        Uniform steps dispatch round-robin by `uniform_dispatch`: whole groups (the paper's uniform group routing, the
        default) or each request (how a least-loaded balancer deals a synchronous step; the controller chooses);
        `dispatch` applies to the two-pool steps. The isolated q is clamped to [1, min(candidates, N)]; the rest of the
        candidates go back to the front of the queue. Pinned groups drawn into the bulk pool are listed in `plan.pinned`
        (at most the bulk quota of them; any beyond wait at the front of the queue), so exactly N groups are consumed.
        """
        cfg = self.config
        n, g, r, e = cfg.groups, cfg.group_size, cfg.replicas, cfg.extra
        disp = dispatch or cfg.dispatch
        check_tail_replicas(m, r)
        if m == 0 or e == 0:  # uniform (group-atomic): waiting candidates rejoin the queue, all N run to the end
            bulk, stream, left = self._draw(state, state.candidates, n, n)
            reps = tuple(range(r))
            place = round_robin(bulk, reps, g, uniform_dispatch)
            return StepPlan(state.step, (), tuple(bulk), place, (), reps, n, False, stream, left, self._pins(bulk))
        if not state.candidates:
            return self.warmup(state, dispatch=disp)
        q_eff = min(max(q, 1), len(state.candidates), n)
        tail = state.candidates[:q_eff]
        bulk, stream, left = self._draw(state, state.candidates[q_eff:], n - q_eff + e, n - q_eff)
        tail_reps, bulk_reps = pool_split(r, m)
        placement = round_robin(tail, tail_reps, g, disp) | round_robin(bulk, bulk_reps, g, disp)
        return StepPlan(
            state.step, tuple(tail), tuple(bulk), placement, tail_reps, bulk_reps, n - q_eff, False, stream, left,
            self._pins(bulk),
        )

    def observe(self, state: RouterState, plan: StepPlan, result: StepResult) -> RouterState:
        """Check the step contract and rank next step's candidates: bulk groups unfinished at the cutoff.

        Contract (InvariantError otherwise): one outcome per planned group in its planned pool; exactly N DONE
        groups, each with all G members finished; every tail group and every pinned bulk group DONE; no consumed
        group cut more than `max_redraws` times; and no draw lost or duplicated overall, i.e. consumed + candidates
        + requeued = prompts drawn from the stream.
        """
        cfg = self.config
        g = cfg.group_size
        pool_of = {ref.uid: Pool.TAIL for ref in plan.tail} | {ref.uid: Pool.BULK for ref in plan.bulk}
        seen = [o.ref.uid for o in result.outcomes]
        if len(pool_of) != len(plan.tail) + len(plan.bulk) or len(seen) != len(set(seen)) or set(seen) != set(pool_of):
            raise InvariantError(f"step {plan.step}: outcomes do not match the plan (lost or duplicated groups)")
        if any(pool_of[o.ref.uid] is not o.pool for o in result.outcomes):
            raise InvariantError(f"step {plan.step}: a group is reported in a pool it was not planned in")
        done = [o for o in result.outcomes if o.status is GroupStatus.DONE]
        if len(done) != cfg.groups:
            raise InvariantError(f"step {plan.step}: {len(done)} complete groups, expected exactly {cfg.groups}")
        if any(o.finished_members != g or len(o.lengths) != g for o in done):
            raise InvariantError(f"step {plan.step}: a group reported done has unfinished members")
        if any(o.status is not GroupStatus.DONE for o in result.outcomes if o.pool is Pool.TAIL):
            raise InvariantError(f"step {plan.step}: a tail-pool group was not completed")
        if not plan.pinned <= {o.ref.uid for o in done if o.pool is Pool.BULK}:
            raise InvariantError(f"step {plan.step}: a pinned group was not completed in the bulk pool")
        if any(o.ref.cuts > cfg.max_redraws for o in done):
            raise InvariantError(f"step {plan.step}: a consumed group was cut more than {cfg.max_redraws} times")
        cut = [o for o in result.outcomes if o.status is GroupStatus.ABORTED]
        cut = rank(cfg.ranking, cut)
        candidates = tuple(replace(o.ref, cuts=o.ref.cuts + 1) for o in cut)
        consumed = state.consumed + len(done)
        pending = {ref.uid for ref in (*candidates, *plan.requeue_after)}
        ran_and_waits = {ref.uid for ref in plan.requeue_after} & set(pool_of)
        if len(pending) != len(candidates) + len(plan.requeue_after) or ran_and_waits:
            raise InvariantError(f"step {plan.step}: a waiting group is duplicated")
        if consumed + len(pending) != plan.stream_after.position:
            raise InvariantError(
                f"step {plan.step}: {consumed} consumed + {len(pending)} waiting != {plan.stream_after.position} drawn"
            )
        return RouterState(
            step=state.step + 1,
            stream=plan.stream_after,
            requeue=plan.requeue_after,
            candidates=candidates,
            consumed=consumed,
        )
