"""Controller rules (§3.2, C.1, C.2): one test per rule, on small deterministic histories."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from conftest import fixed_forecast
from controller_fixtures import CURVE, history, make, obs
from tailsieve.errors import ConfigError
from tailsieve.model.makespan import finish_times
from tailsieve.policy.calibration import factors
from tailsieve.policy.controller import CONTROLLERS, ControllerConfig, ControlState, StepObservation
from tailsieve.policy.lanes import lane_finish_times
from tailsieve.policy.predictor import Predictor
from tailsieve.policy.router import RouterConfig


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
    assert s1.calib_uniform == pytest.approx(1.5) and math.isnan(s1.calib_bulk)
    assert c._calibrated(s1, pred, 0, 0) == pytest.approx(1.5 * truth)
    assert factors(s1)[:2] == pytest.approx((1.5, 1.5))  # no split measured yet: the fleet's model error is 1.5
    fb = float(np.mean(pred.bulk_times(2, 2)))
    ft = float(np.mean(pred.tail_times(2, 2)))
    s2 = c._calibrate(s1, pred, obs(q=2, m=2, tail_s=ft, bulk_s=0.5 * fb))
    assert s2.calib_uniform == pytest.approx(1.5) and s2.calib_bulk == pytest.approx(0.5)  # the first ratio seeds it


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




@pytest.mark.parametrize("name", ["tailsieve", "tailsieve-fixed"])
def test_a_refused_q_move_keeps_the_damped_velocity(name: str) -> None:
    """C.1's damped momentum carries over a decision whose gain test refuses the move: T̂ falls by 0.01 s per group
    (E = 4), so from q = 1 the target is 4, v = 0.5·0 + 0.5·(4 − 1) = 1.5, the gain (0.3%) is below q_gain and q
    stays, with the velocity halved to 0.75 for the next decision."""
    c = make(name, q0=1, m0=4, min_dwell=99)
    f = fixed_forecast(name, c, lambda q, m: 10.0 - 0.01 * q if m == 4 else 50.0)
    s = replace(f.initial(), history=(history(),))
    out = f.update(s, obs(q=1, m=4, tail_s=10.0, bulk_s=10.0))
    assert (out.q, out.m) == (1, 4) and out.velocity == pytest.approx(0.75)
