"""`EngineExecutor`: runs a `StepPlan` on real replicas and reports the same `StepResult` as `SimExecutor`.

Every planned group's requests go to the replicas the plan names (one request per member, or one per group and
replica with `n` = its members there). The tail pool runs to completion; the bulk pool is cut when `bulk_quota`
of its groups are complete: the rest are cancelled (the connection closes, which aborts them on the server) and
report the tokens streamed so far. A replica fault marks the replica down and re-dispatches its unfinished
requests to a healthy replica (same pool first) after a backoff; nothing is lost or repeated.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

from tailsieve.engines.client import (
    Completion,
    EngineClient,
    EngineError,
    NoHealthyReplica,
    ReplicaFault,
    Request,
    SamplingParams,
)
from tailsieve.engines.health import Replicas
from tailsieve.policy.step import GroupOutcome, GroupRef, GroupStatus, Pool, StepPlan, StepResult


class RequestMode(StrEnum):
    """How a group's members become HTTP requests."""

    SPLIT = "split"  # one request per member (per-member seed and max_tokens)
    N = "n"  # one request per (group, replica, max_tokens) with n = members there


@dataclass(frozen=True, slots=True)
class GroupSpec:
    """What to send for one group: the prompt, and per member its seed and max_tokens (None: the default)."""

    prompt: str | tuple[tuple[str, str], ...]
    seeds: tuple[int | None, ...]
    max_tokens: tuple[int | None, ...]


@dataclass(frozen=True, slots=True)
class Sample:
    """One finished member: text, token ids (when the server returns them), tokens, finish reason, where/when."""

    text: str
    tokens: int
    finish_reason: str | None
    token_ids: tuple[int, ...] | None
    replica: int
    finish_s: float  # since the step started
    attempts: int  # 1 = first try


@dataclass(slots=True)
class _Job:
    uid: int
    pool: Pool
    members: tuple[int, ...]
    planned: int
    replica: int = -1
    attempt: int = 0
    progress: list[int] = field(default_factory=list)
    end: float = 0.0


@dataclass(frozen=True, slots=True)
class ExecutedStep:
    """A step's `StepResult` plus every member's sample (None where unfinished) and fault counts."""

    result: StepResult
    samples: dict[int, tuple[Sample | None, ...]]
    redispatched: int
    started_at: float  # wall clock (time.time()) at dispatch


class EngineExecutor:
    """Executes plans against `Replicas`; `spec(ref)` supplies each group's prompt, seeds and max_tokens."""

    def __init__(self, replicas: Replicas, model: str, params: SamplingParams, group_size: int,
                 mode: RequestMode = RequestMode.SPLIT) -> None:
        self.replicas = replicas
        self.client: EngineClient = replicas.client
        self.model = model
        self.params = params
        self.g = group_size
        self.mode = mode

    def _jobs(self, ref: GroupRef, pool: Pool, placement: tuple[int, ...], spec: GroupSpec) -> list[_Job]:
        if self.mode is RequestMode.SPLIT:
            return [_Job(ref.uid, pool, (j,), rep) for j, rep in enumerate(placement)]
        by_key: dict[tuple[int, int | None], list[int]] = {}
        for j, rep in enumerate(placement):
            by_key.setdefault((rep, spec.max_tokens[j]), []).append(j)
        return [_Job(ref.uid, pool, tuple(ms), rep) for (rep, _), ms in by_key.items()]

    def _request(self, job: _Job, spec: GroupSpec, step: int) -> Request:
        j0 = job.members[0]
        rid = f"ts-{step}-{job.uid}-{j0}-{job.attempt}"
        return Request(rid, spec.prompt, n=len(job.members), seed=spec.seeds[j0], max_tokens=spec.max_tokens[j0])

    async def _run(self, job: _Job, req: Request) -> Completion:
        await asyncio.sleep(self.replicas.policy.backoff(job.attempt))
        job.progress = [0] * len(job.members)
        try:
            return await self.client.complete(self.replicas.endpoints[job.replica], self.model, req, self.params,
                                              job.progress)
        finally:
            job.end = time.perf_counter()

    async def execute(self, plan: StepPlan, spec: Callable[[GroupRef], GroupSpec]) -> ExecutedStep:
        """Run one step (see the module docstring); raises `EngineError` when no replica can take the work."""
        g = self.g
        groups = (*plan.tail, *plan.bulk)
        pool_of = {r.uid: Pool.TAIL for r in plan.tail} | {r.uid: Pool.BULK for r in plan.bulk}
        pool_reps = {Pool.TAIL: plan.tail_replicas, Pool.BULK: plan.bulk_replicas}
        specs = {r.uid: spec(r) for r in groups}
        samples: dict[int, list[Sample | None]] = {r.uid: [None] * g for r in groups}
        progress: dict[int, list[int]] = {r.uid: [0] * g for r in groups}
        done_at: dict[int, float] = {}
        load = [0] * len(self.replicas)
        pending: dict[asyncio.Task[Completion], _Job] = {}
        redispatched = 0
        started_at = time.time()
        t0 = time.perf_counter()

        async def launch(job: _Job) -> None:
            target = self.replicas.pick(job.planned, pool_reps[job.pool], load)
            if target is None and await self.replicas.wait_any(self.replicas.policy.no_healthy_wait_s):
                target = self.replicas.pick(job.planned, pool_reps[job.pool], load)
            if target is None:
                raise NoHealthyReplica(f"no healthy replica among {len(self.replicas)} "
                                       f"({', '.join(e.url for e in self.replicas.endpoints)})")
            job.replica = target
            load[target] += len(job.members)
            task = asyncio.get_running_loop().create_task(self._run(job, self._request(job, specs[job.uid], plan.step)))
            pending[task] = job

        def snapshot(job: _Job) -> None:
            for k, j in enumerate(job.members):
                if k < len(job.progress):
                    progress[job.uid][j] = job.progress[k]

        cut = plan.bulk_quota <= 0
        bulk_done: list[int] = []
        bulk_s = 0.0
        tail_left = {r.uid for r in plan.tail}
        try:
            for ref in groups:
                if pool_of[ref.uid] is Pool.BULK and cut:
                    continue
                for job in self._jobs(ref, pool_of[ref.uid], plan.placement[ref.uid], specs[ref.uid]):
                    await launch(job)
            while pending and (tail_left or not cut):
                finished, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in sorted(finished, key=lambda t: pending[t].end):
                    job = pending.pop(task)
                    load[job.replica] -= len(job.members)
                    if task.cancelled():
                        continue
                    exc = task.exception()
                    if isinstance(exc, ReplicaFault):
                        snapshot(job)
                        self.replicas.mark_down(job.replica, exc.kind, str(exc))
                        moved = [job]
                        for other_task, other in list(pending.items()):
                            if other.replica == job.replica and not other_task.done():
                                other_task.cancel()
                                snapshot(other)
                                pending.pop(other_task)
                                load[other.replica] -= len(other.members)
                                moved.append(other)
                        for m in moved:
                            if m.pool is Pool.BULK and cut:
                                continue
                            if m.attempt >= self.replicas.policy.retries:
                                raise EngineError(f"prompt group {m.uid} failed {m.attempt + 1} times; last: {exc}")
                            redispatched += 1
                            await launch(_Job(m.uid, m.pool, m.members, m.planned, attempt=m.attempt + 1))
                        continue
                    if exc is not None:
                        raise exc
                    now = job.end - t0
                    comp = task.result()
                    for k, j in enumerate(job.members):
                        ch = comp.choices[k] if k < len(comp.choices) else None
                        if ch is None:
                            raise EngineError(f"{self.replicas.endpoints[job.replica].url}: {len(comp.choices)} "
                                              f"choices returned, {len(job.members)} requested")
                        samples[job.uid][j] = Sample(ch.text, ch.tokens, ch.finish_reason, ch.token_ids, job.replica,
                                                     now, job.attempt + 1)
                        progress[job.uid][j] = ch.tokens
                    if job.uid in done_at or any(s is None for s in samples[job.uid]):
                        continue
                    done_at[job.uid] = now
                    if job.pool is Pool.TAIL:
                        tail_left.discard(job.uid)
                    elif not cut:
                        bulk_done.append(job.uid)
                        if len(bulk_done) >= plan.bulk_quota:
                            cut, bulk_s = True, now
                            for other_task, other in pending.items():
                                if other.pool is Pool.BULK:
                                    snapshot(other)
                                    other_task.cancel()
        finally:
            for task, job in pending.items():
                snapshot(job)
                task.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
        tail_s = max((done_at[r.uid] for r in plan.tail), default=0.0)
        kept = set(bulk_done)
        outcomes: list[GroupOutcome] = []
        for ref in groups:
            pool = pool_of[ref.uid]
            got = samples[ref.uid]
            if pool is Pool.TAIL or ref.uid in kept:
                lengths = tuple(s.tokens for s in got if s is not None)
                outcomes.append(GroupOutcome(ref, pool, GroupStatus.DONE, done_at[ref.uid], lengths, g))
            else:
                lengths = tuple(s.tokens if s is not None else progress[ref.uid][j] for j, s in enumerate(got))
                fin = sum(s is not None for s in got)
                outcomes.append(GroupOutcome(ref, pool, GroupStatus.ABORTED, None, lengths, fin))
        result = StepResult(plan.step, tuple(outcomes), tail_s, bulk_s, max(tail_s, bulk_s))
        return ExecutedStep(result, {u: tuple(s) for u, s in samples.items()}, redispatched, started_at)
