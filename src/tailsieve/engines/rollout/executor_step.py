"""The bookkeeping of one `EngineExecutor.execute` call (`engines/rollout/engine_executor.py`): a request in flight
(`Job`: its group, members, replica, attempt, weight version and resumed prefix) and the step's mutable state
(`RunningStep`: samples, progress and partial text per member, load per replica, the cutoff rule's progress)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from tailsieve.engines.rollout.executor_types import GroupSpec, Sample
from tailsieve.engines.transport.engine_client import Completion
from tailsieve.engines.transport.types import Progress
from tailsieve.policy.step import Cutoff, GroupOutcome, GroupStatus, Pool, StepPlan

__all__ = ["Job", "RunningStep"]


@dataclass(slots=True)
class Job:
    """One request in flight: its group's members (one in split mode), planned and actual replica, attempt."""

    uid: int
    pool: Pool
    members: tuple[int, ...]
    planned: int
    replica: int = -1
    attempt: int = 0
    progress: list[int] = field(default_factory=list)
    end: float = 0.0
    version: int = 0  # the weight version its replica served when the job was sent
    prefix_text: str = ""  # a resumed member (partial rollout): what it had generated when it was cut
    prefix_tokens: int = 0


class RunningStep:
    """The mutable bookkeeping of one executing step (owned by one `EngineExecutor.execute` call)."""

    def __init__(self, plan: StepPlan, specs: dict[int, GroupSpec], g: int, replicas: int) -> None:
        self.plan = plan
        self.specs = specs
        self.pool_of = {r.uid: Pool.TAIL for r in plan.tail} | {r.uid: Pool.BULK for r in plan.bulk}
        self.pool_reps = {Pool.TAIL: plan.tail_replicas, Pool.BULK: plan.bulk_replicas}
        groups = (*plan.tail, *plan.bulk)
        self.samples: dict[int, list[Sample | None]] = {r.uid: [None] * g for r in groups}
        self.progress: dict[int, list[int]] = {r.uid: [0] * g for r in groups}
        self.texts: dict[int, list[str]] = {r.uid: [""] * g for r in groups}  # partial text (`EngineExecutor.partial`)
        self.origin: dict[int, list[tuple[int, int]]] = {r.uid: [(-1, 0)] * g for r in groups}  # (replica, version)
        self.done_at: dict[int, float] = {}
        self.load = [0] * replicas
        self.pending: dict[asyncio.Task[Completion], Job] = {}
        self.redispatched = 0
        self.rule = Cutoff.of(plan)  # the step contract's cutoff rule
        self.pinned = self.rule.pinned
        self.cut = self.rule.need == 0
        self.pin_left = set(self.pinned)
        self.bulk_done: list[int] = []
        self.bulk_s = 0.0
        self.tail_left = {r.uid for r in plan.tail}
        self.started_at = time.time()
        self.t0 = time.perf_counter()
        self.seen: dict[int, tuple[int, float]] = {}  # replica -> (its jobs' progress, when it last changed)

    def quiet(self, now: float, after_s: float) -> list[int]:
        """Replicas with requests in flight whose progress has not moved for `after_s` seconds."""
        totals: dict[int, int] = {}
        for job in self.pending.values():
            totals[job.replica] = totals.get(job.replica, 0) + sum(job.progress) + 1
        out = []
        for rep, total in totals.items():
            last = self.seen.get(rep)
            if last is None or last[0] != total:
                self.seen[rep] = (total, now)
            elif now - last[1] >= after_s:
                out.append(rep)
        return out

    def snapshot(self, job: Job) -> None:
        """Copy a job's streamed progress into its group's members."""
        for k, j in enumerate(job.members):
            if k < len(job.progress):
                self.progress[job.uid][j] = job.prefix_tokens + job.progress[k]
                self.origin[job.uid][j] = (job.replica, job.version)  # who generated it, under which weights
                if isinstance(job.progress, Progress):
                    self.texts[job.uid][j] = job.prefix_text + "".join(job.progress.texts[k])

    def release(self, task: asyncio.Task[Completion]) -> Job:
        """Forget a task (its replica's load drops by its members)."""
        job = self.pending.pop(task)
        self.load[job.replica] -= len(job.members)
        return job

    def busy(self) -> bool:
        """Work left that the step waits for: tail groups, pinned bulk groups, or the bulk pool before its cutoff."""
        return bool(self.pending) and bool(self.tail_left or self.pin_left or not self.cut)

    def spared(self, job: Job) -> bool:
        """Whether a job runs to completion whatever the cutoff: a tail or a pinned bulk group's."""
        return self.rule.spared(job.uid)

    def complete(self, uid: int, now: float) -> None:
        """Mark a group done once every member has its sample; one complete in the bulk pool may trigger the cutoff
        (the other bulk groups' requests are cancelled, their progress kept)."""
        if uid in self.done_at or any(s is None for s in self.samples[uid]):
            return
        self.done_at[uid] = now
        if self.pool_of[uid] is Pool.TAIL:
            self.tail_left.discard(uid)
        elif uid in self.pinned:
            self.pin_left.discard(uid)
        elif not self.cut:
            self.bulk_done.append(uid)
            if self.rule.bulk_cut(self.bulk_done):
                self.cut, self.bulk_s = True, now
                for other_task, other in self.pending.items():
                    if not self.spared(other):
                        self.snapshot(other)
                        other_task.cancel()

    def outcomes(self, g: int) -> tuple[GroupOutcome, ...]:
        """Every planned group's outcome, plan order: tail, pinned and kept bulk groups DONE, the rest ABORTED."""
        kept = set(self.rule.kept_bulk(self.bulk_done)) | self.pinned
        out: list[GroupOutcome] = []
        for ref in (*self.plan.tail, *self.plan.bulk):
            pool, got = self.pool_of[ref.uid], self.samples[ref.uid]
            if pool is Pool.TAIL or ref.uid in kept:
                lengths = tuple(s.tokens for s in got if s is not None)
                out.append(GroupOutcome(ref, pool, GroupStatus.DONE, self.done_at[ref.uid], lengths, g))
            else:
                lengths = tuple(s.tokens if s is not None else self.progress[ref.uid][j] for j, s in enumerate(got))
                out.append(GroupOutcome(ref, pool, GroupStatus.ABORTED, None, lengths, sum(s is not None for s in got)))
        return tuple(out)
