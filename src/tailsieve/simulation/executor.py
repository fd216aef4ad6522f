"""`SimExecutor` (mechanism, virtual time): runs a `StepPlan` on simulated replicas and reports a `StepResult`.

It draws each group's lengths from the workload (generation a of prompt p: fresh draws every time a prompt is
regenerated, common random numbers across policies), runs every replica with `replica.run_replica` (the plan's
tail replicas on the tail curve, §3.4) and applies the step contract's cutoff rule (`policy.step.Cutoff`: tail
and pinned groups complete, the other bulk groups cut at their (quota − pinned)-th completion, ties: earlier in the
stream), reporting each aborted group's progress at the cutoff; the pinned requests then continue on their
replicas without the aborted ones (`replica.resume_replica`); T_bulk is the last kept bulk group's finish. A group
in `StepPlan.resume` (partial rollout: the peer policies) continues the generation it was cut in last step: the
same lengths, only the tokens past its prefix are decoded, and the prefix is prefilled again with the prompt.
`SimRestarts` is the simulator's pool hook: a step whose pools differ from the last step's pays `restart_s`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace
from typing import cast

import numpy as np
from numpy.typing import NDArray

from tailsieve.model.curves import TpotCurve
from tailsieve.model.engine import FleetSpeed
from tailsieve.policy.router import RouterConfig
from tailsieve.policy.step import (
    Cutoff,
    GroupOutcome,
    GroupRef,
    GroupStatus,
    InvariantError,
    Pool,
    StepPlan,
    StepResult,
)
from tailsieve.simulation.replica import ReplicaConfig, ReplicaRun, resume_paged, resume_replica, run_replica
from tailsieve.workloads import Workload

# run (at the curve's speed), requests, curve, prompt tokens, slowdown (the replica's time multiplier)
_Run = tuple[ReplicaRun, NDArray[np.intp], TpotCurve, NDArray[np.int64] | None, float]


class SimExecutor:
    """Executes plans in virtual time; owns the per-prompt generation counters (common random numbers)."""

    def __init__(
        self,
        workload: Workload,
        curve: TpotCurve,
        router: RouterConfig,
        replica: ReplicaConfig | None = None,
        *,
        tail_curve: TpotCurve | None = None,
        speed: FleetSpeed | None = None,
        seed: int = 0,
    ) -> None:
        self.workload = workload
        self.curve = curve  # bulk replicas (every replica in uniform and warm-up steps)
        self.tail_curve = curve if tail_curve is None else tail_curve  # the plan's tail replicas (§3.4)
        self.router = router
        self.replica = replica or ReplicaConfig()
        if self.replica.tool_wait_s == 0 and workload.tool_wait_s > 0:  # a multi-turn workload's tool latency
            self.replica = replace(self.replica, tool_wait_s=workload.tool_wait_s)
        self.speed = speed or FleetSpeed()  # per-replica speeds and their drift (seeded: the same for every policy)
        self.seed = seed
        self.generation: dict[str, int] = defaultdict(int)
        self.last_lengths: NDArray[np.int64] = np.zeros((0, router.group_size), dtype=np.int64)  # last step, plan order
        # the generations cut in the last step (lengths, turns), kept for a plan that resumes them (`StepPlan.resume`)
        self._carried: dict[int, tuple[NDArray[np.int64], NDArray[np.int64] | None]] = {}

    def draw(self, prompt_id: str, step: int) -> NDArray[np.int64]:
        """Lengths of the next generation of a prompt (a counts every generation of p in this run)."""
        return self._draw(prompt_id, step)[0]

    def _draw(self, prompt_id: str, step: int) -> tuple[NDArray[np.int64], NDArray[np.int64] | None]:
        """The next generation's lengths and, for a multi-turn workload with tool waits, its decode turns."""
        a = self.generation[prompt_id]
        self.generation[prompt_id] = a + 1
        g = self.router.group_size
        turns = self.workload.turns(prompt_id, a, step, g) if self.replica.tool_wait_s > 0 else None
        return self.workload.lengths(prompt_id, a, step, g), turns

    def prompt_tokens(self, prompt_ids: Sequence[str]) -> NDArray[np.int64] | None:
        """Prompt tokens per id when the prefill option or the paged engine is on (0 where the trace does not record
        them)."""
        if self.replica.prefill_ms_per_token <= 0 and not self.replica.paged:
            return None
        return np.array([self.workload.prompt_tokens(p) or 0 for p in prompt_ids], dtype=np.int64)

    def execute(self, plan: StepPlan) -> StepResult:
        """Run one step: tail pool to completion, bulk pool cut after `bulk_quota` complete groups (pinned groups
        run to completion; the others are cut at their (quota − pinned)-th completion)."""
        groups = (*plan.tail, *plan.bulk)
        q = len(plan.tail)
        drawn = [self._resumed(ref.uid) if ref.uid in plan.resume else self._draw(ref.prompt_id, plan.step)
                 for ref in groups]
        lengths = np.stack([d[0] for d in drawn])  # (n, G) in plan order
        turns = None if drawn[0][1] is None else np.stack([cast(NDArray[np.int64], d[1]) for d in drawn])
        self.last_lengths = lengths
        prefix = np.zeros_like(lengths)
        for i, ref in enumerate(groups):
            if ref.uid in plan.resume:
                prefix[i] = np.minimum(np.asarray(plan.resume[ref.uid], dtype=np.int64), lengths[i])
        fin, runs = self._run_replicas(plan, groups, lengths - prefix, turns, prefix)
        done_at = fin.max(axis=1)
        tail_s = float(done_at[:q].max()) if q else 0.0
        rule = Cutoff.of(plan)  # the step contract's cutoff rule
        bulk_uid = np.array([ref.uid for ref in plan.bulk], dtype=np.int64)
        pin = np.array([rule.spared(ref.uid) for ref in plan.bulk], dtype=bool)
        order = np.lexsort((bulk_uid, done_at[q:]))  # bulk completion order, ties by stream position
        at = {int(u): i for i, u in enumerate(bulk_uid)}
        keep = np.array([at[u] for u in rule.kept_bulk(bulk_uid[order].tolist())], dtype=np.intp)
        kept = np.zeros(len(groups), dtype=bool)
        kept[:q] = True
        kept[q + keep] = True
        kept[q + np.flatnonzero(pin)] = True
        cut_s = float(done_at[q + keep[-1]]) if keep.size else 0.0
        counts = np.zeros(3, np.int64)  # preemptions, recomputed tokens, prefix-hit tokens (paged replicas)
        resumed: set[int] = set()
        if pin.any() and turns is None:  # multi-turn: pinned groups keep their full-run finish (pessimistic)
            fin, resumed = self._spare_pinned(fin, runs, kept, cut_s, counts)
            done_at = np.where(kept, fin.max(axis=1), done_at)
        bulk_s = max(cut_s, float(done_at[q + np.flatnonzero(pin)].max())) if pin.any() else cut_s
        at_cut = prefix.ravel().copy()  # a resumed request's prefix, plus what this step generated by the cut
        flat_kept = np.repeat(kept, lengths.shape[1])
        for j, (run, idx, _, _, slow) in enumerate(runs):
            at_cut[idx] += run.tokens_at(cut_s / slow)
            if run.paged is not None and j not in resumed:  # a resumed run's counts came from `_spare_pinned`
                counts += run.counts(None if flat_kept[idx].all() else cut_s / slow)
        self._carried = {ref.uid: drawn[i] for i, ref in enumerate(groups) if not kept[i]}
        cut_tokens = cast(list[list[int]], at_cut.reshape(lengths.shape).tolist())
        full: list[list[int]] = lengths.tolist()
        finished: list[int] = (fin <= cut_s).sum(axis=1).tolist()
        g = lengths.shape[1]
        outcomes = tuple(
            GroupOutcome(ref, Pool.TAIL if i < q else Pool.BULK, GroupStatus.DONE, float(done_at[i]), tuple(full[i]), g)
            if kept[i]
            else GroupOutcome(ref, Pool.BULK, GroupStatus.ABORTED, None, tuple(cut_tokens[i]), finished[i])
            for i, ref in enumerate(groups)
        )
        return StepResult(plan.step, outcomes, tail_s, bulk_s, max(tail_s, bulk_s), preemptions=int(counts[0]),
                          recomputed_tokens=int(counts[1]), prefix_hit_tokens=int(counts[2]))

    def _resumed(self, uid: int) -> tuple[NDArray[np.int64], NDArray[np.int64] | None]:
        """The generation a group was cut in last step (`StepPlan.resume`): same lengths, no new draw."""
        if uid not in self._carried:
            raise InvariantError(f"group {uid} is resumed but was not cut in the previous step")
        return self._carried[uid]

    def _run_replicas(self, plan: StepPlan, groups: Sequence[GroupRef], lengths: NDArray[np.int64],
                      turns: NDArray[np.int64] | None = None, prefix: NDArray[np.int64] | None = None
                      ) -> tuple[NDArray[np.float64], list[_Run]]:
        """Every replica's run to completion: (n, G) finish times, and per replica its run (at the curve's speed),
        request indices, curve, prompt tokens and slowdown (its times × slowdown are the replica's). The all-admit
        replicas share a group's prompt by `shared_prefill`; the paged engine prefills every request's prompt
        unless its prefix cache holds the group's (a resumed request re-prefills its prompt and its prefix)."""
        place = np.array([plan.placement[ref.uid] for ref in groups], dtype=np.int64)
        flat_len, flat_rep = lengths.ravel(), place.ravel()
        g = lengths.shape[1]
        ptoks = self.prompt_tokens([ref.prompt_id for ref in groups])
        keys = None
        if ptoks is None:
            flat_ptok = None
        elif self.replica.paged:
            flat_ptok = np.repeat(ptoks, g)
            keys = np.repeat(np.arange(len(groups), dtype=np.int64), g)
            if prefix is not None:  # a resumed generation's prefix is its own: no shared prompt
                keys[(prefix > 0).ravel()] = -1
        else:
            flat_ptok = shared_prefill(np.repeat(ptoks, g), place)
        if flat_ptok is not None and prefix is not None:
            flat_ptok = flat_ptok + prefix.ravel()
        slow = 1.0 / self.speed.speeds(self.router.replicas, self.seed, plan.step)  # time multiplier per replica
        by_rep = np.argsort(flat_rep, kind="stable")  # requests grouped by replica, plan order inside each
        bounds = np.flatnonzero(np.diff(flat_rep[by_rep])) + 1
        finish = np.zeros(flat_len.size)
        runs: list[_Run] = []
        tail_reps = set(plan.tail_replicas)
        for idx in np.split(by_rep, bounds):
            rep = int(flat_rep[idx[0]])
            curve = self.tail_curve if rep in tail_reps else self.curve
            ptok = None if flat_ptok is None else flat_ptok[idx]
            run = run_replica(flat_len[idx], curve, self.replica, ptok, None if turns is None else turns.ravel()[idx],
                              None if keys is None else keys[idx])
            f = float(slow[rep % slow.size])
            finish[idx] = run.finish_s * f
            runs.append((run, idx, curve, ptok, f))
        return finish.reshape(lengths.shape), runs

    def _spare_pinned(self, fin: NDArray[np.float64], runs: list[_Run], kept: NDArray[np.bool_], cut_s: float,
                      counts: NDArray[np.int64]) -> tuple[NDArray[np.float64], set[int]]:
        """Finish times once the cut groups leave their replicas at `cut_s` (the kept ones continue alone), and the
        runs (indices) a paged replica reran so: their engine counts are added to `counts`."""
        keep = np.repeat(kept, fin.shape[1])
        out = fin.ravel().copy()
        resumed: set[int] = set()
        for j, (run, idx, curve, ptok, f) in enumerate(runs):
            if run.paged is None:
                out[idx] = resume_replica(run, keep[idx], cut_s / f, curve, self.replica, ptok) * f
            elif not keep[idx].all() and not (run.finish_s * f <= cut_s).all():
                again = resume_paged(run, keep[idx], cut_s / f, curve, self.replica)
                resumed.add(j)
                counts += again.counts()
                out[idx] = again.finish_s * f
        return out.reshape(fin.shape), resumed


def shared_prefill(prompt_tokens: NDArray[np.int64], place: NDArray[np.int64]) -> NDArray[np.int64]:
    """Prompt tokens each request prefills when a replica's prefix cache shares a prompt (§3.1 dispatch): the first
    request of a group on a replica prefills the prompt, the group's later requests there reuse it (0); a group dealt
    over k replicas pays it k times. `place`: (n, G) replica of each request; `prompt_tokens` flat, plan order."""
    n = place.shape[0]
    key = np.arange(n)[:, None] * (int(place.max(initial=0)) + 1) + place
    _, first = np.unique(key.ravel(), return_index=True)
    out = np.zeros_like(prompt_tokens)
    out[first] = prompt_tokens[first]
    return out


class SimRestarts:
    """The simulator's pool hook: `restart_s` seconds whenever a plan's tail pool differs from the last step's (the
    moved replicas restart in parallel); the first step starts from every replica bulk, as a launcher does."""

    def __init__(self, restart_s: float) -> None:
        self.restart_s = restart_s
        self.tail: tuple[int, ...] = ()

    def __call__(self, plan: StepPlan) -> float:
        """Restart seconds before `plan` runs."""
        moved = plan.tail_replicas != self.tail
        self.tail = plan.tail_replicas
        return self.restart_s if moved else 0.0
