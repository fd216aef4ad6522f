"""The step contract (§3.1) shared by the router, the controller's observations and every executor: group
references, the plan of one step, each group's outcome and the step's result. Frozen values only."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import KW_ONLY, dataclass, field
from enum import StrEnum

from tailsieve.errors import TailSieveError
from tailsieve.policy.stream import StreamState


class Pool(StrEnum):
    """Which logical pool a group runs in."""

    TAIL = "tail"
    BULK = "bulk"


class GroupStatus(StrEnum):
    """Outcome of one group in one step."""

    DONE = "done"
    ABORTED = "aborted"


@dataclass(frozen=True, slots=True)
class GroupRef:
    """A routing unit: one prompt group, identified by its position `uid` in the prompt stream."""

    uid: int
    prompt_id: str
    cuts: int = 0  # times this group was cut (aborted) at a cutoff so far


@dataclass(frozen=True, slots=True)
class StepPlan:
    """What one step runs: groups per pool with the replica of every request, the bulk cutoff quota and the pinned
    bulk groups (never cut: the non-pinned ones are cut at their (quota − pinned)-th completion)."""

    step: int
    tail: tuple[GroupRef, ...]
    bulk: tuple[GroupRef, ...]
    placement: dict[int, tuple[int, ...]]  # uid → replica of each of its G requests
    tail_replicas: tuple[int, ...]
    bulk_replicas: tuple[int, ...]
    bulk_quota: int  # the bulk pool is cut once this many of its groups are complete
    warmup: bool
    stream_after: StreamState
    requeue_after: tuple[GroupRef, ...]  # waiting at the front of the queue after this step's draws
    pinned: frozenset[int] = frozenset()  # uids of bulk groups that run to completion (cut max_redraws times)
    # uid → tokens each member already generated when the group was cut last step: the executor continues that same
    # generation from its prefix (partial rollout, e.g. slime's APRIL) instead of drawing a new one. TailSieve never
    # resumes (empty); only the peer policies of `tailsieve.policy.peers` do.
    resume: Mapping[int, tuple[int, ...]] = field(default_factory=dict)

    @property
    def q(self) -> int:
        """Isolated groups this step."""
        return len(self.tail)

    @property
    def m(self) -> int:
        """Tail replicas this step."""
        return len(self.tail_replicas)


@dataclass(frozen=True, slots=True)
class Cutoff:
    """The one cutoff rule of a step (every executor and the verl session apply it; none writes its own): every tail
    group and every pinned bulk group runs to completion (`spared`); the other bulk groups are cut once `need`
    (= bulk quota − pinned, at least 0) of them are complete, and those first `need` are kept."""

    tail: frozenset[int]
    pinned: frozenset[int]  # the plan's pinned groups that are in its bulk pool
    need: int

    @classmethod
    def of(cls, plan: StepPlan) -> Cutoff:
        """The rule of `plan`."""
        pinned = plan.pinned & {ref.uid for ref in plan.bulk}
        return cls(frozenset(ref.uid for ref in plan.tail), pinned, max(plan.bulk_quota - len(pinned), 0))

    def spared(self, uid: int) -> bool:
        """Whether group `uid` runs to completion whatever the cutoff (a tail or a pinned bulk group)."""
        return uid in self.tail or uid in self.pinned

    def kept_bulk(self, completed: Iterable[int]) -> tuple[int, ...]:
        """The non-pinned bulk groups kept, given groups in completion order (ties already broken): the first `need`
        of them that are not spared."""
        free = [uid for uid in completed if not self.spared(uid)]
        return tuple(free[:self.need])

    def bulk_cut(self, completed: Collection[int]) -> bool:
        """Whether the bulk pool's free groups are cut once `completed` are complete: `need` of them are (the
        spared groups run on)."""
        return sum(not self.spared(uid) for uid in set(completed)) >= self.need

    def ready(self, completed: Collection[int]) -> bool:
        """Whether the whole step is done once `completed` are complete: every spared group and the bulk cut."""
        return (self.tail | self.pinned) <= set(completed) and self.bulk_cut(completed)


@dataclass(frozen=True, slots=True)
class GroupOutcome:
    """One group's result: completion time if done, else the progress it had at the cutoff."""

    ref: GroupRef
    pool: Pool
    status: GroupStatus
    finish_s: float | None
    lengths: tuple[int, ...]  # tokens per request: full lengths when done, generated so far when aborted
    finished_members: int

    @property
    def tokens(self) -> int:
        """Tokens this group generated in the step."""
        return sum(self.lengths)


@dataclass(frozen=True, slots=True)
class StepResult:
    """What an executor reports: every planned group's outcome, T_tail, T_bulk (cutoff) and the makespan."""

    step: int
    outcomes: tuple[GroupOutcome, ...]
    tail_s: float
    bulk_s: float
    makespan_s: float
    # what the engines did beyond decoding (the simulator's paged replicas; 0 where not measured); keyword-only,
    # so that a subclass (`ExecutedStep`) adds its own fields after them
    _: KW_ONLY
    preemptions: int = 0
    recomputed_tokens: int = 0
    prefix_hit_tokens: int = 0


class InvariantError(TailSieveError, RuntimeError):
    """An executor broke the step contract (a group lost, duplicated, or the batch not N complete groups): a
    one-line `TailSieveError` (a custom executor or a restored state can cause it), still a `RuntimeError`."""
