"""Controller rules (§3.2, C.1, C.2): one test per rule, on small deterministic histories."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from conftest import fixed_forecast, make_curve
from tailsieve.errors import ConfigError
from tailsieve.model.makespan import finish_times
from tailsieve.policy.controller import CONTROLLERS, ControllerConfig, ControlState, StepObservation
from tailsieve.policy.predictor import Predictor, lane_finish_times
from tailsieve.policy.router import RouterConfig

CURVE = make_curve()


def history(*, n: int = 16, g: int = 4, seed: int = 0, tail: float = 8.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    base = rng.lognormal(6.0, 0.4, size=(n, 1)) * rng.lognormal(0, 0.2, size=(n, g))
    base[: max(1, n // 8)] *= tail  # a few long-tail groups
    return base.astype(np.int64)


def obs(*, q: int, m: int, tail_s: float, bulk_s: float, warmup: bool = False, n: int = 16, seed: int = 0
        ) -> StepObservation:
    return StepObservation(step=1, q=q, m=m, warmup=warmup, candidates=2, tail_s=tail_s, bulk_s=bulk_s,
                           consumed_lengths=history(n=n, seed=seed))


def make(name: str, *, n: int = 16, r: int = 8, rho: float = 0.25, **cfg: object):  # type: ignore[no-untyped-def]
    rc = RouterConfig(groups=n, group_size=4, replicas=r, rho=rho)
    return CONTROLLERS[name](rc, CURVE, ControllerConfig(**cfg))  # type: ignore[arg-type]


def test_lane_finish_times_match_closed_form() -> None:
    rng = np.random.default_rng(1)
    lengths = rng.integers(0, 50, 40).astype(np.float64)
    lanes = rng.integers(0, 3, 40).astype(np.int64)
    got = lane_finish_times(lengths, lanes, 3, CURVE)
    for lane in range(3):
        assert got[lanes == lane] == pytest.approx(finish_times(lengths[lanes == lane], CURVE))


def test_hold_one_step_after_increase_two_after_decrease() -> None:
    c = make("tailsieve-paper", q0=1, m0=2, q_gain=0.0, momentum=0.0)
    s = c.initial()
    # tail far faster than bulk: q* > q, so q increases and holds one step
    s1 = c.update(s, obs(q=1, m=2, tail_s=10.0, bulk_s=100.0))
    assert s1.q > 1 and s1.hold == 1
    s2 = c.update(s1, obs(q=s1.q, m=2, tail_s=500.0, bulk_s=10.0))
    assert s2.q == s1.q and s2.hold == 0  # held, even though the tail is now slower
    s3 = c.update(s2, obs(q=s1.q, m=2, tail_s=500.0, bulk_s=10.0))
    assert s3.q < s1.q and s3.hold == 2  # decrease, then two held steps
    s4 = c.update(s3, obs(q=s3.q, m=2, tail_s=1.0, bulk_s=100.0))
    s5 = c.update(s4, obs(q=s3.q, m=2, tail_s=1.0, bulk_s=100.0))
    assert s4.q == s5.q == s3.q
    assert c.update(s5, obs(q=s3.q, m=2, tail_s=1.0, bulk_s=100.0)).q > s3.q


def test_q_step_is_bounded_and_capped_by_candidates() -> None:
    c = make("tailsieve-paper", q0=1, m0=2, q_gain=0.0, momentum=0.0, max_q_step=2)
    s = c.update(c.initial(), obs(q=1, m=2, tail_s=1.0, bulk_s=1000.0))
    assert s.q == 3  # q* ≈ N, but the step is bounded by 2
    assert c.q_limit() == RouterConfig(groups=16, rho=0.25).extra == 4
    for _ in range(6):
        s = replace(s, hold=0)
        s = c.update(s, obs(q=s.q, m=2, tail_s=1.0, bulk_s=1000.0))
    assert s.q == 4  # never more than the E candidates a step produces


def test_gain_threshold_blocks_small_moves() -> None:
    c = make("tailsieve-paper", q0=2, m0=2, q_gain=0.5, momentum=0.0)
    s = c.update(c.initial(), obs(q=2, m=2, tail_s=10.0, bulk_s=12.0))
    assert s.q == 2


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


def test_predictor_uniform_equals_closed_form() -> None:
    h = np.full((4, 2), 10, dtype=np.int64)
    p = Predictor(h, groups=4, extra=1, replicas=2, curve=CURVE, resamples=2)
    # 8 requests of 10 tokens over 2 replicas by request: 4 per replica
    assert p.makespan(0, 0) == pytest.approx(10 * CURVE.tpot_s(4))


def test_static_and_config_validation() -> None:
    c = make("static")
    assert (c.initial().q, c.initial().m) == (2, 2)
    with pytest.raises(ConfigError, match="ema must lie in"):
        ControllerConfig(ema=1.5)
    with pytest.raises(ConfigError, match="q0 must be >= 0"):
        ControllerConfig(q0=-1)


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


@pytest.mark.parametrize("kv_ms_per_1k", [0.0, 0.04, 1.5])
def test_lane_finish_times_with_kv_traffic_equal_the_replica_event_loop(kv_ms_per_1k: float) -> None:
    """The predictor's KV-traffic term is the replica's (no prompts): every lane equals `run_replica` exactly."""
    from tailsieve.simulation.replica import ReplicaConfig, run_replica

    rng = np.random.default_rng(3)
    lengths = rng.integers(0, 300, 60).astype(np.float64)
    lanes = rng.integers(0, 4, 60).astype(np.int64)
    got = lane_finish_times(lengths, lanes, 4, CURVE, kv_ms_per_1k / 1e6)
    cfg = ReplicaConfig(kv_ms_per_1k_tokens=kv_ms_per_1k)
    for lane in range(4):
        want = run_replica(lengths[lanes == lane].astype(np.int64), CURVE, cfg).finish_s
        assert got[lanes == lane] == pytest.approx(want, rel=1e-12, abs=1e-12)
    c = make("tailsieve")
    s = ControlState(q=1, m=1, history=(history(),), tail_history=(history()[:2],))
    kv = CONTROLLERS["tailsieve"](c.router, CURVE, kv_s_per_token=kv_ms_per_1k / 1e6)
    slower = kv.predictor(s).makespan(1, 1) >= c.predictor(s).makespan(1, 1)
    assert slower and (kv.predictor(s).makespan(1, 1) > c.predictor(s).makespan(1, 1)) == (kv_ms_per_1k > 0)


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


def test_pinned_candidates_cannot_be_cut_in_the_bulk_forecast() -> None:
    """Redraw limit 1: the E − q non-isolated candidates run pinned in the bulk pool, so T_bulk is the later of their
    last completion and the (N − E)-th fresh completion; without pinning it is the (N − q)-th of all."""
    h = history(n=16, g=4)
    kw = {"groups": 16, "extra": 4, "replicas": 4, "curve": CURVE, "resamples": 3}
    free, pin = Predictor(h, **kw), Predictor(h, pinned_candidates=True, **kw)  # type: ignore[arg-type]
    for q in (1, 2, 3):
        raw = pin._bulk_raw(q, 1)  # candidates q..E−1 first, then the 16 fresh groups
        pins = 4 - q
        expect = np.maximum(raw[:, :pins].max(axis=1), np.sort(raw[:, pins:], axis=1)[:, 16 - 4 - 1])
        np.testing.assert_allclose(pin.bulk_times(q, 1), expect)
        assert np.all(pin.bulk_times(q, 1) >= free.bulk_times(q, 1))
    # every candidate isolated (q = E): nothing pinned in the bulk, the two models agree; uniform is unaffected
    np.testing.assert_allclose(pin.bulk_times(4, 1), free.bulk_times(4, 1))
    assert pin.makespan(0, 0) == free.makespan(0, 0)
    assert make("tailsieve").predictor(ControlState(q=1, m=1, history=(h,))).pinned  # max_redraws 1 (default)
    rc = RouterConfig(groups=16, group_size=4, replicas=8, rho=0.25, max_redraws=2)
    assert not CONTROLLERS["tailsieve"](rc, CURVE).predictor(ControlState(q=1, m=1, history=(h,))).pinned


def test_uniform_boundary_has_its_own_calibration() -> None:
    """A uniform step calibrates the uniform forecast only (its first ratio seeds it); a two-pool step the pools
    only; T̂(0, 0) uses the uniform factor once one was measured (the bulk factor before)."""
    c = make("tailsieve", q0=1, m0=0, m_gain=1.0)
    s0 = c.initial()
    assert np.isnan(s0.calib_uniform)
    pred = c.predictor(replace(s0, history=(history(),)))
    truth = float(np.mean(pred.bulk_times(0, 0)))
    s1 = c._calibrate(replace(s0, history=(history(),)), pred, obs(q=0, m=0, tail_s=0.0, bulk_s=1.5 * truth))
    assert s1.calib_uniform == pytest.approx(1.5) and s1.calib_bulk == 1.0
    assert c._calibrated(s1, pred, 0, 0) == pytest.approx(1.5 * truth)
    fb = float(np.mean(pred.bulk_times(2, 2)))
    ft = float(np.mean(pred.tail_times(2, 2)))
    s2 = c._calibrate(s1, pred, obs(q=2, m=2, tail_s=ft, bulk_s=0.5 * fb))
    assert s2.calib_uniform == pytest.approx(1.5) and s2.calib_bulk == pytest.approx(0.85)


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


def test_candidates_are_bootstrapped_by_selector_rank_from_whole_steps() -> None:
    """With two or more steps whose E candidates were all seen regenerated (the isolated ones and, at redraw limit 1,
    the ones run pinned in the bulk pool), candidate r of every pool is rank r of a random such step: the selector's
    real skill, neither a perfect ranking (which put the longest draws in the tail and the shortest among the pinned)
    nor none."""
    h = history(n=16, g=4)
    kw = {"groups": 16, "extra": 3, "replicas": 4, "curve": CURVE, "resamples": 6}
    steps = tuple(np.array([[900 + i] * 4, [100 + i] * 4, [500 + i] * 4], dtype=np.int64) for i in range(3))
    p = Predictor(h, candidate_steps=steps, **kw)  # type: ignore[arg-type]
    assert p.cand.shape == (6, 3, 4)
    for r, base in enumerate((900, 100, 500)):  # rank order kept, even where rank 1 is shorter than rank 2
        assert set(np.unique(p.cand[:, r])) <= {base, base + 1, base + 2}
    one = Predictor(h, candidate_steps=steps[:1], candidates=np.concatenate(steps[:1]), **kw)  # type: ignore[arg-type]
    assert np.all(np.diff(one.cand.max(axis=2), axis=1) <= 0)  # too few whole steps: the sorted draws as before
    partial = tuple(s[:2] for s in steps)  # only q = 2 of E = 3 seen (a higher redraw limit): as before
    assert np.all(np.diff(Predictor(h, candidate_steps=partial, candidates=np.concatenate(partial),  # type: ignore[arg-type]
                                    **kw).cand.max(axis=2), axis=1) <= 0)


def test_pinned_candidates_join_the_tail_history() -> None:
    """The consumed groups right after the q tail groups that ran pinned (`StepObservation.pinned`) are regenerated
    candidates too: the tail history keeps all q + pinned of them, in the selector's order."""
    c = make("tailsieve")
    o = replace(obs(q=1, m=2, tail_s=1.0, bulk_s=1.0), pinned=2)
    s = c._with_history(ControlState(q=1, m=2), o)
    np.testing.assert_array_equal(s.tail_history[-1], o.consumed_lengths[:3])
    s = c._with_history(ControlState(q=1, m=2), replace(o, pinned=0))
    np.testing.assert_array_equal(s.tail_history[-1], o.consumed_lengths[:1])


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


def test_the_q_gain_test_prices_the_target_not_the_bounded_step() -> None:
    """T̂(q) flat up to q = E, better at E: every bounded step alone gains nothing, the target gains 50%.
    `tailsieve-fixed` walks there in steps of at most max(2, E/4); the literal rule tests the step and stays."""
    c = make("tailsieve-fixed", n=64, r=8, rho=0.5, q0=1)  # E = 32
    cost = lambda q, m: 5.0 if q == 32 else 10.0  # noqa: E731
    f = fixed_forecast("tailsieve-fixed", c, cost)
    lit = fixed_forecast("tailsieve-paper", c, cost)
    assert f.q_step() == 8 and lit.q_step() == 2
    s = ControlState(q=1, m=4)
    qs = [1]
    for _ in range(12):
        s, moved = f._move_q(replace(s, hold=0), 32.0, lambda q: cost(q, 4))
        qs.append(s.q)
    assert qs[-1] == 32 and max(np.diff(qs)) <= 8
    held, moved = lit._move_q(ControlState(q=1, m=4), 32.0, lambda q: cost(q, 4))
    assert held.q == 1 and not moved


def test_uniform_steps_refresh_the_candidate_history() -> None:
    """A uniform step regenerates no candidate; its batch stands in (split half: ranked on half of each group's
    members, regenerated as the other half), so one heavy two-pool step is diluted as uniform steps go by."""
    c = make("tailsieve", n=16, r=4, rho=0.25)  # E = 4
    batch = history(n=16)
    pseudo = c.uniform_candidates(batch)
    assert pseudo.shape == (4, 4)
    top = np.argsort(-batch[:, :2].max(axis=1), kind="stable")[:4]
    assert pseudo.tolist() == np.concatenate([batch[top, 2:]] * 2, axis=1).tolist()
    heavy = np.full((4, 4), 16384, dtype=np.int64)
    s = ControlState(q=0, m=0, history=(batch,), tail_history=(heavy, heavy))
    before = c._calibrated(s, c.predictor(s), 4, 1)
    for k in range(6):
        s = c._with_history(s, StepObservation(step=k, q=0, m=0, warmup=False, candidates=0, tail_s=0.0,
                                                bulk_s=1.0, consumed_lengths=history(n=16, seed=k + 1)))
    assert len(s.tail_history) == 8 and c._calibrated(s, c.predictor(s), 4, 1) < 0.85 * before  # 2 of 8 steps heavy


def test_a_return_to_uniform_is_not_reversed_before_min_dwell() -> None:
    c = make("tailsieve", m0=0, m_gain=0.0, min_dwell=3)
    f = fixed_forecast("tailsieve", c, lambda q, m: 20.0 if m == 0 else 10.0)
    s = ControlState(q=0, m=0, history=(history(),), returns=1, dwell=1)
    assert f.outer(s, f.predictor(s)).m == 0  # one uniform step after the return
    assert f.outer(replace(s, dwell=3), f.predictor(s)).m > 0
    assert f.outer(replace(s, returns=0, dwell=0), f.predictor(s)).m > 0  # the start leaves at once
