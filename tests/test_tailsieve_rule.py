"""`tailsieve`'s paired decision rule (`policy/tailsieve_rule.py`, issue 40) and `tailsieve-fixed`: every option is
priced on the same bootstrap pools, drawn by history step, and the controller moves to the option of largest
V = horizon·(ḡ − t·s) − C when V > 0 (t Student's quantile at Φ(z): wider for short histories). Exact numbers
against `paired_gain` / `value` and closed forms, on small deterministic histories (helpers: controller_fixtures.py).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from conftest import fixed_forecast, make_curve
from controller_fixtures import history, make, obs
from tailsieve.policy.calibration import factors
from tailsieve.policy.controller import ControllerConfig, ControlState
from tailsieve.policy.decision import Decision, Reason
from tailsieve.policy.paired import paired_gain, t_quantile, value
from tailsieve.policy.router import DEFAULT_REDRAWS

CURVE = make_curve()
SEARCHED = 2  # a redraw limit above 1: candidates left in the bulk pool are redrawn, so q is searched on `q_grid`


HIST = tuple(history(seed=k) for k in range(4))  # four history steps of 16 groups: K = 12 pools, 3 per step
K = 12


def pools(seed: int, scale: float) -> np.ndarray:
    return np.random.default_rng(seed).normal(0.0, scale, K)


SWING = pools(0, 5.0)  # each pool's lottery, shared by every option (common random numbers)
NOISE = pools(1, 1.0)  # what makes one option's advantage differ from step to step


def priced(gain: float, spread: float = 1.0) -> Any:
    """A forecast where the current split (2, 3) takes 20 s + the pool's lottery, (3, 4) that less `gain` ± `spread`
    per pool, and every other option 40 s + the lottery."""

    def cost(q: int, m: int) -> np.ndarray:
        if (q, m) == (2, 3):
            return 20.0 + SWING
        if (q, m) == (3, 4):
            return 20.0 + SWING - (gain + spread * NOISE)
        return 40.0 + SWING

    return cost


def brute(cur: np.ndarray, opt: np.ndarray, steps: int, cost: float, cfg: ControllerConfig) -> tuple[float, ...]:
    """(ḡ, s, V) by hand: the per-step means of the paired differences, their mean, standard error and the value."""
    d = cur - opt
    per = [float(np.mean(d[h::steps])) for h in range(steps)]
    g = sum(per) / steps
    se = math.sqrt(sum((x - g) ** 2 for x in per) / (steps - 1)) / math.sqrt(steps)
    return g, se, cfg.horizon * (g - t_quantile(cfg.z, steps - 1) * se) - cost


def z_at(ratio: float, dof: int) -> float:
    """The z whose Student margin t_quantile(z, dof) is `ratio` standard errors (bisection; t rises with z)."""
    lo, hi = 0.0, ratio
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_quantile(mid, dof) < ratio else (lo, mid)
    return (lo + hi) / 2


# ---- (a) a move happens exactly when V > 0 -------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["prior", "measured"])
def test_a_move_happens_exactly_when_its_value_is_positive(where: str) -> None:
    """(2, 3) → (3, 4) gains ḡ ± s per step over the four history steps and costs a restart (m changes): the move is
    taken when horizon·(ḡ − t·s) exceeds the restart seconds by 1%, refused as UNPAID when they exceed it by 1%; the
    decision carries the option, ḡ, s and the cost, equal to the brute-force values (z the config's). The
    option (3, 4) is m = 4 at its best q of the grid: a redraw limit of 2, where q is searched."""
    base = make("tailsieve", max_redraws=SEARCHED)
    f = fixed_forecast("tailsieve", base, priced(3.0))
    s = ControlState(q=2, m=3, history=HIST)
    pred = f.predictor(s)
    assert pred.fresh.shape[0] == K
    cur, opt = f.times(s, pred, 2, 3), f.times(s, pred, 3, 4)
    g, se, v0 = brute(cur, opt, 4, 0.0, base.config)
    assert (g, se) == pytest.approx(paired_gain(cur, opt, 4)[:2], rel=1e-12) and se > 0 and v0 > 0
    for factor, moves in ((0.99, True), (1.01, False)):
        price = v0 * factor
        if where == "prior":
            ctl, state = fixed_forecast("tailsieve", make("tailsieve", max_redraws=SEARCHED, move_cost_s=price),
                                        priced(3.0)), s
        else:
            ctl, state = f, replace(s, move_cost_s=price)
        out = ctl.decide(state, pred)
        assert out.decision is not None
        assert out.decision.option == (3, 4)
        assert (out.decision.gain_s, out.decision.se_s, out.decision.cost_s) == pytest.approx((g, se, price), rel=1e-9)
        if moves:
            assert (out.q, out.m, out.decision.reason) == (3, 4, Reason.MOVE_M) and out.decision.moved
        else:
            assert (out.q, out.m, out.decision.reason) == (2, 3, Reason.UNPAID) and not out.decision.moved
        assert type(out) is ControlState and not hasattr(out, "hold")  # no settle hold, no momentum: the paper's alone


def test_a_gain_within_its_noise_stays_and_says_so() -> None:
    """The same mean gain with a spread ten times larger: ḡ/s ≈ 3.15 (brute force), so at a margin t of four standard
    errors ḡ − t·s < 0 and no
    restart price is small enough (the prior here is 0): the decision is STAY (not UNPAID) and still names the
    option and its evidence. The margin is t·s exactly, t Student's quantile at Φ(z) with 3 degrees of freedom (four
    history steps): at the z whose t is ḡ/s, 1% above it the rule stays, 1% below it it moves (free), or is refused
    as UNPAID (beyond the noise, not the price) when the restart costs twice horizon·(ḡ − t·s). (q searched at a
    redraw limit of 2, as above.)"""

    def rule(z: float, price: float = 0.0) -> Any:
        return fixed_forecast("tailsieve", make("tailsieve", max_redraws=SEARCHED, z=z, move_cost_s=price),
                              priced(3.0, spread=10.0))

    s = ControlState(q=2, m=3, history=HIST)
    f = rule(z_at(4.0, 3))  # a margin of four standard errors
    pred = f.predictor(s)
    g, se, v = brute(f.times(s, pred, 2, 3), f.times(s, pred, 3, 4), 4, 0.0, f.config)
    assert g > 0 and 3.0 < g / se < 4.0 and v < 0  # within four standard errors, beyond three
    out = f.decide(s, pred)
    assert (out.q, out.m) == (2, 3)
    assert out.decision == Decision(2, 3, Reason.STAY, (3, 4), pytest.approx(g), pytest.approx(se))  # type: ignore[arg-type]
    ratio = g / se
    z_star = z_at(ratio, 3)
    assert t_quantile(z_star, 3) == pytest.approx(ratio, rel=1e-12) and z_star < ratio  # t widens z at 3 dof
    above = rule(z_star * 1.01)
    assert brute(above.times(s, pred, 2, 3), above.times(s, pred, 3, 4), 4, 0.0, above.config)[2] < 0
    stay = above.decide(s, above.predictor(s))
    assert (stay.q, stay.m, stay.decision.reason) == (2, 3, Reason.STAY)  # type: ignore[union-attr]
    below = rule(z_star * 0.99)
    v_below = brute(below.times(s, pred, 2, 3), below.times(s, pred, 3, 4), 4, 0.0, below.config)[2]
    margin = t_quantile(z_star * 0.99, 3) * se
    assert v_below == pytest.approx(below.config.horizon * (g - margin), rel=1e-9)
    assert 0 < v_below < below.config.horizon * 0.05 * g
    move = below.decide(s, below.predictor(s))
    assert (move.q, move.m, move.decision.reason) == (3, 4, Reason.MOVE_M)  # type: ignore[union-attr]
    pricey = rule(z_star * 0.99, price=2 * v_below)
    unpaid = pricey.decide(s, pricey.predictor(s))
    assert (unpaid.q, unpaid.m, unpaid.decision.reason) == (2, 3, Reason.UNPAID)  # type: ignore[union-attr]


def test_a_move_of_q_at_the_same_split_costs_nothing() -> None:
    """(2, 3) → (3, 3): no restart, so any gain beyond t·s moves q, even with a huge restart price (q searched: a
    redraw limit of 2; q = 3 lies inside 1..E = 4, an option only the search finds)."""
    def cost(q: int, m: int) -> np.ndarray:
        return 20.0 + SWING - (1.0 + 0.1 * NOISE if (q, m) == (3, 3) else 0.0) if m == 3 else 40.0 + SWING

    f = fixed_forecast("tailsieve", make("tailsieve", max_redraws=SEARCHED, move_cost_s=1e6), cost)
    s = ControlState(q=2, m=3, history=HIST)
    pred = f.predictor(s)
    g, se, v = brute(f.times(s, pred, 2, 3), f.times(s, pred, 3, 3), 4, 0.0, f.config)
    out = f.decide(s, pred)
    assert v > 0 and (out.q, out.m) == (3, 3)
    assert out.decision == Decision(3, 3, Reason.MOVE_Q, (3, 3), pytest.approx(g), pytest.approx(se), 0.0)  # type: ignore[arg-type]


def test_leaving_uniform_goes_straight_to_the_best_split_and_pays_a_restart() -> None:
    """From the uniform boundary every m of the grid is an option at its best q of the q grid: on a 64-replica
    fleet the best split (m = 24) is reached in one decision, not one replica at a time; the move costs the restart
    price. (E = 128 and a redraw limit of 2: q is priced on 8 points spread over 1..128, 37 the nearest to the
    forecast's optimum 40.)"""
    c = make("tailsieve", n=512, r=64, max_redraws=SEARCHED, move_cost_s=5.0)
    assert 24 in c.m_grid(0) and c.q_grid() == [1, 19, 37, 55, 74, 92, 110, 128]
    f = fixed_forecast("tailsieve", c, lambda q, m: 100.0 if m == 0 else 60.0 + abs(m - 24) + abs(q - 40) / 10)
    s = ControlState(q=0, m=0, history=(history(n=512, seed=1), history(n=512, seed=2)), calib_uniform=1.0,
                     calib_group=1.0)  # both placements measured: no probe first
    out = f.decide(s, f.predictor(s))
    # se = 0 (the same gain on every pool): V = 8·39.7 − 5
    assert out.decision == Decision(37, 24, Reason.LEAVE, (37, 24), pytest.approx(39.7), 0.0, 5.0)  # type: ignore[arg-type]
    assert out.decision.note == "leave uniform for (37, 24); (37, 24): +39.70 s/step ± 0.00, cost 5.0 s"


def test_the_options_are_every_m_at_its_best_q_and_both_placements() -> None:
    """R = 8: the uniform boundary dealt and grouped and m = 1..7, each at the q of least forecast (ties: the
    smaller q; a redraw limit of 2, where q is searched); the current option is not among them. On a large fleet, 12
    spread over the range and m ± 2^i."""
    c = make("tailsieve", r=8, max_redraws=SEARCHED)
    f = fixed_forecast("tailsieve", c, lambda q, m: 10.0 + abs(q - (m % 4 + 1)))
    s = ControlState(q=4, m=3, history=HIST, uniform_dispatch="group")
    opts = f.options(s, f.predictor(s))
    assert opts == [(0, 0, "request"), (0, 0, "group"), (2, 1, ""), (3, 2, ""), (1, 4, ""), (2, 5, ""), (3, 6, ""),
                    (4, 7, "")]  # (4, 3) is the current split
    at_uniform = f.options(replace(s, q=0, m=0), f.predictor(s))
    assert at_uniform[0] == (0, 0, "request") and (4, 3, "") in at_uniform and len(at_uniform) == 8
    assert make("tailsieve", r=17).m_grid(5) == list(range(1, 17))
    big = make("tailsieve", n=512, r=64)
    spread = set(np.linspace(1, 63, 12).round().astype(int).tolist())
    around = {30 + s * (1 << i) for i in range(8) for s in (-1, 1) if 1 <= 30 + s * (1 << i) <= 63}
    assert big.m_grid(30) == sorted(spread | around | {30}) and big.m_grid(0) == sorted(spread)


@pytest.mark.parametrize("name", ["tailsieve", "tailsieve-fixed"])
@pytest.mark.parametrize(("n", "r", "rho"), [(16, 8, 0.25), (512, 64, 0.25), (4, 4, 1.0)])  # q_limit 4, 128, N − 1
def test_at_the_default_redraw_limit_every_split_isolates_all_candidates(name: str, n: int, r: int, rho: float) -> None:
    """At the default redraw limit (1) a candidate left in the bulk pool would run pinned (`Predictor.pinned`): every
    split's option is q = `q_limit()` = min(E, N − 1), whatever the forecast says of q (rising, falling or least
    inside the range); the current split is not among the options. With the same forecast at a redraw limit of 2
    the q grid is searched: q is the argmin over `q_grid` (ties: the smaller q)."""
    c = make(name, n=n, r=r, rho=rho)
    qmax = c.q_limit()
    assert c.router.max_redraws == DEFAULT_REDRAWS == 1 and qmax == min(c.router.extra, n - 1)
    hist = tuple(history(n=n, seed=k) for k in range(2))
    for shape in (lambda q: float(q), lambda q: -float(q), lambda q: abs(q - 2.0)):
        def cost(q: int, m: int, shape: Any = shape) -> float:
            return 10.0 + m + float(shape(q))

        f = fixed_forecast(name, c, cost)
        searched = fixed_forecast(name, make(name, n=n, r=r, rho=rho, max_redraws=SEARCHED), cost)
        for q in (1, qmax):
            s = ControlState(q=q, m=r // 2, history=hist)
            pred = f.predictor(s)
            assert pred.pinned and not searched.predictor(s).pinned
            for mc in f.m_grid(s.m):
                assert f.best_q(s, pred, mc, around=q) == (qmax, cost(qmax, mc))
                best = min((cost(x, mc), x) for x in searched.q_grid(q))[1]
                assert searched.best_q(s, searched.predictor(s), mc, around=q) == (best, cost(best, mc))
            splits = [(qmax, mc, "") for mc in f.m_grid(s.m) if (qmax, mc) != (s.q, s.m)]
            assert f.options(s, pred) == [(0, 0, d) for d in f.placements()] + splits


def test_the_decision_is_the_brute_force_argmax_of_the_value() -> None:
    """On the real predictor (a heavy-tailed history, R = 4): every option priced by hand — both placements, each m
    at the q of least mean forecast over all q — with `paired_gain` and `value`, the restart price when m changes
    and the calibrated excess of the return step; the decision is the option of largest V, moved to when V > 0.
    (A redraw limit of 2, where q is searched; z the config's.)"""
    hist = tuple(history(seed=k, tail=12.0) for k in range(4))
    seen = set()
    for (q, m), price in (((1, 1), 0.0), ((1, 1), 3.0), ((1, 1), 60.0), ((0, 0), 0.0), ((3, 2), 1.0)):
        c = make("tailsieve", r=4, max_redraws=SEARCHED, move_cost_s=price)
        s = ControlState(q=q, m=m, history=hist, tail_history=tuple(h[:4] for h in hist), uniform_dispatch="request",
                         calib_uniform=1.0, calib_group=1.0)  # both placements measured: no probe
        pred = c.predictor(s)
        here = c.times(s, pred, q, m)
        best: tuple[float, int, int, str, Any] | None = None
        for mc, dispatch in ((0, "request"), (0, "group"), *((x, "") for x in range(1, 4))):
            qc = 0 if mc == 0 else min(range(1, c.q_limit() + 1), key=lambda x: float(np.mean(c.times(s, pred, x, mc))))
            if (qc, mc, dispatch) == ((0, 0, "request") if m == 0 else (q, m, "")):
                continue
            t = c.times(s, pred, qc, mc, dispatch or None)
            cost = price if mc != m else 0.0
            if mc == 0 and m > 0:
                excess = np.mean(pred.uniform_return_times(dispatch == "request")) - np.mean(
                    pred.uniform_times(dispatch == "request"))
                cost += max(0.0, float(excess)) * factors(s)[2]
            g, se, dof = paired_gain(here, t, 4)
            p = value(g, se, dof, cost, c.config.z, c.config.horizon)
            if best is None or p.value_s > best[0]:
                best = (p.value_s, qc, mc, dispatch, p)
        assert best is not None
        v, qc, mc, dispatch, p = best
        out = c.decide(s, pred)
        assert out.decision is not None and out.decision.option == (qc, mc), (q, m, price)
        assert (out.decision.gain_s, out.decision.se_s, out.decision.cost_s) == (p.gain_s, p.se_s, p.cost_s)
        if v > 0:
            assert (out.q, out.m) == (qc, mc) and out.decision.moved
        else:
            refusal = Reason.UNPAID if p.beyond_noise else Reason.STAY
            assert (out.q, out.m) == (q, m) and out.decision.reason is refusal
        seen.add(out.decision.reason)
    assert {Reason.MOVE_M, Reason.UNPAID, Reason.STAY} <= seen  # the cases cover a move, a refusal and a stay


# ---- feasibility of split → split moves ---------------------------------------------------------------------------


def test_the_best_feasible_split_is_taken_and_feasibility_is_asked_in_order_of_value() -> None:
    """C.2's feasibility filters moves between two splits, in order of value, at the current forecast as the
    deadline: the choice is the best feasible option; a move of q at the same m and the uniform boundary are not
    asked; when every positive move is infeasible the decision is INFEASIBLE, naming the best refused. (The forecast
    is the same for every q: at a redraw limit of 2, where q is searched, each split is at its smallest q, 1.)"""
    c = make("tailsieve", q0=1, m0=3, max_redraws=SEARCHED)
    cost = {0: 40.0, 1: 9.0, 2: 8.0, 3: 20.0, 4: 10.0, 5: 11.0, 6: 12.0, 7: 13.0}
    asked: list[tuple[int, float]] = []
    refuse = {1, 2}

    class Picky(type(fixed_forecast("tailsieve", c, lambda q, m: cost[m]))):  # type: ignore[misc]
        def feasible(self, state: object, pred: object, mc: int, deadline: float) -> bool:
            asked.append((mc, deadline))
            return mc not in refuse

    p = Picky(c.router, c.curve, c.config)
    s = ControlState(q=2, m=3, history=HIST)
    out = p.decide(s, p.predictor(s))
    assert out.decision == Decision(1, 4, Reason.MOVE_M, (1, 4), 10.0, 0.0, 0.0)  # the best feasible split
    assert asked == [(2, 20.0), (1, 20.0), (4, 20.0)]  # by value, stopping at the first that passes
    asked.clear()
    refuse = set(range(1, 8))
    cost[0] = 25.0  # uniform slower than the split: no feasible move pays
    out = p.decide(s, p.predictor(s))
    assert out.decision == Decision(2, 3, Reason.INFEASIBLE, (1, 2), 12.0, 0.0, 0.0)
    assert [mc for mc, _ in asked] == [2, 1, 4, 5, 6, 7]


# ---- (b) fewer than two history steps: nothing to compare on ------------------------------------------------------


def test_with_fewer_than_two_history_steps_the_rule_stays() -> None:
    """One history step gives no spread between steps (s unknown, V = −∞ for every option): STAY, no option, however
    much faster an option forecasts; the first steady step of a run is such a step."""
    c = make("tailsieve", m0=0)
    f = fixed_forecast("tailsieve", c, lambda q, m: 100.0 if m == 0 else 1.0)
    one = ControlState(q=0, m=0, history=HIST[:1])
    assert f.decide(one, f.predictor(one)).decision == Decision(0, 0, Reason.STAY)
    first = f.update(f.initial(), obs(q=0, m=0, tail_s=0.0, bulk_s=50.0))
    assert len(first.history) == 1 and (first.q, first.m, first.decision) == (0, 0, Decision(0, 0, Reason.STAY))
    second = f.update(first, obs(q=0, m=0, tail_s=0.0, bulk_s=50.0, seed=1))
    assert second.decision is not None and second.decision.reason is Reason.PROBE  # two steps: the rule acts
    assert second.uniform_dispatch == "group"  # (first the placement never run; `test_..._probed_once_...`)
    third = f.update(second, obs(q=0, m=0, tail_s=0.0, bulk_s=50.0, seed=2))
    assert third.decision is not None and third.decision.reason is Reason.LEAVE  # both measured: the move
    warm = f.update(f.initial(), obs(q=0, m=0, tail_s=0.0, bulk_s=50.0, warmup=True))
    assert warm.decision == Decision(0, 0, Reason.WARMUP)


# ---- the price of a pool move -------------------------------------------------------------------------------------


def test_the_move_cost_is_learnt_from_restarts() -> None:
    """An EMA (weight `ema`) of the restart seconds of the steps whose m changed and that restarted replicas, seeded
    by the first; until one is measured, the configured prior; `learn` remembers the executed m."""
    c = make("tailsieve", ema=0.5, move_cost_s=7.0)
    s = ControlState(q=1, m=1, last_m=0)
    assert math.isnan(s.move_cost_s) and c.move_cost(s) == 7.0
    s1 = c._learn_move_cost(s, replace(obs(q=1, m=1, tail_s=1, bulk_s=1), restart_s=10.0))
    assert (s1.move_cost_s, s1.last_m, c.move_cost(s1)) == (10.0, 1, 10.0)
    s2 = c._learn_move_cost(s1, replace(obs(q=1, m=1, tail_s=1, bulk_s=1), restart_s=99.0))  # m unchanged
    assert s2.move_cost_s == 10.0
    s3 = c._learn_move_cost(replace(s2, last_m=2), replace(obs(q=1, m=1, tail_s=1, bulk_s=1), restart_s=30.0))
    assert s3.move_cost_s == pytest.approx(20.0)
    s4 = c._learn_move_cost(replace(s3, last_m=3), obs(q=1, m=1, tail_s=1, bulk_s=1))  # a move that restarted nothing
    assert (s4.move_cost_s, s4.last_m) == (s3.move_cost_s, 1)
    learnt, _ = c.learn(replace(s, last_m=2), replace(obs(q=1, m=1, tail_s=1, bulk_s=1), restart_s=12.0))
    assert (learnt.move_cost_s, learnt.last_m) == (12.0, 1)


# ---- (e) decisions as data ----------------------------------------------------------------------------------------


def test_the_note_is_derived_from_the_decision() -> None:
    """`ControlState.note` is the decision's note, not a field: it cannot be set, and it is '' before any decision."""
    c = make("tailsieve", m0=0)
    s = c.initial()
    assert s.decision == Decision(0, 0, Reason.START) and s.note == "start"
    assert ControlState(q=0, m=0).note == ""
    with pytest.raises(TypeError):
        replace(s, note="m 0->5")  # type: ignore[call-arg]
    d = Decision(2, 3, Reason.UNPAID, (3, 4), 1.5, 0.25, 30.0)
    assert replace(s, decision=d).note == d.note == "unpaid; (3, 4): +1.50 s/step ± 0.25, cost 30.0 s"


@pytest.mark.parametrize("name", ["tailsieve", "tailsieve-paper", "tailsieve-fixed"])
def test_every_adaptive_step_carries_a_decision(name: str) -> None:
    """Driven step by step, every state an adaptive controller returns carries a Decision whose (q, m) is the state's
    and whose note is the state's note; a warm-up step's reason is WARMUP, a move's is one of the moves. These steps
    move `tailsieve` (q searched) and `tailsieve-paper`; `tailsieve-fixed` starts at (E, R/2) at the default redraw
    limit, its one option, and never moves."""
    c = make(name, r=4, m0=2, max_redraws=SEARCHED if name == "tailsieve" else DEFAULT_REDRAWS)
    s = c.initial()
    seen = []
    for k in range(6):
        step = obs(q=s.q, m=s.m, tail_s=5.0 + k, bulk_s=8.0 - k, warmup=k == 0, seed=k)
        s = c.update(s, step)
        assert s.decision is not None and (s.decision.q, s.decision.m) == (s.q, s.m)
        assert s.note == s.decision.note
        seen.append(s.decision.reason)
        if name == "tailsieve-fixed":
            assert (s.q, s.m) == (c.q_limit(), 2)
    assert seen[0] is Reason.WARMUP and Reason.WARMUP not in seen[1:]
    moves = [r for r in seen if Decision(0, 0, r).moved]
    if name == "tailsieve-fixed":
        assert moves == [] and c.options(s, c.predictor(s)) == []
    else:
        assert moves
