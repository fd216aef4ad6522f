"""Calibration (`policy.calibration`): the model error per forecast class, measured pool time / the all-admit model
on the step's own requests, an EMA seeded by the first ratio; an unmeasured class borrows the nearest measured
one; in the simulator it is 1 on a plain workload and the engine's scale on a scaled fleet."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from conftest import make_curve
from tailsieve.loop import build_loop
from tailsieve.policy.calibration import calibrate, ema, factors, uniform_factor
from tailsieve.policy.control_state import ControllerConfig, ControlState, StepObservation
from tailsieve.policy.router import RouterConfig
from tailsieve.simulation.executor import SimExecutor
from tailsieve.simulation.runs import SimConfig, policy_spec
from tailsieve.workloads import load_workload

A = 0.3


def observation(*, q: int, m: int, tail_s: float, bulk_s: float, warmup: bool = False) -> StepObservation:
    return StepObservation(step=3, q=q, m=m, warmup=warmup, tail_s=tail_s, bulk_s=bulk_s,
                           consumed_lengths=np.ones((4, 2), np.int64))


def test_ema_is_seeded_by_the_first_value() -> None:
    assert ema(math.nan, 1.7, A) == 1.7
    assert ema(2.0, 1.0, A) == pytest.approx(0.7 * 2.0 + 0.3 * 1.0)
    assert ema(2.0, 1.0, 0.0) == 2.0 and ema(2.0, 1.0, 1.0) == 1.0


def test_a_two_pool_step_measures_each_pool_against_the_model_on_its_own_requests() -> None:
    """An engine 25% slower than the model: the first two-pool step's ratios seed each pool's error, a later step
    moves them at the `ema` rate; the uniform boundary's error is left alone."""
    s = ControlState(q=2, m=1)
    assert math.isnan(s.calib_tail) and math.isnan(s.calib_bulk) and math.isnan(s.calib_uniform)
    out = calibrate(s, observation(q=2, m=1, tail_s=125.0, bulk_s=250.0), A, (100.0, 200.0))
    assert (out.calib_tail, out.calib_bulk) == pytest.approx((1.25, 1.25)) and math.isnan(out.calib_uniform)
    out = calibrate(out, observation(q=2, m=1, tail_s=100.0, bulk_s=150.0), A, (100.0, 100.0))
    assert (out.calib_tail, out.calib_bulk) == pytest.approx((0.7 * 1.25 + 0.3 * 1.0, 0.7 * 1.25 + 0.3 * 1.5))
    assert math.isnan(out.calib_uniform)


def test_a_uniform_step_measures_the_uniform_boundary_only() -> None:
    """At m = 0 the step's bulk term is the whole step: it seeds the error of the placement it ran (`calib_uniform`
    dealing requests, `calib_group` placing whole groups), never the pools' errors nor the other placement's."""
    s = ControlState(q=0, m=0, calib_tail=1.2, calib_bulk=0.9, uniform_dispatch="request")
    out = calibrate(s, observation(q=0, m=0, tail_s=0.0, bulk_s=110.0), A, (0.0, 100.0))
    assert (out.calib_tail, out.calib_bulk, out.calib_uniform) == pytest.approx((1.2, 0.9, 1.1))
    assert math.isnan(out.calib_group)
    out = calibrate(out, observation(q=0, m=0, tail_s=0.0, bulk_s=140.0), A, (0.0, 100.0))
    assert out.calib_uniform == pytest.approx(0.7 * 1.1 + 0.3 * 1.4)
    grouped = calibrate(replace(out, uniform_dispatch="group"), observation(q=0, m=0, tail_s=0.0, bulk_s=60.0), A,
                        (0.0, 100.0))
    assert (grouped.calib_group, grouped.calib_uniform) == pytest.approx((0.6, 0.7 * 1.1 + 0.3 * 1.4))


def test_each_placement_is_priced_by_its_own_error_else_the_others() -> None:
    """`uniform_factor`: the placement's own measured error, else the other placement's, else NaN; `factors` reads
    the uniform boundary's at the state's placement (and splits borrow it, as before)."""
    nan = math.nan
    both = ControlState(q=0, m=0, calib_uniform=1.5, calib_group=0.8)
    assert (uniform_factor(both, True), uniform_factor(both, False)) == (1.5, 0.8)
    assert factors(replace(both, uniform_dispatch="request")) == (1.5, 1.5, 1.5)
    assert factors(replace(both, uniform_dispatch="group")) == (0.8, 0.8, 0.8)
    dealt_only = ControlState(q=0, m=0, calib_uniform=1.5)
    assert (uniform_factor(dealt_only, True), uniform_factor(dealt_only, False)) == (1.5, 1.5)
    none = ControlState(q=0, m=0)
    assert math.isnan(uniform_factor(none, True)) and math.isnan(uniform_factor(none, False))
    assert factors(ControlState(q=0, m=0, calib_group=0.8, calib_tail=nan)) == (0.8, 0.8, 0.8)


def test_warmup_steps_and_unmeasurable_terms_teach_nothing() -> None:
    s = ControlState(q=2, m=1, calib_tail=1.1)
    assert calibrate(s, observation(q=2, m=1, tail_s=500.0, bulk_s=500.0, warmup=True), A, (1.0, 1.0)) == s
    assert calibrate(s, observation(q=2, m=1, tail_s=500.0, bulk_s=500.0), A, (0.0, 0.0)) == s  # no model time
    assert calibrate(s, observation(q=2, m=1, tail_s=0.0, bulk_s=0.0), A, (1.0, 1.0)) == s  # nothing measured
    only_bulk = calibrate(s, observation(q=0, m=1, tail_s=5.0, bulk_s=2.0), A, (1.0, 1.0))  # q = 0: no tail pool
    assert (only_bulk.calib_tail, only_bulk.calib_bulk) == (1.1, 2.0)


def test_an_unmeasured_class_borrows_the_nearest_measured_model_error() -> None:
    """Tail ← bulk ← uniform ← 1, bulk ← tail ← uniform ← 1, uniform ← bulk (itself borrowed): a split is never
    priced at a model error of 1 against a uniform boundary measured at 1.5, nor the other way round."""
    nan = math.nan
    cases = {(nan, nan, nan): (1.0, 1.0, 1.0), (nan, nan, 1.5): (1.5, 1.5, 1.5), (1.8, nan, 1.5): (1.8, 1.8, 1.5),
             (nan, 1.4, 1.5): (1.4, 1.4, 1.5), (1.8, 1.4, 1.5): (1.8, 1.4, 1.5), (1.8, 1.4, nan): (1.8, 1.4, 1.4),
             (1.8, nan, nan): (1.8, 1.8, 1.8), (nan, 0.7, nan): (0.7, 0.7, 0.7)}
    for (tail, bulk, uniform), want in cases.items():
        state = ControlState(q=2, m=1, calib_tail=tail, calib_bulk=bulk, calib_uniform=uniform)
        assert factors(state) == pytest.approx(want), (tail, bulk, uniform)


def simulated_controls(engine_scale: float, m0: int, steps: int) -> list[tuple[bool, ControlState]]:
    """(the step ran two pools, steady, control state after it) per step of `tailsieve` started at (1, m0) on a plain
    workload, the simulated fleet `engine_scale` times slower than the profiled curve the controller prices with
    (the wiring of `run_policy`, which keeps only the step records)."""
    wl = load_workload("synthetic-math", seed=1)
    cfg = SimConfig(router=RouterConfig(groups=16, group_size=4, replicas=4, rho=0.25),
                    controller=ControllerConfig(m0=m0), engine_scale=engine_scale)
    spec = policy_spec("tailsieve", wl, make_curve(), cfg)
    loop = build_loop(spec, wl.prompts)
    ex = SimExecutor(wl, cfg.fleet_curve(spec.cost.bulk_curve), spec.router, cfg.replica)
    state, out = loop.initial(), []
    for _ in range(steps):
        step = loop.step(state, ex)
        state = step.state
        out.append((step.plan.m > 0 and not step.plan.warmup, state.control))
    return out


@pytest.mark.parametrize("scale", [1.0, 1.4])
def test_in_the_simulator_the_model_error_is_the_engine_scale(scale: float) -> None:
    """All-admit simulated replicas are the model: every factor measured is 1 on a plain workload (to the one
    iteration a cut request's whole-token progress leaves out), and `engine_scale` on a fleet decoding at
    τ(b)·engine_scale: the luck of the draw never enters, because the model runs on the step's own requests.
    Started in a split the two pools are measured, started at the uniform boundary the uniform one."""
    split = simulated_controls(scale, m0=2, steps=5)
    assert sum(ran for ran, _ in split) >= 3  # steady two-pool steps measured
    for ran, c in split:
        if ran:
            assert (c.calib_tail, c.calib_bulk) == pytest.approx((scale, scale), rel=2e-3)
    assert factors(split[-1][1]) == pytest.approx((scale, scale, scale), rel=2e-3)  # uniform borrows the bulk's
    uniform = simulated_controls(scale, m0=0, steps=3)
    assert all(not ran for ran, _ in uniform)
    for _, c in uniform:
        assert c.calib_uniform == pytest.approx(scale, rel=2e-3) and math.isnan(c.calib_bulk)
    assert factors(uniform[-1][1]) == pytest.approx((scale, scale, scale), rel=2e-3)  # the pools borrow it


def test_a_scaled_fleet_is_learnt_without_a_request_record_too() -> None:
    """Without `StepObservation.work` the reference is the forecast at the executed split (`Controller.learn`): the
    ratio then also carries the draw, but a fleet uniformly 1.4× slower still reads as 1.4× its own forecast."""
    from controller_fixtures import make, obs

    c = make("tailsieve", m0=0)
    s0 = replace(c.initial(), history=())
    step = obs(q=0, m=0, tail_s=0.0, bulk_s=1.0)
    _, pred = c.learn(s0, step)
    forecast = float(np.mean(pred.uniform_times()))
    s1, _ = c.learn(s0, replace(step, bulk_s=1.4 * forecast))
    assert s1.calib_uniform == pytest.approx(1.4) and math.isnan(s1.calib_bulk)
