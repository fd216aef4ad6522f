"""`tailsieve-paper`'s outer loop (App. C.2, `policy/paper.py`): the splits within `m_radius` of m (the uniform
boundary among them) priced at the current q, the fastest taken when it gains more than `gain` and its cutoff is
feasible, one replica per move; and the order of the paper's loops in `update` (warm-up, C.1, the settle hold,
C.2). The inner loop (C.1) is in test_controller.py; helpers in controller_fixtures.py."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace
from typing import Any

import pytest

from conftest import fixed_forecast
from controller_fixtures import history, make, obs
from tailsieve.policy.decision import Decision, Reason
from tailsieve.policy.paper import PaperState

COST = {0: 30.0, 1: 25.0, 2: 20.0, 3: 15.0, 4: 12.0, 5: 5.0, 6: 1.0, 7: 1.0}  # T̂ by m; m = 5..7 outside the radius


def recording(cost: dict[int, float], **cfg: object) -> tuple[Any, list[tuple[int, int]]]:
    """`tailsieve-paper` on the forecast `cost[m]` (the same at every q), recording every (q, m) it prices."""
    priced: list[tuple[int, int]] = []

    def forecast(q: int, m: int) -> float:
        priced.append((q, m))
        return cost[m]

    return fixed_forecast("tailsieve-paper", make("tailsieve-paper", **cfg), forecast), priced


def test_c2_prices_the_radius_at_the_current_q_and_moves_one_replica() -> None:
    """From (3, 2) with radius 2: m = 0..4 are priced (the uniform boundary at q = 0, the splits at q = 3), not the
    far faster m = 5..7; the best, m = 4, is approached by one replica, and the move resets C.1 (a settle hold,
    no velocity, rates relearnt at the new split)."""
    c, priced = recording(COST, gain=0.0)
    s = PaperState(q=3, m=2, velocity=1.5, rate_tail=0.5, rate_bulk=2.0, history=(history(),))
    out = c.outer(s, c.predictor(s))
    assert sorted(set(priced)) == [(0, 0), (3, 1), (3, 2), (3, 3), (3, 4)]
    assert (out.q, out.m, out.hold, out.velocity) == (3, 3, 1, 0.0)
    assert math.isnan(out.rate_tail) and math.isnan(out.rate_bulk)
    assert out.decision == Decision(3, 3, Reason.MOVE_M, (3, 4), 8.0)
    priced.clear()
    wide, priced = recording(COST, gain=0.0, m_radius=4)
    assert wide.outer(s, wide.predictor(s)).decision == Decision(3, 3, Reason.MOVE_M, (3, 6), 19.0)
    assert {m for _, m in priced} == set(range(0, 7))  # m = 0..6: the radius is clipped to R − 1


def test_c2_leaves_and_returns_to_uniform_one_replica_at_a_time() -> None:
    """The uniform boundary is one more point in the radius: from m = 0 the best split (m = 2) is approached by one
    replica at q = max(q, 1); from m = 1 a faster uniform boundary is a return to (0, 0)."""
    c, _ = recording(COST, gain=0.0)
    s = PaperState(q=0, m=0, history=(history(),))
    out = c.outer(s, c.predictor(s))
    assert (out.q, out.m, out.decision) == (1, 1, Decision(1, 1, Reason.LEAVE, (1, 2), 10.0))
    back, _ = recording({**COST, 0: 5.0}, gain=0.0)
    s = PaperState(q=2, m=1, history=(history(),))
    out = back.outer(s, back.predictor(s))
    assert (out.q, out.m, out.decision) == (0, 0, Decision(0, 0, Reason.RETURN, (0, 0), 20.0))


def test_c2_needs_a_fractional_gain_above_the_threshold() -> None:
    """m = 3 forecast 5% faster than m = 2: a 6% threshold stays (naming the option and its gain), 4% moves; a
    radius where nothing is faster stays with no option."""
    cost = {0: 40.0, 1: 30.0, 2: 20.0, 3: 19.0, 4: 30.0}
    s = PaperState(q=2, m=2, history=(history(),))
    for gain, want in ((0.06, Decision(2, 2, Reason.STAY, (2, 3), 1.0)), (0.04, Decision(2, 3, Reason.MOVE_M,
                                                                                         (2, 3), 1.0))):
        c, _ = recording(cost, gain=gain)
        assert c.outer(s, c.predictor(s)).decision == want
    c, _ = recording({**cost, 3: 25.0}, gain=0.0)
    assert c.outer(s, c.predictor(s)).decision == Decision(2, 2, Reason.STAY)


def test_c2_refuses_an_infeasible_move_between_splits_only() -> None:
    """An infeasible best split is INFEASIBLE (option and gain named, nothing moves); the feasibility test is not
    asked for a move to or from the uniform boundary."""
    asked: list[int] = []

    class Never(type(recording(COST)[0])):  # type: ignore[misc]
        def feasible(self, state: object, pred: object, mc: int, deadline: float) -> bool:
            asked.append(mc)
            return False

    c = Never(make("tailsieve-paper").router, make("tailsieve-paper").curve, make("tailsieve-paper", gain=0.0).config)
    s = PaperState(q=3, m=2, history=(history(),))
    assert c.outer(s, c.predictor(s)).decision == Decision(3, 2, Reason.INFEASIBLE, (3, 4), 8.0) and asked == [4]
    asked.clear()
    assert c.outer(replace(s, q=0, m=0), c.predictor(s)).m == 1 and asked == []
    assert c.outer(replace(s, q=2, m=1), c.predictor(s)).decision.reason is Reason.INFEASIBLE  # m = 3 is best
    # the paper's rule prices no restart: a measured restart price of any size does not hold C.2 back
    ok, _ = recording(COST, gain=0.0)
    assert ok.outer(replace(s, move_cost_s=1e6), ok.predictor(s)).m == 3


def test_feasibility_rejects_transfers_the_gaining_pool_cannot_absorb() -> None:
    """C.2's rule on the real predictor, both directions, the deadline scaled by each pool's model error: growing
    the tail pool to m' is feasible when G_tail(m') ≥ D_bulk(m'), shrinking it when the bulk pool absorbs what the
    tail pool drops."""
    c = make("tailsieve-paper")  # N = 16, E = 4, R = 8
    n = 16
    s = PaperState(q=1, m=1, history=(history(),), tail_history=(history()[:2],))
    pred = c.predictor(s)
    assert c.feasible(s, pred, 2, 1e9)  # an unbounded deadline: nothing dropped
    assert not c.feasible(s, pred, 2, 0.0)  # no time at all: the bulk pool drops everything it must finish
    outcomes = {}
    for ct, cb in ((1.0, 1.0), (2.0, 0.5), (0.5, 2.0)):
        for (q, m, mc), f in itertools.product(((1, 1, 2), (1, 1, 3), (2, 3, 2), (2, 3, 1), (3, 2, 4), (4, 3, 1),
                                                (1, 6, 2)), (0.8, 1.0)):
            st = replace(s, q=q, m=m, calib_tail=ct, calib_bulk=cb)
            deadline = f * pred.makespan(q, m, ct, cb)
            if mc > m:
                gained = max(0, pred.tail_capacity(deadline / ct, mc, min(n - 1, 4 * 4 + 4)) - q)
                dropped = max(0, (n - q) - pred.bulk_capacity(deadline / cb, q, mc))
            else:
                gained = max(0, pred.bulk_capacity(deadline / cb, q, mc) - (n - q))
                dropped = max(0, q - pred.tail_capacity(deadline / ct, mc, q))
            got = c.feasible(st, pred, mc, deadline)
            assert got == (gained >= dropped), (ct, cb, q, m, mc, f)
            outcomes[ct, q, m, mc, f] = got
    assert set(outcomes.values()) == {True, False}
    # four tail groups moving from three replicas to one at the forecast deadline: the calibration decides it (the
    # bulk pool twice as slow as modelled cannot absorb what the tail pool drops)
    assert outcomes[1.0, 4, 3, 1, 1.0] and outcomes[2.0, 4, 3, 1, 1.0] and not outcomes[0.5, 4, 3, 1, 1.0]


def test_update_runs_warmup_then_c1_then_the_hold_then_c2() -> None:
    """A warm-up step decides nothing; a settle hold counts down before C.2 is asked; a move of q by C.1 ends the
    decision; only a step where q holds reaches C.2 (here: m 2 → 3). With tail = bulk at q = 2 of N = 16,
    q* = 16·(2/t)/(2/t + 14/t) = 2: C.1 has nothing to do."""
    c, _ = recording({0: 40.0, 1: 30.0, 2: 20.0, 3: 10.0, 4: 30.0}, gain=0.0, momentum=0.0)
    s = replace(c.initial(), q=2, m=2, history=(history(),))
    warm = c.update(s, obs(q=2, m=2, tail_s=10.0, bulk_s=10.0, warmup=True))
    assert (warm.q, warm.m, warm.decision) == (2, 2, Decision(2, 2, Reason.WARMUP))
    held = c.update(replace(s, hold=2), obs(q=2, m=2, tail_s=10.0, bulk_s=10.0))
    assert (held.m, held.hold, held.decision) == (2, 1, Decision(2, 2, Reason.HOLD))
    q_moved = c.update(s, obs(q=2, m=2, tail_s=1.0, bulk_s=100.0))
    assert (q_moved.m, q_moved.hold) == (2, 1) and q_moved.q > 2
    assert q_moved.decision is not None and q_moved.decision.reason is Reason.MOVE_Q
    settled = c.update(s, obs(q=2, m=2, tail_s=10.0, bulk_s=10.0))
    assert (settled.q, settled.m, settled.decision) == (2, 3, Decision(2, 3, Reason.MOVE_M, (2, 3), 10.0))


@pytest.mark.parametrize("name", ["tailsieve-paper", "tailsieve"])
def test_the_initial_state_is_q0_at_m0(name: str) -> None:
    """(q0, m0); m0 None is R // 2; at m = 0 there is no isolation (q = 0); m0 is clipped to R − 1. `tailsieve`
    starts a split at q = E at the default (pinned) redraw limit, the only q its rule runs there."""
    e = make(name).q_limit()
    q3, q1 = (3, 1) if name == "tailsieve-paper" else (e, e)
    assert (make(name, q0=3, m0=2).initial().q, make(name, q0=3, m0=2).initial().m) == (q3, 2)
    assert make(name, q0=3, m0=None).initial().m == 4
    assert (make(name, q0=3, m0=0).initial().q, make(name, q0=3, m0=0).initial().m) == (0, 0)
    assert make(name, q0=0, m0=1).initial().q == q1 and make(name, m0=99).initial().m == 7
    assert make(name, m0=2).initial().decision == Decision(q1, 2, Reason.START)
