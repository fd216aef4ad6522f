"""The peer contract: `PeerPolicy` (the base every peer subclasses), its frozen state and step values, its knobs and
the registry `PEERS` (name → class, filled by `@register_peer("name")`, as `@register` fills `CONTROLLERS`).

A peer decides two things, as hooks (pure: frozen values in, frozen values out; no clocks or I/O):
- `lineup(state)`: which waiting groups run this step (in front of fresh prompts), which stay waiting, how many
  groups start and how many must complete (the bulk quota);
- `carry(cut, first)`: what happens to the groups cut at the step's cutoff: carried (from scratch, or with their
  tokens as a prefix that a later step resumes) or dropped.
and may set `dispatch` (the round-robin unit) and `long_round(state)` (a round run to completion).

The base does the rest once, for every peer: the plan (`StepPlan`, every replica bulk), the step contract check
(one outcome per planned group, exactly the quota complete), exactly-once consumption (consumed + dropped + waiting =
drawn), the delays and off-policy tokens of the consumed groups, and the token ledger. **The ledger is the
contract for wasted tokens**: tokens waiting as prefixes before the step + tokens the cut groups hold − prefixes
resumed this step − prefixes waiting after = tokens thrown away. A peer never reports its own waste, so a peer that
discards a prefix (regenerates a carried group from scratch, or drops a waiting prompt) has those tokens counted as
wasted whether or not it thought of them; a prefix a plan resumes must be the one that waits, and a carried prefix
must be the tokens its group had at the cut (InvariantError otherwise).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import ClassVar

from tailsieve.errors import ConfigError
from tailsieve.policy.router import Dispatch, RouterConfig, round_robin
from tailsieve.policy.step import GroupOutcome, GroupRef, GroupStatus, InvariantError, StepPlan, StepResult
from tailsieve.policy.stream import PromptStream, StreamState
from tailsieve.registry import Registry


@dataclass(frozen=True, slots=True)
class PeerConfig:
    """The peers' published knobs.

    `oversample`: over-sampling ratio (slime: over_sampling_batch_size / rollout_batch_size − 1; RollPacker: extra
    prompts per short round), E = ⌈oversample·N⌉ extra groups; None = the router's ρ, so peers and TailSieve
    over-provision alike. `long_round_period`: RollPacker runs a long round every this many steps (when any
    deferred prompt waits); None = whenever N deferred prompts wait (a full batch of them)."""

    oversample: float | None = None
    long_round_period: int | None = None

    def __post_init__(self) -> None:
        if self.oversample is not None and not (0.0 <= self.oversample <= 4.0):  # also rejects NaN
            raise ConfigError(f"oversample must lie in [0, 4], got {self.oversample}")
        lrp = self.long_round_period
        if lrp is not None and (isinstance(lrp, bool) or not isinstance(lrp, int) or lrp < 2):
            raise ConfigError(f"long_round_period must be an integer >= 2 or None, got {lrp!r}")

    def extra(self, router: RouterConfig) -> int:
        """E: groups started beyond the N a step keeps."""
        if self.oversample is None:
            return router.extra
        return math.ceil(self.oversample * router.groups - 1e-9)


@dataclass(frozen=True, slots=True)
class Waiting:
    """A drawn prompt not consumed yet: the step it was first dispatched in, and the tokens each member already has
    (april-partial's buffer; () = starts from scratch, as RollPacker's deferred prompts do)."""

    ref: GroupRef
    first_step: int
    prefix: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class PeerState:
    """Everything a peer carries between steps."""

    step: int = 0
    stream: StreamState | None = None
    waiting: tuple[Waiting, ...] = ()
    consumed: int = 0
    dropped: int = 0

    @property
    def prefix_tokens(self) -> int:
        """Tokens waiting as prefixes (the ledger's balance)."""
        return sum(sum(w.prefix) for w in self.waiting)


@dataclass(frozen=True, slots=True)
class PeerStep:
    """One observed step: the consumed groups (plan order) with their delays (steps since first dispatched) and
    off-policy tokens (their resumed prefixes), prompts dropped, tokens thrown away (the ledger's), and whether it was
    a long round."""

    consumed: tuple[GroupOutcome, ...]
    delays: tuple[int, ...]
    offpolicy: tuple[int, ...]
    dropped: int
    wasted_tokens: int
    long_round: bool


@dataclass(frozen=True, slots=True)
class Lineup:
    """A step's shape (`PeerPolicy.lineup`): the waiting groups that run first, the ones that keep waiting, how many
    groups start (fresh prompts fill up to it) and how many must complete (None: every one, a round run to the end)."""

    front: tuple[Waiting, ...]
    rest: tuple[Waiting, ...]
    total: int
    quota: int | None


@dataclass(frozen=True, slots=True)
class Carry:
    """What a peer does with its cut groups (`PeerPolicy.carry`): those that wait for a later step, and how many
    prompts it dropped."""

    waiting: tuple[Waiting, ...]
    dropped: int = 0


def _peer_class(obj: object) -> str | None:
    return None if isinstance(obj, type) and issubclass(obj, PeerPolicy) else "not a subclass of PeerPolicy"


def _named(name: str, cls: type[PeerPolicy]) -> None:
    cls.name = name


# the peers (`tailsieve.registry.Registry`, as `CONTROLLERS`; plugins: `pkg.module:Class`, group tailsieve.peers)
PEERS: Registry[type[PeerPolicy]] = Registry("peer policy", "tailsieve.peers", check=_peer_class, on_add=_named)


def register_peer(name: str):  # type: ignore[no-untyped-def]
    """Class decorator adding a peer to `PEERS` (`simulate --policy NAME`; a name taken by another class is
    refused)."""
    return PEERS.register(name)


def make_peer(name: str, router: RouterConfig, peer: PeerConfig | None = None, prompts: Sequence[str] = (), *,
              shuffle: bool = False, seed: int = 0) -> PeerPolicy:
    """The peer `name` (registry `PEERS`) for one prompt list; the registry's one-line unknown-name error
    otherwise."""
    return PEERS.resolve(name)(router, peer, prompts, shuffle=shuffle, seed=seed)


class PeerPolicy:
    """Plans one peer's steps for one prompt list; holds no mutable state (policy decides, the executor acts).
    Subclasses override the hooks `lineup`, `carry`, `long_round` and the class attribute `dispatch`."""

    name: ClassVar[str] = ""
    dispatch: ClassVar[Dispatch | None] = None  # round-robin unit; None = the router's `dispatch`
    resumes: ClassVar[bool] = False  # its plans may resume cut groups from their tokens (`StepPlan.resume`)

    def __init__(self, router: RouterConfig, peer: PeerConfig | None = None, prompts: Sequence[str] = (), *,
                 shuffle: bool = False, seed: int = 0) -> None:
        self.router = router
        self.peer = peer or PeerConfig()
        self.prompts = tuple(prompts)
        self._stream0 = PromptStream(self.prompts, shuffle=shuffle, seed=seed).state()

    def initial_state(self) -> PeerState:
        """State before the first step."""
        return PeerState(stream=self._stream0)

    # -- hooks ------------------------------------------------------------------------------------------------
    def long_round(self, state: PeerState) -> bool:
        """Whether this step is a long round (a note in the step record; RollPacker)."""
        return False

    def lineup(self, state: PeerState) -> Lineup:
        """Default: N fresh groups, nothing cut; waiting groups (none, unless a subclass cuts) keep waiting."""
        return Lineup((), state.waiting, self.router.groups, self.router.groups)

    def carry(self, cut: Sequence[GroupOutcome], first: Mapping[int, int], step: int) -> Carry:
        """Default: every cut group waits and is regenerated from scratch (`first`: uid → step first dispatched)."""
        return Carry(tuple(Waiting(recut(o.ref), first.get(o.ref.uid, step)) for o in cut))

    # -- the contract (written once) ----------------------------------------------------------------------------
    def plan(self, state: PeerState) -> StepPlan:
        """The next step: which groups run (the lineup's front, then fresh prompts), where, and how many are kept."""
        g, r = self.router.group_size, self.router.replicas
        line = self.lineup(state)
        stream = PromptStream.from_state(self.prompts, state.stream or self._stream0)
        fresh = [GroupRef(p.index, p.prompt_id) for p in stream.take(max(line.total - len(line.front), 0))]
        groups = (*(w.ref for w in line.front), *fresh)
        reps = tuple(range(r))
        resume = {w.ref.uid: w.prefix for w in line.front if w.prefix}
        quota = len(groups) if line.quota is None else line.quota
        return StepPlan(state.step, (), groups, round_robin(groups, reps, g, self.dispatch or self.router.dispatch),
                        (), reps, quota, False, stream.state(), tuple(w.ref for w in line.rest), frozenset(), resume)

    def observe(self, state: PeerState, plan: StepPlan, result: StepResult) -> tuple[PeerState, PeerStep]:
        """Check the step, let the peer carry its cut groups, and account every token (see the module docstring)."""
        done, cut = _checked(plan, result, self.router.group_size)
        waited = {w.ref.uid: w for w in state.waiting}
        for uid, prefix in plan.resume.items():
            if uid not in waited or waited[uid].prefix != tuple(prefix):
                raise InvariantError(f"{self.name} step {plan.step}: group {uid} resumes a prefix that is not the one "
                                     "it waits with")
        first = {uid: w.first_step for uid, w in waited.items()}
        carry = self.carry(cut, first, plan.step)
        _check_carried(self.name, plan.step, cut, carry)
        queued = {ref.uid for ref in plan.requeue_after}
        kept = tuple(w for w in state.waiting if w.ref.uid in queued)
        new = PeerState(plan.step + 1, plan.stream_after, _dedupe((*kept, *carry.waiting)),
                        state.consumed + len(done), state.dropped + carry.dropped)
        if new.consumed + new.dropped + len(new.waiting) != plan.stream_after.position:
            raise InvariantError(f"step {plan.step}: consumed + dropped + waiting != prompts drawn")
        wasted = (state.prefix_tokens + sum(o.tokens for o in cut) - sum(sum(p) for p in plan.resume.values())
                  - new.prefix_tokens)
        delays = tuple(plan.step - first.get(o.ref.uid, plan.step) for o in done)
        offpolicy = tuple(sum(plan.resume.get(o.ref.uid, ())) for o in done)
        return new, PeerStep(done, delays, offpolicy, carry.dropped, wasted, self.long_round(state))


def recut(ref: GroupRef) -> GroupRef:
    """A cut group's reference for its next attempt (one more cut)."""
    return replace(ref, cuts=ref.cuts + 1)


def _checked(plan: StepPlan, result: StepResult, g: int) -> tuple[tuple[GroupOutcome, ...], list[GroupOutcome]]:
    """The step contract: one outcome per planned group, exactly the quota complete with all G members; (done, cut)."""
    seen = [o.ref.uid for o in result.outcomes]
    if sorted(seen) != sorted(ref.uid for ref in plan.bulk) or len(set(seen)) != len(seen):
        raise InvariantError(f"step {plan.step}: outcomes do not match the plan (lost or duplicated groups)")
    done = tuple(o for o in result.outcomes if o.status is GroupStatus.DONE)
    if len(done) != plan.bulk_quota or any(o.finished_members != g for o in done):
        raise InvariantError(f"step {plan.step}: {len(done)} complete groups, expected {plan.bulk_quota}")
    return done, [o for o in result.outcomes if o.status is GroupStatus.ABORTED]


def _check_carried(name: str, step: int, cut: Sequence[GroupOutcome], carry: Carry) -> None:
    """Only cut groups are carried, each once, with no prefix or exactly the tokens it had at the cut; a cut group
    neither carried nor dropped is lost."""
    at_cut = {o.ref.uid: o.lengths for o in cut}
    for w in carry.waiting:
        if w.ref.uid not in at_cut or w.prefix not in ((), at_cut[w.ref.uid]):
            raise InvariantError(f"{name} step {step}: group {w.ref.uid} is carried with tokens it did not have "
                                 "at the cut")
    if len(carry.waiting) + carry.dropped != len(cut):
        raise InvariantError(f"{name} step {step}: {len(cut)} groups cut, {len(carry.waiting)} carried and "
                             f"{carry.dropped} dropped")


def _dedupe(waiting: tuple[Waiting, ...]) -> tuple[Waiting, ...]:
    """Waiting prompts in order, each uid once (InvariantError on a duplicate: a prompt would be consumed twice)."""
    uids = [w.ref.uid for w in waiting]
    if len(uids) != len(set(uids)):
        raise InvariantError("a waiting prompt is listed twice")
    return waiting
