"""What RL frameworks run today, as pure step planners (issue 16): slime's APRIL, verl's request load balancer,
RollPacker's tail batching and OpenRLHF's group dispatch. They plan `StepPlan`s for the same executors as TailSieve
(every replica bulk: no tail pool) and read the same `StepResult`s; `tailsieve.simulation.runs` drives them.

- `april-partial` (slime, `--over-sampling-batch-size`, `--partial-rollout`): N + E groups start, the step ends when
  N are complete, the rest are aborted and go back to the buffer; next step they run first and *resume from the
  tokens they had* (`StepPlan.resume`; members that had finished stay finished). The resumed prefixes were made by
  an older policy: off-policy tokens.
- `april-drop` (the same without `--partial-rollout`): the aborted groups' prompts are dropped.
- `verl-lif` (verl `GlobalRequestLoadBalancer`): every request to the replica with the fewest in-flight requests
  (sticky per request: a multi-turn request's turns stay on its replica); groups are split, nothing is cut.
- `openrlhf-group`: every group to the engine with the fewest unfinished requests; nothing is cut.
- `rollpacker` (RollPacker tail batching on ROLL): short rounds start N + E fresh groups and keep the first N
  complete; the others are deferred and later regenerated from scratch in a *long round* made only of deferred
  prompts and run to completion (when N of them wait, or every `long_round_period` steps).

In a synchronous step every request is submitted at t = 0, before any finishes, so "fewest in flight" counts only
what was assigned before it: request k goes to replica k mod R (verl-lif), group i to replica i mod R
(openrlhf-group), the router's `round_robin`. What was taken from each source and what was simplified:
docs/peers.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from enum import StrEnum

from tailsieve.errors import ConfigError
from tailsieve.policy.router import Dispatch, RouterConfig, round_robin
from tailsieve.policy.step import GroupOutcome, GroupRef, GroupStatus, InvariantError, StepPlan, StepResult
from tailsieve.policy.stream import PromptStream, StreamState


class Peer(StrEnum):
    """The peer policies (`simulate --policy NAME`)."""

    APRIL_PARTIAL = "april-partial"
    APRIL_DROP = "april-drop"
    VERL_LIF = "verl-lif"
    ROLLPACKER = "rollpacker"
    OPENRLHF_GROUP = "openrlhf-group"


PEERS: tuple[str, ...] = tuple(p.value for p in Peer)
_OVERSAMPLED = (Peer.APRIL_PARTIAL, Peer.APRIL_DROP, Peer.ROLLPACKER)


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


@dataclass(frozen=True, slots=True)
class PeerStep:
    """One observed step: the consumed groups (plan order) with their delays (steps since first dispatched) and
    off-policy tokens (their resumed prefixes), prompts dropped, tokens thrown away, and whether it was a long round."""

    consumed: tuple[GroupOutcome, ...]
    delays: tuple[int, ...]
    offpolicy: tuple[int, ...]
    dropped: int
    wasted_tokens: int
    long_round: bool


class PeerPolicy:
    """Plans one peer's steps for one prompt list; holds no mutable state (policy decides, the executor acts)."""

    def __init__(self, name: str, router: RouterConfig, peer: PeerConfig | None = None, prompts: tuple[str, ...] = (),
                 *, shuffle: bool = False, seed: int = 0) -> None:
        if name not in PEERS:
            raise ConfigError(f"unknown peer policy '{name}' (valid: {', '.join(PEERS)})")
        self.kind = Peer(name)
        self.router = router
        self.peer = peer or PeerConfig()
        self.prompts = tuple(prompts)
        self._stream0 = PromptStream(self.prompts, shuffle=shuffle, seed=seed).state()

    def initial_state(self) -> PeerState:
        """State before the first step."""
        return PeerState(stream=self._stream0)

    def long_round(self, state: PeerState) -> bool:
        """RollPacker: whether this step is a long round (only deferred prompts, run to completion)."""
        if self.kind is not Peer.ROLLPACKER or not state.waiting:
            return False
        period = self.peer.long_round_period
        if period is None:
            return len(state.waiting) >= self.router.groups
        return (state.step + 1) % period == 0

    def plan(self, state: PeerState) -> StepPlan:
        """The next step: which groups run (waiting first, then fresh prompts), where, and how many are kept."""
        n, g, r = self.router.groups, self.router.group_size, self.router.replicas
        long = self.long_round(state)
        if long:
            front, rest = state.waiting[:n], state.waiting[n:]
            total = quota = n
        elif self.kind in _OVERSAMPLED:
            # april: the buffer first (slime pops it before new prompts); rollpacker: deferred wait for a long round
            keep = self.kind is Peer.ROLLPACKER
            front, rest = ((), state.waiting) if keep else (state.waiting, ())
            total, quota = n + self.peer.extra(self.router), n
        else:
            front, rest, total, quota = (), state.waiting, n, n
        stream = PromptStream.from_state(self.prompts, state.stream or self._stream0)
        fresh = [GroupRef(p.index, p.prompt_id) for p in stream.take(max(total - len(front), 0))]
        groups = (*(w.ref for w in front), *fresh)
        unit = {Peer.VERL_LIF: Dispatch.REQUEST, Peer.OPENRLHF_GROUP: Dispatch.GROUP}.get(self.kind,
                                                                                          self.router.dispatch)
        reps = tuple(range(r))
        resume = {w.ref.uid: w.prefix for w in front if w.prefix}
        quota = len(groups) if long else quota  # a long round (topped up with fresh prompts if short) runs to the end
        return StepPlan(state.step, (), groups, round_robin(groups, reps, g, unit), (), reps, quota, False,
                        stream.state(), tuple(w.ref for w in rest), frozenset(), resume)

    def observe(self, state: PeerState, plan: StepPlan, result: StepResult) -> tuple[PeerState, PeerStep]:
        """Check the step (one outcome per planned group, exactly the quota complete) and carry the rest."""
        seen = [o.ref.uid for o in result.outcomes]
        if sorted(seen) != sorted(ref.uid for ref in plan.bulk) or len(set(seen)) != len(seen):
            raise InvariantError(f"step {plan.step}: outcomes do not match the plan (lost or duplicated groups)")
        done = tuple(o for o in result.outcomes if o.status is GroupStatus.DONE)
        cut = [o for o in result.outcomes if o.status is GroupStatus.ABORTED]
        if len(done) != plan.bulk_quota or any(o.finished_members != self.router.group_size for o in done):
            raise InvariantError(f"step {plan.step}: {len(done)} complete groups, expected {plan.bulk_quota}")
        first = {w.ref.uid: w.first_step for w in state.waiting}
        delays = tuple(plan.step - first.get(o.ref.uid, plan.step) for o in done)
        offpolicy = tuple(sum(plan.resume.get(o.ref.uid, ())) for o in done)
        partial = self.kind is Peer.APRIL_PARTIAL
        dropped = len(cut) if self.kind is Peer.APRIL_DROP else 0
        carried = () if dropped else tuple(
            Waiting(replace(o.ref, cuts=o.ref.cuts + 1), first.get(o.ref.uid, plan.step), o.lengths if partial else ())
            for o in cut)
        queued = {ref.uid for ref in plan.requeue_after}
        waiting = (*(w for w in state.waiting if w.ref.uid in queued), *carried)
        new = PeerState(plan.step + 1, plan.stream_after, _dedupe(waiting), state.consumed + len(done),
                        state.dropped + dropped)
        if new.consumed + new.dropped + len(new.waiting) != plan.stream_after.position:
            raise InvariantError(f"step {plan.step}: consumed + dropped + waiting != prompts drawn")
        wasted = 0 if partial else sum(o.tokens for o in cut)
        return new, PeerStep(done, delays, offpolicy, dropped, wasted, self.long_round(state))


def _dedupe(waiting: tuple[Waiting, ...]) -> tuple[Waiting, ...]:
    """Waiting prompts in order, each uid once (InvariantError on a duplicate: a prompt would be consumed twice)."""
    uids = [w.ref.uid for w in waiting]
    if len(uids) != len(set(uids)):
        raise InvariantError("a waiting prompt is listed twice")
    return waiting
