"""`EngineExecutor`: runs a `StepPlan` on real replicas and reports the same `StepResult` as `SimExecutor`.

It is an `AsyncExecutor` of the step loop (`tailsieve.loop`): `await executor.execute(plan)` returns an
`ExecutedStep`, a `StepResult` that also carries every member's sample. What to send for each group (prompt,
per-member seeds and max_tokens) comes from the `spec` function given at construction.

Every planned group's requests go to the replicas the plan names (one request per member, or one per group and
replica with `n` = its members there). The tail pool runs to completion; the bulk pool is cut when `bulk_quota`
of its groups are complete: the rest are cancelled (the connection closes, which aborts them on the server) and
report the tokens streamed so far. Pinned bulk groups (`StepPlan.pinned`) are never cancelled: the others are cut
at their (quota − pinned)-th completion, and T_bulk is the last kept bulk group's finish. A replica fault marks
the replica down and re-dispatches its unfinished requests to a healthy replica (same pool first) after a
backoff; nothing is lost or repeated. A replica whose in-flight requests made no progress for
`FaultPolicy.liveness_s` (at most half the stall timeout) is asked for its /health; one that does not answer (a
server shutting down after SIGTERM keeps its streams open but stops serving /health) is a fault at once
(`disconnect`), without waiting out the stall timeout.

Partial rollout (`StepPlan.resume`, april-partial): with `partial` on, the executor keeps what every cut request had
generated (its streamed text and token count); a later plan that resumes such a group keeps the members that had
finished and sends each other member its prompt followed by its text so far, with max_tokens reduced by its tokens
so far (completions API, one request per member). Any other resumed plan is refused with `PlanNotRunnable` before
anything is sent. A resumed sample's text and tokens include its prefix; its token ids and logprobs are None (the
prefix's are not kept).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

from tailsieve.engines.rollout.executor_types import (
    Carried,
    ExecutedStep,
    GroupSpec,
    GroupSpecFn,
    PlanNotRunnable,
    RequestMode,
    Sample,
)
from tailsieve.engines.rollout.weight_sync import disagrees
from tailsieve.engines.transport.engine_client import (
    Completion,
    EngineClient,
    EngineError,
    FaultKind,
    NoHealthyReplica,
    ReplicaFault,
    Request,
    SamplingParams,
)
from tailsieve.engines.transport.health import Replicas
from tailsieve.engines.transport.types import Progress
from tailsieve.inputs import excerpt
from tailsieve.policy.step import Cutoff, GroupOutcome, GroupRef, GroupStatus, Pool, StepPlan

# the executor's values live in executor_types.py; importing them from here keeps working
__all__ = ["Carried", "EngineExecutor", "ExecutedStep", "GroupSpec", "GroupSpecFn", "PlanNotRunnable", "RequestMode",
           "Sample"]


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
    version: int = 0  # the weight version its replica served when the job was sent
    prefix_text: str = ""  # a resumed member (partial rollout): what it had generated when it was cut
    prefix_tokens: int = 0


class _Step:
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
        self.done_at: dict[int, float] = {}
        self.load = [0] * replicas
        self.pending: dict[asyncio.Task[Completion], _Job] = {}
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

    def snapshot(self, job: _Job) -> None:
        """Copy a job's streamed progress into its group's members."""
        for k, j in enumerate(job.members):
            if k < len(job.progress):
                self.progress[job.uid][j] = job.prefix_tokens + job.progress[k]
                if isinstance(job.progress, Progress):
                    self.texts[job.uid][j] = job.prefix_text + "".join(job.progress.texts[k])

    def release(self, task: asyncio.Task[Completion]) -> _Job:
        """Forget a task (its replica's load drops by its members)."""
        job = self.pending.pop(task)
        self.load[job.replica] -= len(job.members)
        return job

    def busy(self) -> bool:
        """Work left that the step waits for: tail groups, pinned bulk groups, or the bulk pool before its cutoff."""
        return bool(self.pending) and bool(self.tail_left or self.pin_left or not self.cut)

    def spared(self, job: _Job) -> bool:
        """Whether a job runs to completion whatever the cutoff: a tail or a pinned bulk group's."""
        return self.rule.spared(job.uid)

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


class EngineExecutor:
    """Executes plans against `Replicas`; `spec(ref, plan)` supplies each group's prompt, seeds and max_tokens."""

    def __init__(self, replicas: Replicas, model: str, params: SamplingParams, group_size: int,
                 mode: RequestMode = RequestMode.SPLIT, *, spec: GroupSpecFn | None = None) -> None:
        self.replicas = replicas
        self.client: EngineClient = replicas.client
        self.model = model
        self.params = params
        self.g = group_size
        self.mode = mode
        self.spec = spec
        self.weight_version = 0  # stamped on every sample sent from now on (`Rollout.update_weights` raises it)
        # True (a `Rollout`, whose versions are the servers'): a replica whose samples carry another version than
        # they were sent under is made stale and its work moves; False: `weight_version` is a label (slime's id)
        self.exclude_other_versions = False
        self.partial = False  # keep what cut requests generated, so that a plan may resume them (`StepPlan.resume`)
        self._carried: dict[int, tuple[Carried, ...]] = {}  # last step's cut groups, per member

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
        if not job.prefix_tokens:
            return Request(rid, spec.prompt, n=len(job.members), seed=spec.seeds[j0], max_tokens=spec.max_tokens[j0])
        cap = spec.max_tokens[j0] or self.params.max_tokens  # a resumed member decodes only the rest of its budget
        return Request(rid, f"{spec.prompt}{job.prefix_text}", n=1, seed=spec.seeds[j0],
                       max_tokens=max(cap - job.prefix_tokens, 1))

    async def _run(self, job: _Job, req: Request) -> Completion:
        wait = self.replicas.policy.backoff(job.attempt)
        if wait > 0:  # a first attempt goes out at once (no extra turn of the event loop)
            await asyncio.sleep(wait)
        job.progress = Progress(len(job.members)) if self.partial else [0] * len(job.members)
        try:
            return await self.client.complete(self.replicas.endpoints[job.replica], self.model, req, self.params,
                                              job.progress)
        finally:
            job.end = time.perf_counter()

    async def execute(self, plan: StepPlan, spec: Callable[[GroupRef], GroupSpec] | None = None) -> ExecutedStep:
        """Run one step (see the module docstring); raises `EngineError` when no replica can take the work.
        `spec` overrides the constructor's spec function for this call (0.1 API: `execute(plan, spec)`)."""
        if spec is None and self.spec is None:
            raise EngineError("EngineExecutor needs a spec function (constructor `spec=` or `execute(plan, spec)`)")
        fn = spec if spec is not None else (lambda ref: cast(GroupSpecFn, self.spec)(ref, plan))
        st = _Step(plan, {r.uid: fn(r) for r in (*plan.tail, *plan.bulk)}, self.g, len(self.replicas))
        self._check_resume(st)
        try:
            for ref in (*plan.tail, *plan.bulk):
                if st.pool_of[ref.uid] is Pool.TAIL or ref.uid in st.pinned or not st.cut:
                    jobs = (self._resumed(st, ref) if ref.uid in plan.resume else
                            self._jobs(ref, st.pool_of[ref.uid], plan.placement[ref.uid], st.specs[ref.uid]))
                    for job in jobs:
                        await self._launch(st, job)
            await self._wait_all(st)
        finally:
            for task, job in st.pending.items():
                st.snapshot(job)
                task.cancel()
            if st.pending:
                await asyncio.gather(*st.pending, return_exceptions=True)
        tail_s = max((st.done_at[r.uid] for r in plan.tail), default=0.0)
        bulk_s = max([st.bulk_s, *(st.done_at[u] for u in st.pinned)])
        outcomes = st.outcomes(self.g)
        self._carried = {o.ref.uid: tuple(Carried(st.texts[o.ref.uid][j], n, st.samples[o.ref.uid][j])
                                          for j, n in enumerate(o.lengths))
                         for o in outcomes if o.status is GroupStatus.ABORTED} if self.partial else {}
        return ExecutedStep(plan.step, outcomes, tail_s, bulk_s, max(tail_s, bulk_s),
                            {u: tuple(s) for u, s in st.samples.items()}, st.redispatched, st.started_at)

    def _check_resume(self, st: _Step) -> None:
        """PlanNotRunnable (before anything is sent) unless every resumed group is one this executor cut last step,
        with exactly the tokens the plan names, and its requests can carry a text prefix."""
        plan = st.plan
        if not plan.resume:
            return
        why = ("the executor does not keep cut requests' output (EngineExecutor.partial)" if not self.partial else
               "one request per group and replica (--request-mode n) cannot resume members one by one"
               if self.mode is RequestMode.N else None)
        for uid, prefix in plan.resume.items():
            if why is not None:
                break
            had = self._carried.get(uid)
            if had is None or tuple(c.tokens for c in had) != tuple(prefix):
                why = f"group {uid} was not cut last step with the tokens the plan resumes"
            elif not isinstance(st.specs[uid].prompt, str):
                why = f"group {uid} has a chat prompt (only a text prompt can be continued)"
        if why is not None:
            raise PlanNotRunnable(f"step {plan.step}: the plan resumes {len(plan.resume)} cut group(s) from their "
                                  f"tokens, which this executor cannot run ({why}); nothing was sent")

    def _resumed(self, st: _Step, ref: GroupRef) -> list[_Job]:
        """A resumed group: members that had finished keep their samples; the others continue from their text."""
        jobs = []
        for j, (c, rep) in enumerate(zip(self._carried[ref.uid], st.plan.placement[ref.uid], strict=True)):
            if c.sample is not None:
                st.samples[ref.uid][j] = c.sample
                st.progress[ref.uid][j] = c.sample.tokens
            else:
                jobs.append(_Job(ref.uid, st.pool_of[ref.uid], (j,), rep, prefix_text=c.text, prefix_tokens=c.tokens))
        return jobs

    async def _wait_all(self, st: _Step) -> None:
        """Settle requests as they finish until the step's work is done, checking quiet replicas' health."""
        policy = self.replicas.policy
        quiet_s = min(policy.liveness_s, policy.stall_timeout_s / 2)
        next_check = time.perf_counter() + quiet_s / 2
        while st.busy():
            finished, _ = await asyncio.wait(st.pending, return_when=asyncio.FIRST_COMPLETED,
                                             timeout=max(0.0, next_check - time.perf_counter()))
            for task in sorted(finished, key=lambda t: st.pending[t].end):
                await self._settle(st, task)
            if time.perf_counter() >= next_check and st.busy():
                await self._check_quiet(st, quiet_s)
                next_check = time.perf_counter() + quiet_s / 2

    async def _check_quiet(self, st: _Step, quiet_s: float) -> None:
        """Ask the /health of replicas whose requests are quiet; one that fails is faulted (work re-dispatched)."""
        quiet = st.quiet(time.perf_counter(), quiet_s)
        if not quiet:
            return
        timeout = min(2.0, self.replicas.policy.connect_timeout_s)
        answers = await asyncio.gather(*(self.client.health(self.replicas.endpoints[i], timeout_s=timeout)
                                         for i in quiet))
        for rep, ok in zip(quiet, answers, strict=True):
            task = next((t for t, j in st.pending.items() if j.replica == rep and not t.done()), None)
            if ok or task is None:
                continue
            task.cancel()
            job = st.release(task)
            url = self.replicas.endpoints[rep].url
            await self._fail_over(st, job, ReplicaFault(url, FaultKind.DISCONNECT, f"/health fails while its "
                                                        f"requests made no progress for {quiet_s:g}s (shutting down?)"))

    async def _launch(self, st: _Step, job: _Job) -> None:
        """Send a job to its planned replica, or a healthy one of its pool (same pool first), waiting a while when
        none is healthy."""
        target = self.replicas.pick(job.planned, st.pool_reps[job.pool], st.load)
        if target is None and await self.replicas.wait_any(self.replicas.policy.no_healthy_wait_s):
            target = self.replicas.pick(job.planned, st.pool_reps[job.pool], st.load)
        if target is None:
            last = next((e.reason for e in reversed(self.replicas.events) if not e.up), None)
            raise NoHealthyReplica(f"no healthy replica among {len(self.replicas)} "
                                   f"({', '.join(e.url for e in self.replicas.endpoints)})"
                                   + (f"; last fault: {last}" if last else ""))
        job.replica, job.version = target, self.weight_version
        st.load[target] += len(job.members)
        req = self._request(job, st.specs[job.uid], st.plan.step)
        st.pending[asyncio.get_running_loop().create_task(self._run(job, req))] = job

    async def _settle(self, st: _Step, task: asyncio.Task[Completion]) -> None:
        """One finished request: a replica fault moves its replica's work, a completion records its samples."""
        job = st.release(task)
        if task.cancelled():
            return
        exc = task.exception()
        if isinstance(exc, ReplicaFault):
            await self._fail_over(st, job, exc)
        elif exc is not None:
            raise exc
        else:
            comp = task.result()
            other = next((c.served_version for c in comp.choices if disagrees(c.served_version, job.version)),
                         None) if self.exclude_other_versions else None
            if other is None:
                self._record(st, job, comp)
                return
            url = self.replicas.endpoints[job.replica].url
            await self._fail_over(st, job, ReplicaFault(url, FaultKind.STALE_VERSION, f"its samples carry weight "
                                                        f"version {excerpt(other)}, sent under {job.version}"))

    async def _fail_over(self, st: _Step, job: _Job, exc: ReplicaFault) -> None:
        """Mark the replica down (stale, when its samples carry another weight version: `WeightSync.refresh`
        updates it again) and re-dispatch its unfinished requests (the cut bulk pool's are dropped)."""
        st.snapshot(job)
        if exc.kind is FaultKind.STALE_VERSION:
            self.replicas.mark_stale(job.replica, str(exc))
        else:
            self.replicas.mark_down(job.replica, exc.kind, str(exc))
        moved = [job]
        for other_task, other in list(st.pending.items()):
            if other.replica == job.replica and not other_task.done():
                other_task.cancel()
                st.snapshot(other)
                st.release(other_task)
                moved.append(other)
        for m in moved:
            if not st.spared(m) and st.cut:
                continue
            if m.attempt >= self.replicas.policy.retries:
                raise EngineError(f"prompt group {m.uid} failed {m.attempt + 1} times; last: {exc}")
            st.redispatched += 1
            await self._launch(st, _Job(m.uid, m.pool, m.members, m.planned, attempt=m.attempt + 1,
                                        prefix_text=m.prefix_text, prefix_tokens=m.prefix_tokens))

    def _record(self, st: _Step, job: _Job, comp: Completion) -> None:
        """Store a completed request's samples; a group complete in the bulk pool may trigger the cutoff."""
        now = job.end - st.t0
        for k, j in enumerate(job.members):
            ch = comp.choices[k] if k < len(comp.choices) else None
            if ch is None:
                raise EngineError(f"{self.replicas.endpoints[job.replica].url}: {len(comp.choices)} "
                                  f"choices returned, {len(job.members)} requested")
            resumed = job.prefix_tokens > 0  # text and tokens count the prefix; its token ids are not known
            st.samples[job.uid][j] = Sample(job.prefix_text + ch.text, job.prefix_tokens + ch.tokens, ch.finish_reason,
                                            None if resumed else ch.token_ids, job.replica, now, job.attempt + 1,
                                            None if resumed else ch.logprobs, ch.prompt_token_ids, job.version,
                                            ch.served_version, None if resumed else ch.top_p)
            st.progress[job.uid][j] = job.prefix_tokens + ch.tokens
        if job.uid in st.done_at or any(s is None for s in st.samples[job.uid]):
            return
        st.done_at[job.uid] = now
        if job.pool is Pool.TAIL:
            st.tail_left.discard(job.uid)
        elif job.uid in st.pinned:
            st.pin_left.discard(job.uid)
        elif not st.cut:
            st.bulk_done.append(job.uid)
            if st.rule.bulk_cut(st.bulk_done):
                st.cut, st.bulk_s = True, now
                for other_task, other in st.pending.items():
                    if not st.spared(other):
                        st.snapshot(other)
                        other_task.cancel()
