"""The outer loop (C.2 and `tailsieve`'s rules beyond it, `policy/outer.py`): one test per rule, on small
deterministic histories (helpers: controller_fixtures.py)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from conftest import fixed_forecast
from controller_fixtures import CURVE, history, make, obs
from tailsieve.errors import ConfigError
from tailsieve.policy.controller import CONTROLLERS, ControllerConfig, ControlState
from tailsieve.policy.predictor import Predictor


def test_outer_radius_and_one_replica_per_move() -> None:
    c = make("tailsieve", q0=1, m0=6, m_gain=0.0)
    s = ControlState(q=1, m=6, history=(history(),), tail_history=(history()[:2],))
    pred = c.predictor(s)
    out = c.outer(s, pred)
    assert abs(out.m - 6) <= 1
    # candidates never leave [1, R-1] ∪ {0}
    assert 0 <= out.m <= 7


def test_uniform_boundary_chosen_when_isolation_cannot_help() -> None:
    c = make("tailsieve", q0=1, m0=1, m_gain=0.0)
    flat = np.full((32, 4), 100, dtype=np.int64)  # identical lengths: isolation only loses capacity
    s = ControlState(q=1, m=1, history=(flat,), tail_history=(flat[:1],), dwell=3)
    out = c.outer(s, c.predictor(s))
    assert (out.q, out.m) == (0, 0)
    assert out.dwell == 0  # switching to uniform restarts the dwell count


def test_uniform_boundary_waits_for_min_dwell_after_leaving_it() -> None:
    c = make("tailsieve", q0=1, m0=1, m_gain=0.0, min_dwell=3)
    flat = np.full((32, 4), 100, dtype=np.int64)
    s = ControlState(q=1, m=1, history=(flat,), tail_history=(flat[:1],), dwell=2)
    assert c.outer(s, c.predictor(s)).m != 0


def test_feasibility_rejects_transfers_the_gaining_pool_cannot_absorb() -> None:
    c = make("tailsieve")
    s = ControlState(q=1, m=1, history=(history(),), tail_history=(history()[:2],))
    pred = c.predictor(s)
    deadline = pred.makespan(1, 1)
    # with an unbounded deadline the smaller bulk pool still finishes all it must: nothing dropped, feasible
    assert c.feasible(s, pred, 1, 1, 2, 1e9)
    # the rule itself, both directions: G_tail(m') >= D_bulk(m') and mirrored
    n, q = 16, 1
    for m, mc in ((1, 2), (1, 3), (3, 2), (3, 1)):
        if mc > m:
            gained = max(0, pred.tail_capacity(deadline, mc, 16 - 1) - q)
            dropped = max(0, (n - q) - pred.bulk_capacity(deadline, q, mc))
        else:
            gained = max(0, pred.bulk_capacity(deadline, q, mc) - (n - q))
            dropped = max(0, q - pred.tail_capacity(deadline, mc, q))
        assert c.feasible(s, pred, q, m, mc, deadline) == (gained >= dropped)
    # with no time at all the bulk pool drops everything it must finish: infeasible
    assert not c.feasible(s, pred, 1, 1, 2, 0.0)


def test_outer_waits_for_the_inner_loop_to_settle() -> None:
    c = make("tailsieve", q0=1, m0=4, m_gain=0.0)
    s = c.update(c.initial(), obs(q=0, m=0, tail_s=0.0, bulk_s=50.0, warmup=True))
    assert s.m == 4  # a warm-up step never moves m


def test_move_cost_is_learnt_from_restarts_and_blocks_moves_that_do_not_repay_it() -> None:
    c = make("tailsieve", q0=1, m0=1, m_gain=0.0, min_dwell=0, ema=0.5, move_horizon=4)
    flat = np.full((32, 4), 100, dtype=np.int64)  # isolation only loses capacity: the outer loop wants (0, 0)
    s = ControlState(q=1, m=1, history=(flat,), tail_history=(flat[:1],), dwell=3)
    pred = c.predictor(s)
    gain = c._calibrated(s, pred, 1, 1) - c._calibrated(s, pred, 0, 0)
    assert gain > 0 and c.outer(s, pred).m == 0  # no restart price known: the move happens
    # learning: only steps whose m changed and that paid a restart count, as an EMA
    s1 = c._with_history(replace(s, last_m=0), replace(obs(q=1, m=1, tail_s=1, bulk_s=1), restart_s=10.0))
    assert s1.move_cost_s == 10.0 and s1.last_m == 1
    s2 = c._with_history(s1, replace(obs(q=1, m=1, tail_s=1, bulk_s=1), restart_s=99.0))  # m unchanged: ignored
    assert s2.move_cost_s == 10.0
    s3 = c._with_history(replace(s2, last_m=2), replace(obs(q=1, m=1, tail_s=1, bulk_s=1), restart_s=30.0))
    assert s3.move_cost_s == pytest.approx(20.0)
    # the rule: move only if gain × horizon ≥ price
    cheap = replace(s, move_cost_s=gain * 4 * 0.99)
    dear = replace(s, move_cost_s=gain * 4 * 1.01)
    assert c.outer(cheap, pred).m == 0
    kept = c.outer(dear, pred)
    assert (kept.q, kept.m) == (1, 1) and "would not repay its restart" in kept.note
    prior = make("tailsieve", q0=1, m0=1, m_gain=0.0, min_dwell=0, move_cost_s=gain * 4 * 1.01, move_horizon=4)
    assert prior.outer(s, pred).m == 1  # the configured prior applies until a restart is measured
    with pytest.raises(ConfigError, match="move_horizon must be >= 1, got 0"):
        ControllerConfig(move_horizon=0)
    with pytest.raises(ConfigError, match="move_cost_s must be >= 0 and finite, got -1"):
        ControllerConfig(move_cost_s=-1)


def test_outer_loop_hooks_decide_q_of_a_split_without_name_checks() -> None:
    """A variant overrides `split_q` / `q_after_move` instead of the base checking its name: the paper's variant
    keeps q through a move, the predictive one takes the split's best q, and a subclass's hook is what runs."""
    s = ControlState(q=1, m=6, history=(history(),), tail_history=(history()[:2],))
    paper, predictive = make("tailsieve-paper", q0=1, m0=6, m_gain=0.0), make("tailsieve", q0=1, m0=6, m_gain=0.0)
    pred = predictive.predictor(s)
    assert paper.split_q(s, pred, 5) == (1, paper._calibrated(s, pred, 1, 5))
    assert predictive.split_q(s, pred, 5) == predictive.best_q(s, pred, 5)
    assert paper.q_after_move(s, pred, 5, 4) == 1 and predictive.q_after_move(s, pred, 5, 4) == 4
    assert predictive.q_after_move(s, pred, 5, None) == predictive.best_q(s, pred, 5)[0]

    seen: list[int] = []

    class Pinned(type(predictive)):  # type: ignore[misc]
        """Every candidate split runs q = 3."""

        def split_q(self, state: ControlState, pred: Predictor, m: int) -> tuple[int, float]:
            seen.append(m)
            return 3, self._calibrated(state, pred, 3, m)

        def q_after_move(self, state: ControlState, pred: Predictor, new_m: int, best: int | None) -> int:
            return 3

    pinned = Pinned(predictive.router, CURVE, ControllerConfig(q0=1, m0=6, m_gain=0.0))
    out = pinned.outer(s, pred)
    # `tailsieve` scores every split of the range (R = 8: m = 1..7), not only C.2's radius
    assert sorted(seen) == [1, 2, 3, 4, 5, 7] and out.q == 3 and out.m in (5, 7)  # the predictive q would be 2


def test_outer_does_not_reverse_a_move_before_min_dwell() -> None:
    """A move of m is not undone until min_dwell steps after it: the new split's calibration has too few steps."""
    c = make("tailsieve", q0=1, m0=3, m_gain=0.0, min_dwell=3)
    cost = {1: 9.0, 2: 5.0, 3: 10.0, 4: 10.0, 5: 10.0}

    def forecast(q: int, m: int) -> float:
        return 20.0 if m == 0 else cost.get(m, 30.0)

    f = fixed_forecast("tailsieve", c, forecast)
    s = ControlState(q=1, m=3, dwell=0, history=(history(),))
    pred = f.predictor(s)
    just_grew = replace(s, move_dir=1, since_move=1)  # m went 2 -> 3 one step ago: m = 2 is a reversal
    assert f.outer(just_grew, pred).m == 3
    assert f.outer(replace(just_grew, since_move=3), pred).m == 2
    assert f.outer(replace(s, move_dir=-1, since_move=1), pred).m == 2  # same direction: allowed at once

    lit = fixed_forecast("tailsieve-paper", c, forecast)
    assert lit.outer(just_grew, pred).m == 2  # the literal C.2 has no reversal guard


def test_leaving_uniform_goes_straight_to_the_best_split() -> None:
    """Between splits m moves one replica per decision; from the uniform boundary it goes to the best split in the
    radius at once (the next step is a warm-up on all replicas whatever m is)."""
    c = make("tailsieve", q0=1, m0=0, m_gain=0.0)
    cost = {0: 20.0, 1: 12.0, 2: 8.0}

    def forecast(q: int, m: int) -> float:
        return cost.get(m, 30.0)

    f = fixed_forecast("tailsieve", c, forecast)
    s = ControlState(q=0, m=0, history=(history(),))
    assert f.outer(s, f.predictor(s)).m == 2

    lit = fixed_forecast("tailsieve-paper", c, forecast)
    assert lit.outer(s, lit.predictor(s)).m == 1  # the paper's C.2: one replica per move, from uniform too
    between = replace(s, q=1, m=4, dwell=0)
    cost.update({4: 20.0, 3: 15.0})
    assert f.outer(between, f.predictor(between)).m == 3  # one replica toward m = 2


def test_reversal_dwell_doubles_with_each_reversal_in_a_row() -> None:
    """A → B → A → …: every reversal in a row doubles the steps the next one must wait (the split is chasing its
    calibration's noise); a move in the same direction as the last resets the count."""
    c = make("tailsieve", q0=1, m0=3, m_gain=0.0, min_dwell=3)
    cost = {1: 9.0, 2: 5.0, 3: 10.0, 4: 10.0, 5: 10.0}

    f = fixed_forecast("tailsieve", c, lambda q, m: 20.0 if m == 0 else cost.get(m, 30.0))
    s = ControlState(q=1, m=3, dwell=0, history=(history(),), move_dir=1)
    pred = f.predictor(s)
    assert [f.reversal_dwell(replace(s, reversals=k)) for k in range(4)] == [3, 6, 12, 24]
    assert f.outer(replace(s, since_move=3), pred).reversals == 1  # first reversal: after min_dwell
    once = replace(s, reversals=1)
    assert f.outer(replace(once, since_move=5), pred).m == 3  # second reversal waits 6 steps
    moved = f.outer(replace(once, since_move=6), pred)
    assert (moved.m, moved.move_dir, moved.reversals) == (2, -1, 2)
    same = f.outer(replace(once, move_dir=-1, since_move=0), pred)  # same direction: at once, count reset
    assert (same.m, same.reversals) == (2, 0)


def test_returning_to_uniform_goes_straight_there() -> None:
    """When the uniform boundary is the best option, `tailsieve` goes there at once (the candidates rejoin the
    queue; an intermediate split would cost steps at a worse m and could pass for a reversal); the literal C.2
    moves one replica."""
    c = make("tailsieve", q0=1, m0=3, m_gain=0.0, min_dwell=3)
    cost = {0: 5.0, 1: 12.0, 2: 11.0, 3: 10.0, 4: 10.0, 5: 10.0}

    f = fixed_forecast("tailsieve", c, lambda q, m: cost.get(m, 30.0))
    s = ControlState(q=2, m=3, dwell=3, history=(history(),), move_dir=1, reversals=2)
    out = f.outer(s, f.predictor(s))
    assert (out.m, out.q, out.move_dir, out.reversals) == (0, 0, 0, 0)

    lit = fixed_forecast("tailsieve-paper", c, lambda q, m: cost.get(m, 30.0))
    assert lit.outer(s, lit.predictor(s)).m == 2


def test_the_outer_loop_scans_the_whole_range_of_m_on_any_fleet() -> None:
    """`tailsieve` scores every split up to 16 replicas and a 12-point grid plus C.2's radius beyond; the literal
    `tailsieve-paper` only the radius. Moves between splits shift at most R/16 replicas (1 on small fleets)."""
    small, paper = make("tailsieve", r=8), make("tailsieve-paper", r=8)
    assert small.m_candidates(3) == [1, 2, 4, 5, 6, 7] and paper.m_candidates(3) == [1, 2, 4, 5]
    big = make("tailsieve", n=512, r=64)
    got = big.m_candidates(30)
    assert {1, 63, 28, 29, 31, 32} <= set(got) and 30 not in got and len(got) <= 12 + 4
    assert small.m_step() == 1 and big.m_step() == 4 and make("tailsieve-paper", n=512, r=64).m_step() == 1
    # on a scanned grid (R > 17) a far target is approached by halving the distance, never finer than R/16
    assert [big.m_step(d) for d in (1, 6, 9, 40, 63)] == [4, 4, 4, 20, 31]
    assert [small.m_step(d) for d in (1, 4, 7)] == [1, 1, 1]
    assert make("tailsieve-paper", n=512, r=64).m_step(40) == 1


def test_leaving_uniform_on_a_large_fleet_reaches_a_split_far_beyond_the_radius() -> None:
    """From (0, 0) the best split of a large fleet (here m = 24 of 64) is found and reached in one decision."""
    c = make("tailsieve", n=512, r=64, m0=0, m_gain=0.0)
    f = fixed_forecast("tailsieve", c, lambda q, m: 100.0 if m == 0 else 60.0 + abs(m - 24))
    s = ControlState(q=0, m=0, history=(history(n=512),))
    out = f.outer(s, f.predictor(s))
    assert out.m in {m for m in c.m_candidates(0) if abs(m - 24) <= 3}


def test_a_return_to_uniform_is_not_reversed_before_min_dwell() -> None:
    c = make("tailsieve", m0=0, m_gain=0.0, min_dwell=3, leave_confirm=1)  # one rule at a time: no confirmation
    f = fixed_forecast("tailsieve", c, lambda q, m: 20.0 if m == 0 else 10.0)
    s = ControlState(q=0, m=0, history=(history(),), returns=1, dwell=1)
    assert f.outer(s, f.predictor(s)).m == 0  # one uniform step after the return
    assert f.outer(replace(s, dwell=3), f.predictor(s)).m > 0
    assert f.outer(replace(s, returns=0, dwell=0), f.predictor(s)).m > 0  # the start leaves at once


def test_after_a_return_a_leave_must_pass_the_test_on_consecutive_decisions() -> None:
    """`leave_confirm`: before any return the first passing decision leaves; after one, the leave test must pass
    `leave_confirm` decisions in a row, and a decision that fails it (or finds uniform best) starts the count over."""
    c = make("tailsieve", m0=0, m_gain=0.0, min_dwell=3, leave_confirm=3)
    gains = {"pays": 10.0, "no": 30.0, "noise": 19.99}  # a split slower; one faster by less than the gate
    now = ["pays"]
    f = fixed_forecast("tailsieve", c, lambda q, m: 20.0 if m == 0 else gains[now[0]])
    s = ControlState(q=0, m=0, history=(history(),), returns=1, dwell=5)
    pred = f.predictor(s)
    first = f.outer(s, pred)
    assert (first.m, first.leave_streak) == (0, 1) and "passed the leave test 1 time(s) in a row" in first.note
    second = f.outer(first, pred)
    assert (second.m, second.leave_streak) == (0, 2)
    now[0] = "no"  # a decision that fails the test starts the count over
    reset = f.outer(second, pred)
    assert (reset.m, reset.leave_streak) == (0, 0) and reset.note == \
        "leave not confirmed (2 pass(es) in a row); stay uniform: no split forecasts faster"
    now[0] = "pays"
    again = f.outer(reset, pred)
    now[0] = "noise"  # the leave test fails within the forecasts' noise: the count starts over too
    assert f.outer(again, pred).leave_streak == 0 and f.outer(again, pred).m == 0
    now[0] = "pays"
    walk = [reset := f.outer(reset, pred) for _ in range(3)]
    assert [w.m > 0 for w in walk] == [False, False, True]  # three passes in a row leave
    assert walk[-1].leave_streak == 0 and walk[-1].returns == 1
    assert f.outer(replace(s, returns=0), pred).m > 0  # no return yet: the first pass leaves
    once = make("tailsieve", m0=0, m_gain=0.0, leave_confirm=1)
    one = fixed_forecast("tailsieve", once, lambda q, m: 20.0 if m == 0 else 10.0)
    assert one.outer(s, pred).m > 0  # leave_confirm 1: every leave on one pass


def test_a_refused_leave_says_what_the_split_forecast_and_the_gate_it_missed() -> None:
    """At uniform, a split forecast faster by less than the leave gate is refused with a note naming the split, its
    forecast gain and the gate; a refusal by `leave_confirm` names both."""
    c = make("tailsieve", m0=0, m_gain=0.1, leave_confirm=2)
    f = fixed_forecast("tailsieve", c, lambda q, m: 20.0 if m == 0 else 19.0)  # 5% faster, a 10% gate at least
    s = ControlState(q=0, m=0, history=(history(),), returns=1, dwell=5)
    pred = f.predictor(s)
    out = f.outer(s, pred)
    gate = f.leave_gain(s, pred, 1, 1)
    assert out.m == 0 and gate >= 0.1
    assert out.note.startswith("stay uniform: (") and out.note.endswith(f"forecasts +5.0%, within the {gate:.1%} gate")
    streak = f.outer(replace(s, leave_streak=1), pred)
    assert streak.note.startswith("leave not confirmed (1 pass(es) in a row); stay uniform: (")
    slower = fixed_forecast("tailsieve", c, lambda q, m: 20.0 if m == 0 else 21.0)
    assert slower.outer(s, pred).note == "stay uniform: no split forecasts faster"
    c3 = make("tailsieve", m0=0, min_dwell=3)
    settling = replace(s, dwell=1)
    assert fixed_forecast("tailsieve", c3, lambda q, m: 20.0 if m == 0 else 10.0).outer(settling, pred).note == \
        "stay uniform: 1 of 3 steps since the return"


def test_a_note_lasts_one_decision() -> None:
    """`update` starts each decision without a note: a decision that keeps (q, m) for want of a reason to move
    does not repeat the last move's note (the per-step trace said "hold" or "m 0->5" for many steps)."""
    c = make("tailsieve", q0=1, m0=0)
    s = replace(c.initial(), note="m 0->5", history=(history(),))
    out = c.update(s, obs(q=0, m=0, tail_s=0.0, bulk_s=10.0, warmup=True))
    assert (out.q, out.m) == (0, 0) and out.note == ""


def test_the_literal_paper_controller_leaves_on_one_pass_whatever_leave_confirm() -> None:
    c = make("tailsieve-paper", m0=0, m_gain=0.0, min_dwell=0, leave_confirm=4)
    f = fixed_forecast("tailsieve-paper", c, lambda q, m: 20.0 if m == 0 else 10.0)
    s = ControlState(q=0, m=0, history=(history(),), returns=2, dwell=5)
    assert f.outer(s, f.predictor(s)).m > 0


def test_leave_confirm_below_one_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"^leave_confirm must be >= 1, got 0$"):
        ControllerConfig(leave_confirm=0)


def test_the_fastest_feasible_split_is_chosen_and_feasibility_is_asked_only_until_one_passes() -> None:
    """From a split, C.2's feasibility filters the candidates: the choice is the fastest feasible option, and the
    bisection behind `feasible` runs only for splits at least as fast as it (not for every candidate)."""
    c = make("tailsieve", q0=1, m0=3, m_gain=0.0, min_dwell=0)
    cost = {0: 40.0, 1: 9.0, 2: 8.0, 3: 20.0, 4: 10.0, 5: 11.0, 6: 12.0, 7: 13.0}
    asked: list[int] = []

    class Picky(type(fixed_forecast("tailsieve", c, lambda q, m: cost[m]))):  # type: ignore[misc]
        def feasible(self, state: object, pred: object, q: int, m: int, mc: int, deadline: float) -> bool:
            asked.append(mc)
            return mc not in (1, 2)  # the two fastest splits cannot absorb what the losing pool drops

    p = Picky(c.router, c.curve, c.config)
    s = ControlState(q=2, m=3, dwell=5, since_move=5, history=(history(),))
    out = p.outer(s, p.predictor(s))
    assert out.m == 4  # the fastest feasible split (10 s), one replica away
    assert asked == [2, 1, 4]  # in forecast order, stopping at the first that passes


def test_the_outer_loop_is_asked_while_q_climbs_and_a_move_of_m_wins() -> None:
    """From a start far from the optimum (q0 = 1 at m0 = R/2) the inner loop would climb q in bounded steps; when
    the split loses to uniform even at the q it is heading to, `tailsieve` returns at once instead of serving every
    step of the climb. Where the split at that q beats every other option, q moves first (C.1 before C.2), and the
    literal `tailsieve-paper` keeps C.1 before C.2."""
    c = make("tailsieve", q0=1, m0=4, m_gain=0.0, min_dwell=1)
    step = obs(q=1, m=4, tail_s=10.0, bulk_s=10.0)

    def start(ctrl: object) -> ControlState:
        return replace(ctrl.initial(), dwell=3, history=(history(),))  # type: ignore[attr-defined]

    loses = fixed_forecast("tailsieve", c, lambda q, m: 5.0 if m == 0 else 30.0 - q)
    out = loses.update(start(loses), step)
    assert (out.q, out.m, out.note) == (0, 0, "m 4->0")

    pays = fixed_forecast("tailsieve", c, lambda q, m: 50.0 if m == 0 else 30.0 - q if m == 4 else 60.0)
    out = pays.update(start(pays), step)
    assert out.m == 4 and out.q > 1 and out.note == f"q 1->{out.q}"

    hierarchy = fixed_forecast("tailsieve", c, lambda q, m: 5.0 if m == 0 else 30.0 - q)
    type(hierarchy).outer_early = False  # the rule off (a local subclass): the same decision climbs q first
    out = hierarchy.update(start(hierarchy), step)
    assert out.m == 4 and out.note == f"q 1->{out.q}"
    assert not CONTROLLERS["tailsieve-paper"].outer_early and CONTROLLERS["tailsieve"].outer_early
