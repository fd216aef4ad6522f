"""Controller rules (§3.2, C.1, C.2): one test per rule, on small deterministic histories."""

from __future__ import annotations

import math
from dataclasses import fields, replace

import numpy as np
import pytest

from controller_fixtures import CURVE, history, make, obs
from tailsieve.errors import ConfigError
from tailsieve.model.makespan import finish_times
from tailsieve.policy.calibration import factors
from tailsieve.policy.controller import CONTROLLERS, ControllerConfig, ControlState, StepObservation
from tailsieve.policy.decision import Decision, Reason
from tailsieve.policy.lanes import lane_finish_times
from tailsieve.policy.paper_config import PaperConfig
from tailsieve.policy.predictor import Predictor, PredictorFacts
from tailsieve.policy.router import RouterConfig


def test_lane_finish_times_match_closed_form() -> None:
    rng = np.random.default_rng(1)
    lengths = rng.integers(0, 50, 40).astype(np.float64)
    lanes = rng.integers(0, 3, 40).astype(np.int64)
    got = lane_finish_times(lengths, lanes, 3, CURVE)
    for lane in range(3):
        assert got[lanes == lane] == pytest.approx(finish_times(lengths[lanes == lane], CURVE))


def test_hold_one_step_after_increase_two_after_decrease() -> None:
    """`tailsieve-paper`'s C.1 with App. E's holds: q* = N·r_tail/(r_bulk + r_tail); the first step's rates seed the
    EMAs, so from q = 1 (tail 10 s, bulk 100 s) r_tail = 0.1, r_bulk = 0.15, q* = 6.4, the step is bounded at 2 and
    the predicted makespan falls from max(10, 100) to max(30, 13/0.15)."""
    c = make("tailsieve-paper", q0=1, m0=2, gain=0.0, momentum=0.0)
    s = c.initial()
    s1 = c.update(s, obs(q=1, m=2, tail_s=10.0, bulk_s=100.0))
    assert (s1.q, s1.hold, s1.rate_tail, s1.rate_bulk) == (3, 1, pytest.approx(0.1), pytest.approx(0.15))
    assert s1.decision == Decision(3, 2, Reason.MOVE_Q, (3, 2), pytest.approx(100 - 13 / 0.15))  # type: ignore[arg-type]
    s2 = c.update(s1, obs(q=s1.q, m=2, tail_s=500.0, bulk_s=10.0))
    assert (s2.q, s2.hold, s2.decision) == (s1.q, 0, Decision(3, 2, Reason.HOLD))  # held, though the tail is slower
    assert s2.rate_tail == s1.rate_tail  # a held step teaches C.1 nothing
    s3 = c.update(s2, obs(q=s1.q, m=2, tail_s=500.0, bulk_s=10.0))
    assert s3.q < s1.q and s3.hold == 2 and s3.decision is not None and s3.decision.reason is Reason.MOVE_Q
    s4 = c.update(s3, obs(q=s3.q, m=2, tail_s=1.0, bulk_s=100.0))
    s5 = c.update(s4, obs(q=s3.q, m=2, tail_s=1.0, bulk_s=100.0))
    assert s4.q == s5.q == s3.q and (s4.hold, s5.hold) == (1, 0)
    assert all(x.decision is not None and x.decision.reason is Reason.HOLD for x in (s4, s5))
    assert c.update(s5, obs(q=s3.q, m=2, tail_s=1.0, bulk_s=100.0)).q > s3.q


def test_q_step_is_bounded_and_capped_by_candidates() -> None:
    c = make("tailsieve-paper", q0=1, m0=2, gain=0.0, momentum=0.0, max_q_step=2)
    s = c.update(c.initial(), obs(q=1, m=2, tail_s=1.0, bulk_s=1000.0))
    assert s.q == 3  # q* ≈ N, but the step is bounded by 2
    assert c.q_limit() == RouterConfig(groups=16, rho=0.25).extra == 4
    for _ in range(6):
        s, _moved = c.inner(replace(s, hold=0), obs(q=s.q, m=2, tail_s=1.0, bulk_s=1000.0))
    assert s.q == 4  # never more than the E candidates a step produces


def test_gain_threshold_blocks_small_moves() -> None:
    """From q = 2 (tail 10 s, bulk 12 s): q* = 16·0.2/(14/12 + 0.2) ≈ 2.34 is within a group of q: no step. A cut
    that gains 50% is blocked by a threshold above its gain and taken below it."""
    c = make("tailsieve-paper", q0=2, m0=2, gain=0.5, momentum=0.0)
    s = c.update(c.initial(), obs(q=2, m=2, tail_s=10.0, bulk_s=12.0))
    assert s.q == 2
    # from q = 3: tail 30 s, bulk 13 s: r_tail = 0.1, r_bulk = 1, q* = 16/11 ≈ 1.45: down by 2 (bounded), the
    # makespan from max(30, 13) = 30 to max(10, 15) = 15, a 50% gain
    for gain, moves in ((0.51, False), (0.49, True)):
        ctl = make("tailsieve-paper", q0=3, m0=2, gain=gain, momentum=0.0)
        out, moved = ctl.inner(ctl.initial(), obs(q=3, m=2, tail_s=30.0, bulk_s=13.0))
        assert moved == moves and out.q == (1 if moves else 3)
        assert out.decision == (Decision(1, 2, Reason.MOVE_Q, (1, 2), 15.0) if moves else ctl.initial().decision)


def test_a_refused_q_move_keeps_the_damped_velocity() -> None:
    """`tailsieve-paper`'s damped momentum carries over a decision whose gain test refuses the move. From q = 1 with
    tail 2 s, bulk 10 s: r_tail = 0.5, r_bulk = 1.5, q* = 4, v = 0.5·0 + 0.5·(4 − 1) = 1.5, a step of 2 to q = 3;
    the makespan max(x/0.5, (16 − x)/1.5) falls from 10 to 8.67 (13%). Below a 20% gain it stays and halves v to
    0.75; at 10% it moves and keeps v."""
    refused = make("tailsieve-paper", q0=1, m0=4, gain=0.2)
    out, moved = refused.inner(refused.initial(), obs(q=1, m=4, tail_s=2.0, bulk_s=10.0))
    assert not moved and (out.q, out.m, out.hold) == (1, 4, 0)
    assert (out.rate_tail, out.rate_bulk, out.velocity) == pytest.approx((0.5, 1.5, 0.75))
    taken = make("tailsieve-paper", q0=1, m0=4, gain=0.1)
    out, moved = taken.inner(taken.initial(), obs(q=1, m=4, tail_s=2.0, bulk_s=10.0))
    assert moved and (out.q, out.hold, out.velocity) == (3, 1, pytest.approx(1.5))
    assert out.decision == Decision(3, 4, Reason.MOVE_Q, (3, 4), pytest.approx(10 - 13 / 1.5))  # type: ignore[arg-type]
    # the next decision starts from the damped velocity: v = 0.5·0.75 + 0.5·(q* − q)
    again, _ = refused.inner(replace(refused.initial(), velocity=0.75, rate_tail=0.5, rate_bulk=1.5),
                             obs(q=1, m=4, tail_s=2.0, bulk_s=10.0))
    assert again.velocity == pytest.approx((0.5 * 0.75 + 0.5 * 3) * 0.5)


def test_predictor_uniform_equals_closed_form() -> None:
    h = np.full((4, 2), 10, dtype=np.int64)
    p = Predictor(h, PredictorFacts(groups=4, extra=1, replicas=2, curve=CURVE, resamples=2))
    # 8 requests of 10 tokens over 2 replicas by request: 4 per replica
    assert p.makespan(0, 0) == pytest.approx(10 * CURVE.tpot_s(4))


def test_static_and_config_validation() -> None:
    c = make("static")
    assert (c.initial().q, c.initial().m) == (2, 2)
    with pytest.raises(ConfigError, match="ema must lie in"):
        ControllerConfig(ema=1.5)
    with pytest.raises(ConfigError, match="q0 must be >= 0"):
        ControllerConfig(q0=-1)
    with pytest.raises(ConfigError, match=r"^gain must lie in \[0, 1\], got 1.5$"):
        PaperConfig(gain=1.5)
    with pytest.raises(ConfigError, match=r"^horizon must be >= 1, got 0$"):
        ControllerConfig(horizon=0)
    with pytest.raises(ConfigError, match=r"^history_steps must be >= 1, got 0$"):
        ControllerConfig(history_steps=0)
    with pytest.raises(ConfigError, match=r"^z must be >= 0 and finite, got inf$"):
        ControllerConfig(z=math.inf)
    with pytest.raises(ConfigError, match=r"^move_cost_s must be >= 0 and finite, got -1$"):
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


def test_pinned_candidates_cannot_be_cut_in_the_bulk_forecast() -> None:
    """Redraw limit 1: the E − q non-isolated candidates run pinned in the bulk pool, so T_bulk is the later of their
    last completion and the (N − E)-th fresh completion; without pinning it is the (N − q)-th of all."""
    h = history(n=16, g=4)
    kw = {"groups": 16, "extra": 4, "replicas": 4, "curve": CURVE, "resamples": 3}
    facts = PredictorFacts(**kw)  # type: ignore[arg-type]
    free, pin = Predictor(h, facts), Predictor(h, replace(facts, pinned_candidates=True))
    for q in (1, 2, 3):
        raw = pin._bulk_raw(q, 1)  # candidates q..E−1 first, then the 16 fresh groups
        pins = 4 - q
        expect = np.maximum(raw[:, :pins].max(axis=1), np.sort(raw[:, pins:], axis=1)[:, 16 - 4 - 1])
        np.testing.assert_allclose(pin.bulk_times(q, 1), expect)
        assert np.all(pin.bulk_times(q, 1) >= free.bulk_times(q, 1))
    # every candidate isolated (q = E): nothing pinned in the bulk, the two models agree; uniform is unaffected
    np.testing.assert_allclose(pin.bulk_times(4, 1), free.bulk_times(4, 1))
    assert pin.makespan(0, 0) == free.makespan(0, 0)
    pinning = make("tailsieve")  # max_redraws 1 (default): the router's fact reaches the predictor's facts
    assert pinning.router.pins_candidates and pinning.facts(ControlState(q=1, m=1)).pinned_candidates
    rc = RouterConfig(groups=16, group_size=4, replicas=8, rho=0.25, max_redraws=2)
    free_ctl = CONTROLLERS["tailsieve"](rc, CURVE)
    assert not free_ctl.predictor(ControlState(q=1, m=1, history=(h,))).facts.pinned_candidates


def _learnt(c, state: ControlState, step: StepObservation):  # type: ignore[no-untyped-def]
    """The predictor `learn` prices a step against (no per-request record: the forecast at the executed split)."""
    return c.learn(state, replace(step, tail_s=1.0, bulk_s=1.0))[1]


def test_uniform_boundary_has_its_own_calibration() -> None:
    """Without a per-request record `learn` measures a step against the forecast at its own split on the history
    that includes it: a uniform step calibrates the uniform forecast only (its first ratio seeds it), a two-pool
    step the two pools only; until a pool is measured it borrows the uniform boundary's factor."""
    c = make("tailsieve", q0=1, m0=0)
    s0 = c.initial()
    assert np.isnan(s0.calib_uniform) and s0.uniform_dispatch == "request"
    step0 = obs(q=0, m=0, tail_s=0.0, bulk_s=1.0)
    truth = float(np.mean(_learnt(c, s0, step0).uniform_times()))
    s1, pred = c.learn(s0, replace(step0, bulk_s=1.5 * truth))
    assert s1.calib_uniform == pytest.approx(1.5) and math.isnan(s1.calib_bulk) and math.isnan(s1.calib_tail)
    np.testing.assert_allclose(c.times(s1, pred, 0, 0), 1.5 * pred.uniform_times(True))
    assert factors(s1) == pytest.approx((1.5, 1.5, 1.5))  # no split measured yet: the fleet's model error is 1.5
    np.testing.assert_allclose(c.times(s1, pred, 2, 2), 1.5 * pred.split_times(2, 2))
    step1 = obs(q=2, m=2, tail_s=1.0, bulk_s=1.0, seed=1)
    p1 = _learnt(c, s1, step1)
    ft, fb = float(np.mean(p1.tail_times(2, 2))), float(np.mean(p1.bulk_times(2, 2)))
    s2, pred2 = c.learn(s1, replace(step1, tail_s=2.0 * ft, bulk_s=0.5 * fb))
    assert (s2.calib_tail, s2.calib_bulk, s2.calib_uniform) == pytest.approx((2.0, 0.5, 1.5))  # first ratios seed
    np.testing.assert_allclose(c.times(s2, pred2, 2, 2), np.maximum(2.0 * pred2.tail_times(2, 2),
                                                                   0.5 * pred2.bulk_times(2, 2)))
    s3, _ = c.learn(s2, replace(step1, tail_s=ft, bulk_s=fb))  # the same step again, at the model: the EMA moves
    a = c.config.ema
    assert (s3.calib_tail, s3.calib_bulk) == pytest.approx(((1 - a) * 2.0 + a * ft / float(np.mean(
        _learnt(c, s2, step1).tail_times(2, 2))), (1 - a) * 0.5 + a * fb / float(np.mean(
            _learnt(c, s2, step1).bulk_times(2, 2)))))
    warm, _ = c.learn(s2, replace(step1, warmup=True, tail_s=99.0, bulk_s=99.0))
    assert (warm.calib_tail, warm.calib_bulk, warm.calib_uniform) == (s2.calib_tail, s2.calib_bulk, s2.calib_uniform)


def test_candidates_are_bootstrapped_by_selector_rank_from_whole_steps() -> None:
    """With two or more steps whose E candidates were all seen regenerated (the isolated ones and, at redraw limit 1,
    the ones run pinned in the bulk pool), candidate r of every pool is rank r of a random such step: the selector's
    real skill, neither a perfect ranking (which put the longest draws in the tail and the shortest among the pinned)
    nor none."""
    h = history(n=16, g=4)
    kw = {"groups": 16, "extra": 3, "replicas": 4, "curve": CURVE, "resamples": 6}
    steps = tuple(np.array([[900 + i] * 4, [100 + i] * 4, [500 + i] * 4], dtype=np.int64) for i in range(3))
    p = Predictor(h, PredictorFacts(**kw), candidate_steps=steps)  # type: ignore[arg-type]
    assert p.cand.shape == (6, 3, 4)
    for r, base in enumerate((900, 100, 500)):  # rank order kept, even where rank 1 is shorter than rank 2
        assert set(np.unique(p.cand[:, r])) <= {base, base + 1, base + 2}
    one = Predictor(h, PredictorFacts(**kw), candidate_steps=steps[:1],  # type: ignore[arg-type]
                    candidates=np.concatenate(steps[:1]))
    assert np.all(np.diff(one.cand.max(axis=2), axis=1) <= 0)  # too few whole steps: the sorted draws as before
    partial = tuple(s[:2] for s in steps)  # only q = 2 of E = 3 seen (a higher redraw limit): as before
    ranked = Predictor(h, PredictorFacts(**kw), candidate_steps=partial,  # type: ignore[arg-type]
                       candidates=np.concatenate(partial))
    assert np.all(np.diff(ranked.cand.max(axis=2), axis=1) <= 0)


def test_pinned_candidates_join_the_tail_history() -> None:
    """The consumed groups right after the q tail groups that ran pinned (`StepObservation.pinned`) are regenerated
    candidates too: `learn` keeps all q + pinned of them in the tail history, in the selector's order; the history
    gains the whole consumed batch (no per-request record), both capped by `history_steps`."""
    c = make("tailsieve", history_steps=3)
    o = replace(obs(q=1, m=2, tail_s=1.0, bulk_s=1.0), pinned=2)
    s, _ = c.learn(ControlState(q=1, m=2), o)
    np.testing.assert_array_equal(s.tail_history[-1], o.consumed_lengths[:3])
    np.testing.assert_array_equal(s.history[-1], o.consumed_lengths)
    s, _ = c.learn(ControlState(q=1, m=2), replace(o, pinned=0))
    np.testing.assert_array_equal(s.tail_history[-1], o.consumed_lengths[:1])
    warm, _ = c.learn(ControlState(q=1, m=2), replace(o, warmup=True))
    assert warm.tail_history == () and len(warm.history) == 1  # a warm-up step regenerates no candidate
    for k in range(8):
        s, _ = c.learn(s, replace(obs(q=1, m=2, tail_s=1.0, bulk_s=1.0, seed=k + 1), pinned=2))
    assert len(s.history) == 3 and len(s.tail_history) == 6  # H steps of history, 2H of candidates
    np.testing.assert_array_equal(s.history[0], history(seed=6))


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
    before = c.predictor(s).makespan(4, 1)
    for k in range(6):
        step = StepObservation(step=k, q=0, m=0, warmup=False, tail_s=0.0, bulk_s=1.0,
                               consumed_lengths=history(n=16, seed=k + 1))
        s, _ = c.learn(s, step)
        assert s.tail_history[-1].tolist() == c.uniform_candidates(step.consumed_lengths).tolist()
    assert len(s.tail_history) == 8 and c.predictor(s).makespan(4, 1) < 0.85 * before  # 2 of 8 steps heavy



def test_the_registry_order_is_declared_and_every_policy_extends_controller_directly() -> None:
    """Controllers side by side (issue 51): the built-in names in `BUILT_IN`'s order, each class one floor above
    `Controller`; state of a policy's own is its own subclass of `ControlState` (the paper's C.1 fields)."""
    from tailsieve.policy.control_state import STATE_KINDS
    from tailsieve.policy.controller import BUILT_IN, Controller, PaperState

    names = ["uniform", "static", "tailsieve-paper", "tailsieve", "tailsieve-fixed"]
    assert [n for n, _ in BUILT_IN] == names == list(CONTROLLERS)[:5]
    assert all(cls.__bases__ == (Controller,) for _, cls in BUILT_IN)
    assert {"control": ControlState, "tailsieve-paper": PaperState} == STATE_KINDS
    assert not {"hold", "velocity", "rate_tail", "rate_bulk"} & {f.name for f in fields(ControlState)}
    assert type(make("tailsieve-paper").initial()) is PaperState and type(make("tailsieve").initial()) is ControlState
