"""The controller's fresh-work sample (`policy.fresh`): the step's fresh groups, cut members completed by censored
resampling from lengths at least as long (issue 22: a consumed batch under-states fresh work where the cut groups'
regenerations are shorter than what was cut)."""

from __future__ import annotations

import numpy as np

from tailsieve.policy.control_state import StepWork
from tailsieve.policy.fresh import complete, fresh_record, fresh_sample


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
    assert fresh_record(w).tolist() == [[8, 1, 2, 1, 2], [9, 0, 1, 10, 500]]  # the tail group (uid 7) is not fresh
    anon = StepWork(a, np.zeros_like(a), 1, np.array([True, True, False]), np.array([False, True, True]))
    assert fresh_record(anon).tolist() == [[-1, 1, 2, 1, 2], [-1, 0, 0, 10, 500]]  # no uids, no finished counts


def test_complete_draws_each_censored_member_from_the_population_at_least_its_progress() -> None:
    """`complete` on a record: the consumed group (uid 8) is kept as it ran; group uid 9 was cut with one member
    finished (10 tokens, its shortest: kept) and one at 500, drawn from the population's lengths ≥ 500 (650, 700,
    5000; never 300 or 20); group uid 10 was cut with none finished, so both members are drawn (≥ 40 from 300, 650,
    700, 5000; ≥ 600 from 650, 700, 5000). A population with nothing that long leaves the progress itself."""
    rec = np.array([[8, 1, 2, 100, 120], [9, 0, 1, 10, 500], [10, 0, 0, 600, 40]], dtype=np.int64)
    population = (np.array([[5000, 20]], dtype=np.int64), np.array([300, 650, 700], dtype=np.int64))
    outs = [complete(rec, population, step) for step in range(60)]
    assert all(o[0].tolist() == [100, 120] for o in outs)
    assert {tuple(o[1].tolist()) for o in outs} == {(10, 650), (10, 700), (10, 5000)}
    assert {int(o[2, 0]) for o in outs} == {650, 700, 5000}
    assert {int(o[2, 1]) for o in outs} == {300, 650, 700, 5000}
    assert complete(rec, population, 3).tolist() == complete(rec, population, 3).tolist()  # seeded by the step
    short = (np.array([300, 400], dtype=np.int64),)
    none_long = {tuple(map(tuple, complete(rec, short, step).tolist())) for step in range(40)}
    assert none_long == {((100, 120), (10, 500), (600, 300)), ((100, 120), (10, 500), (600, 400))}
    assert complete(rec, (np.zeros(0, np.int64),), 0).tolist() == [[100, 120], [10, 500], [600, 40]]  # none: progress
    assert complete(rec[:1], population, 0).tolist() == [[100, 120]]  # nothing cut: the record's lengths


def test_the_controller_keeps_each_steps_fresh_sample_as_it_was_drawn() -> None:
    """tailsieve-fixed on a simulated fleet: each step adds to the history that step's `fresh_sample` (from its own
    batch and the history before it), and no entry is revised a step later (the one-step-later completion of cut
    groups by their regenerations is gone). At a two-pool step the sample's cut groups are exactly the fresh groups
    the cutoff stopped (by uid), consumed rows are kept as they ran, a cut group's finished (shortest) members keep
    their lengths and every censored member is at least its progress. The state's JSON holds no pending record."""
    from tailsieve.engines.rollout.state import control_to_json
    from tailsieve.loop import StepLoop, make_controller
    from tailsieve.model.curve_names import load_curve
    from tailsieve.policy.router import Router, RouterConfig
    from tailsieve.simulation.executor import SimExecutor
    from tailsieve.workloads import load_workload

    rc = RouterConfig(groups=16, group_size=4, replicas=4, rho=0.25)
    wl = load_workload("kodcode-tests", mode="resample", seed=1)
    curve = load_curve("h100-llama3-8b")
    loop = StepLoop(Router(rc, wl.prompts), make_controller("tailsieve-fixed", rc, bulk_curve=curve))
    keep = loop.controller.config.history_steps
    ex = SimExecutor(wl, curve, rc)
    state = loop.initial()
    checked = 0
    for _ in range(8):
        before = state.control
        out = loop.step(state, ex)
        state = out.state
        o = out.observation
        assert o.work is not None
        sample = fresh_sample(o.work, before.history, o.step)
        newest = o.consumed_lengths if sample is None else sample
        assert [h.tolist() for h in state.control.history] == [h.tolist() for h in (*before.history, newest)[-keep:]]
        rec = fresh_record(o.work)
        if o.warmup or o.m == 0 or o.q == 0 or rec is None or rec[:, 1].all():
            continue
        assert sample is not None
        cut = {r.ref.uid for r in out.result.outcomes if r.status.value != "done" and r.ref.cuts == 0}
        assert set(rec[rec[:, 1] == 0, 0].tolist()) == cut
        kept = rec[:, 1] == 1
        assert sample[kept].tolist() == rec[kept, 3:].tolist()
        for i in np.flatnonzero(~kept):
            order = np.argsort(rec[i, 3:], kind="stable")
            done, rest = order[: rec[i, 2]], order[rec[i, 2]:]
            assert sample[i, done].tolist() == rec[i, 3 + done].tolist()
            assert (sample[i, rest] >= rec[i, 3 + rest]).all()
        checked += 1
    assert checked >= 3
    assert "last_fresh" not in control_to_json(state.control)


def _complete_one_at_a_time(rec: np.ndarray, population: tuple[np.ndarray, ...], step: int) -> np.ndarray:
    """`complete` written member by member (the rule in its docstring), as brute force for the vectorised one."""
    out = rec[:, 3:].copy()
    rows = np.flatnonzero(rec[:, 1] == 0)
    pool = np.sort(np.concatenate([np.asarray(a, np.int64).ravel() for a in population]))
    rng = np.random.default_rng((20261201, step))
    block = out[rows]
    rank = np.argsort(np.argsort(block, axis=1, kind="stable"), axis=1, kind="stable")
    censored = rank >= rec[rows, 2][:, None]
    draw = rng.random(block.shape)
    for j in range(len(rows)):
        for k in np.flatnonzero(censored[j]):
            p, u = block[j, k], draw[j, k]
            lo = int(np.searchsorted(pool, p, side="left"))
            if lo < pool.size:
                block[j, k] = pool[lo + min(int(u * (pool.size - lo)), pool.size - lo - 1)]
    out[rows] = block
    return out


def test_completing_all_cut_members_at_once_equals_one_at_a_time() -> None:
    rng = np.random.default_rng(3)
    cut = 0
    for trial in range(30):
        f, g = int(rng.integers(1, 40)), int(rng.integers(1, 9))
        lengths = rng.integers(1, 3000, (f, g))
        kept = rng.random(f) < 0.5
        done = np.where(kept, g, rng.integers(0, g, f))
        rec = np.column_stack((np.arange(f) + 100, kept, done, lengths)).astype(np.int64)
        population = (rng.integers(1, 2000 if trial % 3 else 4000, (int(rng.integers(0, 60)), g)),)
        got = complete(rec, population, trial)
        assert (got == _complete_one_at_a_time(rec, population, trial)).all()
        cut += int((got != lengths).sum())
    assert cut > 0  # members were drawn, not only kept
