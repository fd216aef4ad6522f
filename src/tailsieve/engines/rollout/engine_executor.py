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
so far (completions API, one request per member). A member cut with its whole budget streamed (its last token had
arrived, its stream had not ended) is not sent again: it finishes at its budget (finish "length") with the replica and
weight version that generated it; a group left with nothing to send is complete at dispatch. Any other resumed plan
is refused with `PlanNotRunnable` before anything is sent. A resumed sample's text and tokens include its prefix; its
token ids and logprobs are None (the prefix's are not kept). The step's bookkeeping lives in `executor_step.py`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import cast

from tailsieve.engines.rollout.executor_step import Job, RunningStep
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
from tailsieve.policy.step import GroupRef, GroupStatus, Pool, StepPlan

# the executor's values live in executor_types.py; importing them from here keeps working
__all__ = ["Carried", "EngineExecutor", "ExecutedStep", "GroupSpec", "GroupSpecFn", "PlanNotRunnable", "RequestMode",
           "Sample"]


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

    def _jobs(self, ref: GroupRef, pool: Pool, placement: tuple[int, ...], spec: GroupSpec) -> list[Job]:
        if self.mode is RequestMode.SPLIT:
            return [Job(ref.uid, pool, (j,), rep) for j, rep in enumerate(placement)]
        by_key: dict[tuple[int, int | None], list[int]] = {}
        for j, rep in enumerate(placement):
            by_key.setdefault((rep, spec.max_tokens[j]), []).append(j)
        return [Job(ref.uid, pool, tuple(ms), rep) for (rep, _), ms in by_key.items()]

    def _request(self, job: Job, spec: GroupSpec, step: int) -> Request:
        j0 = job.members[0]
        rid = f"ts-{step}-{job.uid}-{j0}-{job.attempt}"
        if not job.prefix_tokens:
            return Request(rid, spec.prompt, n=len(job.members), seed=spec.seeds[j0], max_tokens=spec.max_tokens[j0])
        cap = spec.max_tokens[j0] or self.params.max_tokens  # a resumed member decodes only the rest of its budget
        return Request(rid, f"{spec.prompt}{job.prefix_text}", n=1, seed=spec.seeds[j0],
                       max_tokens=max(cap - job.prefix_tokens, 1))

    async def _run(self, job: Job, req: Request) -> Completion:
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
        st = RunningStep(plan, {r.uid: fn(r) for r in (*plan.tail, *plan.bulk)}, self.g, len(self.replicas))
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
        self._carried = {o.ref.uid: tuple(Carried(st.texts[o.ref.uid][j], n, st.samples[o.ref.uid][j],
                                                  *st.origin[o.ref.uid][j]) for j, n in enumerate(o.lengths))
                         for o in outcomes if o.status is GroupStatus.ABORTED} if self.partial else {}
        return ExecutedStep(plan.step, outcomes, tail_s, bulk_s, max(tail_s, bulk_s),
                            {u: tuple(s) for u, s in st.samples.items()}, st.redispatched, st.started_at)

    def _check_resume(self, st: RunningStep) -> None:
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

    def _resumed(self, st: RunningStep, ref: GroupRef) -> list[Job]:
        """A resumed group: members that had finished keep their samples, and so does a member cut at its budget (its
        last token streamed, not its end): it finishes there ("length", under the weights that generated it), since
        a resent request would decode past the budget; the others continue from their text. A group left with
        nothing to send is complete at once."""
        jobs, now, caps = [], time.perf_counter() - st.t0, st.specs[ref.uid].max_tokens
        for j, (c, rep) in enumerate(zip(self._carried[ref.uid], st.plan.placement[ref.uid], strict=True)):
            got = c.sample if c.sample is not None or c.tokens < (caps[j] or self.params.max_tokens) else \
                Sample(c.text, c.tokens, "length", None, c.replica, now, 1, weight_version=c.weight_version)
            if got is not None:
                st.samples[ref.uid][j], st.progress[ref.uid][j] = got, got.tokens
            else:
                jobs.append(Job(ref.uid, st.pool_of[ref.uid], (j,), rep, prefix_text=c.text, prefix_tokens=c.tokens))
        st.complete(ref.uid, now)
        return jobs

    async def _wait_all(self, st: RunningStep) -> None:
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

    async def _check_quiet(self, st: RunningStep, quiet_s: float) -> None:
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

    async def _launch(self, st: RunningStep, job: Job) -> None:
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

    async def _settle(self, st: RunningStep, task: asyncio.Task[Completion]) -> None:
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

    async def _fail_over(self, st: RunningStep, job: Job, exc: ReplicaFault) -> None:
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
            await self._launch(st, Job(m.uid, m.pool, m.members, m.planned, attempt=m.attempt + 1,
                                        prefix_text=m.prefix_text, prefix_tokens=m.prefix_tokens))

    def _record(self, st: RunningStep, job: Job, comp: Completion) -> None:
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
        st.complete(job.uid, now)
