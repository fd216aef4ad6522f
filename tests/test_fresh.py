"""The controller's fresh-work sample (`policy.fresh`): the step's fresh groups, cut members completed by censored
resampling from lengths at least as long (issue 22: a consumed batch under-states fresh work where the cut groups'
regenerations are shorter than what was cut)."""

from __future__ import annotations

import numpy as np

from tailsieve.policy.control_state import StepWork
from tailsieve.policy.fresh import complete, fresh_record, fresh_sample, regenerations


def work(*, lengths: list[list[int]], tail: int, kept: list[bool], fresh: list[bool], finished: list[int]
         ) -> StepWork:
    a = np.array(lengths, dtype=np.int64)
    return StepWork(a, np.zeros_like(a), tail, np.array(kept), np.array(fresh), np.array(finished, dtype=np.int64))


def test_tail_groups_and_returning_candidates_are_not_fresh_work() -> None:
    w = work(lengths=[[9, 9], [5, 6], [1, 2], [3, 4]], tail=1, kept=[True, True, True, True],
             fresh=[False, False, True, True], finished=[2, 2, 2, 2])
    assert fresh_sample(w, (), 0).tolist() == [[1, 2], [3, 4]]
    none = work(lengths=[[9, 9]], tail=0, kept=[True], fresh=[False], finished=[2])
    assert fresh_sample(none, (), 0) is None


def test_a_cut_members_length_is_drawn_from_lengths_at_least_its_progress() -> None:
    """Group 2 was cut with one member finished (10 tokens) and one at 500: the finished (shortest) member keeps
    its 10, the other is drawn from the step's and history's member lengths ≥ 500: {600, 900} (never below 500)."""
    w = work(lengths=[[100, 120], [10, 500]], tail=0, kept=[True, False], fresh=[True, True], finished=[2, 1])
    hist = (np.array([[600, 20], [900, 30]], dtype=np.int64),)
    draws = {tuple(fresh_sample(w, hist, step)[1].tolist()) for step in range(40)}
    assert draws == {(10, 600), (10, 900)}
    assert fresh_sample(w, hist, 3).tolist() == fresh_sample(w, hist, 3).tolist()  # seeded by the step
    lone = work(lengths=[[100, 120], [700, 800]], tail=0, kept=[True, False], fresh=[True, True], finished=[2, 0])
    assert fresh_sample(lone, (), 0)[1].tolist() == [700, 800]  # nothing that long seen: the progress itself


def test_a_fresh_record_keeps_uid_consumed_finished_and_progress() -> None:
    a = np.array([[9, 9], [1, 2], [10, 500]], dtype=np.int64)
    w = StepWork(a, np.zeros_like(a), 1, np.array([True, True, False]), np.array([False, True, True]),
                 np.array([2, 2, 1]), np.array([7, 8, 9]))
    assert fresh_record(w).tolist() == [[8, 1, 2, 1, 2], [9, 0, 1, 10, 500]]
    assert {k: v.tolist() for k, v in regenerations(w).items()} == {7: [9, 9]}  # tail group: not fresh, consumed


def test_a_cut_member_is_completed_from_its_own_regeneration_when_it_ran_that_long() -> None:
    """Group uid 9 was cut with one member at 500 (one finished at 10). Its regeneration ran members of 300, 650 and
    700: the censored member is drawn from {650, 700} (its own prompt's draws of at least 500), never from the
    population's 5000; a regeneration with nothing that long leaves the population's draw ≥ 500 (5000)."""
    rec = np.array([[8, 1, 2, 100, 120], [9, 0, 1, 10, 500]], dtype=np.int64)
    population = (np.array([[5000, 20]], dtype=np.int64),)
    own = {9: np.array([300, 650, 700], dtype=np.int64)}
    draws = {tuple(complete(rec, population, step, own)[1].tolist()) for step in range(40)}
    assert draws == {(10, 650), (10, 700)}
    short = {9: np.array([300, 400], dtype=np.int64)}
    assert complete(rec, population, 0, short)[1].tolist() == [10, 5000]
    assert complete(rec, population, 0)[0].tolist() == [100, 120]  # consumed groups are kept as they ran


def test_the_controller_completes_a_split_steps_cut_groups_once_they_are_regenerated() -> None:
    """tailsieve-fixed on a simulated fleet: after a two-pool step that cut fresh groups, the state holds that step's
    record (uids of the cut groups, their progress); the next step regenerates them, and the previous sample in the
    history is replaced by `complete` of that record: consumed rows unchanged, every cut member at least its
    progress. The record survives the state's JSON round trip field by field."""
    from tailsieve.engines.rollout.state import control_from_json, control_to_json
    from tailsieve.loop import StepLoop, make_controller
    from tailsieve.model.curves import load_curve
    from tailsieve.policy.router import Router, RouterConfig
    from tailsieve.simulation.executor import SimExecutor
    from tailsieve.workloads import load_workload

    rc = RouterConfig(groups=16, group_size=4, replicas=4, rho=0.25)
    wl = load_workload("kodcode-tests", mode="resample", seed=1)
    curve = load_curve("h100-llama3-8b")
    loop = StepLoop(Router(rc, wl.prompts), make_controller("tailsieve-fixed", rc, bulk_curve=curve))
    ex = SimExecutor(wl, curve, rc)
    state = loop.initial()
    checked = 0
    for _ in range(8):
        before = state.control
        out = loop.step(state, ex)
        state = out.state
        if before.last_fresh:
            rec = before.last_fresh[0]
            regen = {o.ref.uid for o in out.consumed if o.ref.cuts > 0}
            assert set(rec[rec[:, 1] == 0, 0].tolist()) <= regen | {o.ref.uid for o in out.result.outcomes}
            redone = state.control.history[-2]
            kept = rec[:, 1] == 1
            assert redone[kept].tolist() == rec[kept, 3:].tolist()
            assert (redone[~kept] >= rec[~kept, 3:]).all()
            checked += 1
        if state.control.last_fresh:
            rec = state.control.last_fresh[0]
            cut = {o.ref.uid for o in out.result.outcomes if o.status.value != "done" and o.ref.cuts == 0}
            assert set(rec[rec[:, 1] == 0, 0].tolist()) == cut
            back = control_from_json(control_to_json(state.control))
            assert back.last_fresh[0].tolist() == rec.tolist()
    assert checked >= 3


def _complete_one_at_a_time(rec: np.ndarray, population: tuple[np.ndarray, ...], step: int,
                            regen: dict[int, np.ndarray]) -> np.ndarray:
    """`complete` written member by member (the rule in its docstring), as brute force for the vectorised one."""
    out = rec[:, 3:].copy()
    rows = np.flatnonzero(rec[:, 1] == 0)
    pool = np.sort(np.concatenate([a.ravel() for a in population]))
    rng = np.random.default_rng((20261201, step))
    block = out[rows]
    rank = np.argsort(np.argsort(block, axis=1, kind="stable"), axis=1, kind="stable")
    censored = rank >= rec[rows, 2][:, None]
    draw = rng.random(block.shape)
    for j, i in enumerate(rows):
        own = np.sort(regen.get(int(rec[i, 0]), np.zeros(0, np.int64)))
        for k in np.flatnonzero(censored[j]):
            p, u = block[j, k], draw[j, k]
            for source in (own, pool):
                lo = int(np.searchsorted(source, p, side="left"))
                if lo < source.size:
                    block[j, k] = source[lo + min(int(u * (source.size - lo)), source.size - lo - 1)]
                    break
    out[rows] = block
    return out


def test_completing_all_cut_members_at_once_equals_one_at_a_time() -> None:
    rng = np.random.default_rng(3)
    for trial in range(30):
        f, g = int(rng.integers(1, 40)), int(rng.integers(1, 9))
        lengths = rng.integers(1, 3000, (f, g))
        kept = rng.random(f) < 0.5
        done = np.where(kept, g, rng.integers(0, g, f))
        rec = np.column_stack((np.arange(f) + 100, kept, done, lengths)).astype(np.int64)
        population = (rng.integers(1, 2000 if trial % 3 else 4000, (int(rng.integers(0, 60)), g)),)
        regen = {100 + int(i): rng.integers(1, 5000, g) for i in rng.choice(f, size=f // 2, replace=False)}
        regen[100 + f] = rng.integers(1, 9, g)  # a uid no row has
        for r in (regen, {}):
            assert (complete(rec, population, trial, r) == _complete_one_at_a_time(rec, population, trial, r)).all()
