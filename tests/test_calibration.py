"""Calibration (`policy.calibration`): model error from the step's own requests, forecast biases clipped and slow,
so one outlier step cannot hold the controller anywhere (issue 22)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from tailsieve.loop import StepLoop, make_controller
from tailsieve.model.curves import load_curve
from tailsieve.policy.calibration import (
    BIAS_CLIP,
    COUNTERFACTUAL_CLIP,
    PRIOR_STEPS,
    age_spread,
    calibrate,
    ema,
    factors,
    forecast_noise,
    history_variance,
    learn_spread,
    learn_uniform,
    model_errors,
    step_weight,
)
from tailsieve.policy.control_state import ControllerConfig, ControlState, StepObservation
from tailsieve.policy.router import Router, RouterConfig
from tailsieve.simulation.executor import SimExecutor
from tailsieve.workloads import load_workload

CFG = ControllerConfig()


def observation(*, q: int, m: int, tail_s: float, bulk_s: float) -> StepObservation:
    return StepObservation(step=3, q=q, m=m, warmup=False, candidates=2, tail_s=tail_s, bulk_s=bulk_s,
                           consumed_lengths=np.ones((4, 2), np.int64))


def test_an_outlier_step_moves_the_bias_by_at_most_the_clip_and_leaves_the_model_error() -> None:
    """A regenerated group at the cap doubles T_tail: the model on that step's requests says so too (the model is
    right), so the model error stays 1, and the forecast bias moves by bias_ema · BIAS_CLIP, not by the 2×."""
    s = ControlState(q=2, m=1)
    step = observation(q=2, m=1, tail_s=200.0, bulk_s=90.0)
    out = learn_spread(calibrate(s, step, CFG, modelled=(200.0, 90.0), forecast=(100.0, 90.0)), step, CFG, 100.0)
    assert out.calib_tail == pytest.approx(1.0) and out.calib_bulk == pytest.approx(1.0)
    assert out.bias_tail == pytest.approx(CFG.bias_ema * BIAS_CLIP)
    assert out.bias_bulk == pytest.approx(0.0)
    # the spread bias: 200 / 100, clipped; the first two-pool step enters a running mean where the zero prior counts
    # as PRIOR_STEPS steps, a later one (once 1/(n + PRIOR_STEPS) < bias_ema) at the bias_ema rate
    assert out.bias_step == pytest.approx(BIAS_CLIP / (1 + PRIOR_STEPS)) and out.seen_step == 1
    late = learn_spread(calibrate(replace(s, seen_step=10), step, CFG, modelled=(200.0, 90.0), forecast=(100.0, 90.0)),
                        step, CFG, 100.0)
    assert late.bias_step == pytest.approx(CFG.bias_ema * BIAS_CLIP) and late.seen_step == 11
    ct, cb, _ = factors(out)
    assert ct == pytest.approx(math.exp(0.02)) and cb == pytest.approx(1.0)


def test_the_spread_bias_is_the_running_mean_of_its_first_steps() -> None:
    """Log-ratios 0.1, −0.05, 0.15 (within the clip) on the first three two-pool steps: bias_step is their mean with
    the zero prior counted as PRIOR_STEPS steps, var_step the same mean of each one's squared deviation from the
    bias before it (the first one alone: nothing was measured before); `step_weight` is 1/(n + PRIOR_STEPS) down to
    bias_ema."""
    s = ControlState(q=2, m=1)
    xs = (0.1, -0.05, 0.15)
    prev, devs = 0.0, []
    for x in xs:
        span = 100.0 * math.exp(x)
        step = observation(q=2, m=1, tail_s=span, bulk_s=span)
        s = learn_spread(calibrate(s, step, CFG, modelled=(span, span), forecast=(span, span)), step, CFG, 100.0)
        devs.append((x - prev) ** 2)
        prev = s.bias_step
    assert s.bias_step == pytest.approx(sum(xs) / (len(xs) + PRIOR_STEPS)) and s.seen_step == 3
    w2, w3 = 1 / (2 + PRIOR_STEPS), 1 / (3 + PRIOR_STEPS)
    assert s.var_step == pytest.approx((devs[0] * (1 - w2) + w2 * devs[1]) * (1 - w3) + w3 * devs[2])
    assert [step_weight(n, 0.1) for n in (1, 2, 8, 9, 50)] == pytest.approx([1 / 3, 1 / 4, 0.1, 0.1, 0.1])


def test_model_error_is_measured_against_the_models_own_forecast_of_the_step() -> None:
    """An engine 25% slower than the model: the first two-pool step's ratio seeds each pool's model error, a later
    one moves it at the `ema` rate, and the biases stay put."""
    s = ControlState(q=2, m=1)
    assert math.isnan(s.calib_tail) and math.isnan(s.calib_bulk)
    out = calibrate(s, observation(q=2, m=1, tail_s=125.0, bulk_s=125.0), CFG, modelled=(100.0, 100.0),
                    forecast=(100.0, 100.0))
    assert out.calib_tail == pytest.approx(1.25) and out.calib_bulk == pytest.approx(1.25)
    out = calibrate(out, observation(q=2, m=1, tail_s=100.0, bulk_s=125.0), CFG, modelled=(100.0, 100.0),
                    forecast=(100.0, 100.0))
    assert out.calib_tail == pytest.approx(1.25 - CFG.ema * 0.25) and out.calib_bulk == pytest.approx(1.25)
    assert (out.bias_tail, out.bias_bulk, out.bias_step) == (0.0, 0.0, 0.0)


def test_an_unmeasured_pool_borrows_the_nearest_measured_model_error() -> None:
    """Tail ← bulk ← uniform ← 1, and bulk ← tail ← uniform ← 1: a split is never priced at a model error of 1
    against a uniform boundary measured at 1.5."""
    nan = math.nan
    cases = {(nan, nan, nan): (1.0, 1.0), (nan, nan, 1.5): (1.5, 1.5), (1.8, nan, 1.5): (1.8, 1.8),
             (nan, 1.4, 1.5): (1.4, 1.4), (1.8, 1.4, 1.5): (1.8, 1.4)}
    for (tail, bulk, uniform), want in cases.items():
        state = ControlState(q=2, m=1, calib_tail=tail, calib_bulk=bulk, calib_uniform=uniform)
        assert model_errors(state) == pytest.approx(want)
        assert factors(state)[:2] == pytest.approx(want)


def test_the_spread_bias_learns_what_the_updated_factors_miss_not_their_lag() -> None:
    """A fleet 50% slower than the model everywhere, known from one uniform step: the first two-pool step runs at
    1.5× the model in both pools. Priced with the factors that step has just updated, its makespan is what the
    forecast says and the spread bias stays 0; priced at 1 (the model error before any two-pool step, as it was)
    the spread bias learnt log 1.5 (clipped), which then stayed while the pools' own factors caught up."""
    s = ControlState(q=2, m=1, calib_uniform=1.5)
    step = observation(q=2, m=1, tail_s=150.0, bulk_s=120.0)
    out = calibrate(s, step, CFG, modelled=(100.0, 80.0), forecast=(100.0, 80.0))
    ct, cb, _ = factors(out)
    assert (ct, cb) == pytest.approx((1.5, 1.5))
    out = learn_spread(out, step, CFG, max(ct * 100.0, cb * 80.0))
    assert out.bias_step == pytest.approx(0.0) and out.seen_step == 1
    assert learn_spread(s, step, CFG, 100.0).bias_step == pytest.approx(BIAS_CLIP / (1 + PRIOR_STEPS))
    assert learn_spread(s, replace(step, warmup=True), CFG, 100.0) == s
    assert learn_spread(s, replace(step, q=0, m=0), CFG, 100.0) == s


def test_without_a_request_record_the_forecast_is_the_reference_and_no_bias_is_learnt() -> None:
    s = ControlState(q=2, m=1)
    out = calibrate(s, observation(q=2, m=1, tail_s=150.0, bulk_s=50.0), CFG, modelled=None, forecast=(100.0, 100.0))
    assert out.calib_tail == pytest.approx(1.5) and out.calib_bulk == pytest.approx(0.5)
    assert (out.bias_tail, out.bias_bulk) == (0.0, 0.0)


def test_uniform_steps_learn_the_uniform_pair_and_age_the_two_pool_biases() -> None:
    s = ControlState(q=0, m=0, bias_tail=0.1, bias_bulk=-0.1, bias_step=0.2)
    out = calibrate(s, observation(q=0, m=0, tail_s=0.0, bulk_s=110.0), CFG, modelled=(0.0, 100.0),
                    forecast=(0.0, 100.0))
    decay = 1 - CFG.bias_ema
    assert (out.bias_tail, out.bias_bulk, out.bias_step) == pytest.approx((0.1 * decay, -0.1 * decay, 0.2 * decay))
    assert out.calib_uniform == pytest.approx(1.1)  # the first uniform step seeds it
    assert out.bias_uniform == 0.0
    assert factors(out)[2] == pytest.approx(1.1)
    assert factors(replace(out, calib_uniform=math.nan, calib_bulk=0.9))[2] == pytest.approx(0.9 * math.exp(-0.09))


def test_uniform_steps_age_the_measured_spread_back_to_its_prior() -> None:
    """k uniform steps after a split stint: var_step = B² + (v0 − B²)·(1 − a)^k (B = BIAS_CLIP), the closed form of
    the decay the spread bias itself follows; never measured (NaN) stays NaN. So the gate's spread share returns to
    what an untried split has: a split measured once and left long ago is no better known than one never tried."""
    a, v0 = CFG.bias_ema, 0.0025
    s = ControlState(q=0, m=0, bias_step=0.05, var_step=v0, seen_step=30)
    for k in range(1, 41):
        s = calibrate(s, observation(q=0, m=0, tail_s=0.0, bulk_s=100.0), CFG, modelled=(0.0, 100.0),
                      forecast=(0.0, 100.0))
        assert s.var_step == pytest.approx(BIAS_CLIP**2 + (v0 - BIAS_CLIP**2) * (1 - a) ** k)
        assert s.bias_step == pytest.approx(0.05 * (1 - a) ** k)
    share, hist = a / (2 - a), 1e-4
    untried = forecast_noise(ControlState(q=0, m=0, var_uniform=0.01), a, hist)
    assert untried == pytest.approx(math.sqrt((0.01 + BIAS_CLIP**2) * share + hist))
    assert forecast_noise(replace(s, var_uniform=0.01), a, hist) == pytest.approx(untried, rel=0.01)
    fresh = forecast_noise(replace(s, var_uniform=0.01, var_step=v0), a, hist)  # right after the stint: well known
    assert fresh == pytest.approx(math.sqrt((0.01 + v0) * share + hist)) and fresh < 0.6 * untried
    assert math.isnan(age_spread(math.nan, a))
    step = observation(q=2, m=1, tail_s=100.0, bulk_s=90.0)
    after_split = learn_spread(calibrate(s, step, CFG, modelled=(100.0, 90.0), forecast=(100.0, 90.0)), step, CFG,
                               100.0)
    assert after_split.var_step == pytest.approx(ema(s.var_step, (0.0 - s.bias_step) ** 2, step_weight(31, a)))


def test_warmup_steps_teach_nothing() -> None:
    s = ControlState(q=2, m=1)
    ob = replace(observation(q=2, m=1, tail_s=500.0, bulk_s=500.0), warmup=True)
    assert calibrate(s, ob, CFG, modelled=(1.0, 1.0), forecast=(1.0, 1.0)) == s


def test_in_the_simulator_the_model_error_stays_one() -> None:
    """All-admit simulated replicas are the model: every model-error factor stays at 1 (to the one iteration a cut
    request's whole-token progress leaves out), whatever the draws do; only the biases move."""
    wl = load_workload("synthetic-math", seed=1)
    rc = RouterConfig(groups=16, group_size=4, replicas=4, rho=0.25)
    curve = load_curve("h100-llama3-8b")
    ctl = make_controller("tailsieve", rc, bulk_curve=curve, config=ControllerConfig(m0=2))  # starts in a split
    loop = StepLoop(Router(rc, wl.prompts), ctl)
    ex = SimExecutor(wl, curve, rc)
    state, ran = loop.initial(), set()
    for _ in range(12):
        out = loop.step(state, ex)
        state, c = out.state, out.state.control
        ran.add(out.plan.m > 0 and not out.plan.warmup)
        assert model_errors(c) == pytest.approx((1.0, 1.0), abs=2e-3)
        assert math.isnan(c.calib_uniform) or c.calib_uniform == pytest.approx(1.0, abs=2e-3)
    assert ran == {True, False}  # two-pool and uniform (or warm-up) steps both ran


def test_the_uniform_counterfactual_moves_the_uniform_bias_by_its_clipped_log_ratio() -> None:
    """A split step's counterfactual uniform time against the bootstrap forecast: log(1.2) enters the slow EMA as
    it is; a 2× miss is clipped at COUNTERFACTUAL_CLIP; the two-pool biases and model errors are untouched."""
    s0 = ControlState(q=2, m=2, bias_tail=0.05)
    s1 = learn_uniform(s0, 1.2, 1.0, CFG)
    assert s1.bias_uniform == pytest.approx(CFG.bias_ema * math.log(1.2))
    s2 = learn_uniform(s0, 1.0, 2.0, CFG)
    assert s2.bias_uniform == pytest.approx(-CFG.bias_ema * COUNTERFACTUAL_CLIP)
    assert (s2.bias_tail, s2.calib_bulk, s2.bias_step) == (0.05, s0.calib_bulk, 0.0) and math.isnan(s2.calib_uniform)
    assert learn_uniform(s0, 0.0, 1.0, CFG) == s0  # nothing measured: nothing learnt


def test_forecast_noise_is_the_standard_error_of_the_two_bias_emas_and_the_history() -> None:
    """Spreads σ_u² = 0.09, σ_s² = 0.01 of the per-step log-ratios, EMA weight a = 0.1, a history of 4 steps, the
    spread bias learnt from 40 steps: √((0.09 + 0.01)·a/(2 − a) + BIAS_CLIP²/4); from 4 steps (a running mean) its
    share is σ_s²/(4 + PRIOR_STEPS); unmeasured spreads count as BIAS_CLIP², no history as one step."""
    a = 0.1
    hist = tuple(np.ones((2, 2), np.int64) for _ in range(4))
    s = ControlState(q=0, m=0, var_uniform=0.09, var_step=0.01, seen_step=40, history=hist)
    assert forecast_noise(s, a) == pytest.approx(math.sqrt(0.10 * a / (2 - a) + BIAS_CLIP**2 / 4))
    few = replace(s, seen_step=4)
    assert forecast_noise(few, a) == pytest.approx(math.sqrt(0.09 * a / (2 - a) + 0.01 / (4 + PRIOR_STEPS)
                                                             + BIAS_CLIP**2 / 4))
    assert forecast_noise(ControlState(q=0, m=0), a) == pytest.approx(
        math.sqrt(2 * BIAS_CLIP**2 * a / (2 - a) + BIAS_CLIP**2))


def test_history_variance_is_the_shrunk_jackknife_of_the_log_gain_over_steps() -> None:
    """Pools k of step k mod H: the jackknife variance of log(ΣU/ΣS) leaving one step out, brute force, shrunk toward
    BIAS_CLIP²/H with one step's weight; identical steps leave only the prior's share; no per-step pools: the prior."""
    rng = np.random.default_rng(3)
    h, k = 4, 12
    split, uniform = rng.uniform(5, 15, k), rng.uniform(5, 15, k)
    step = np.arange(k) % h
    loo = [math.log(uniform[step != i].sum() / split[step != i].sum()) for i in range(h)]
    jack = (h - 1) / h * sum((g - np.mean(loo)) ** 2 for g in loo)
    prior = BIAS_CLIP**2 / h
    assert history_variance(split, uniform, h) == pytest.approx((prior + (h - 1) * jack) / h)
    same = np.tile([10.0, 12.0, 9.0], h)  # k = 12 pools, 3 per step, every step alike
    assert history_variance(same * 0.9, same, h) == pytest.approx(prior / h)
    assert history_variance(split, uniform, 1) == BIAS_CLIP**2  # one step: nothing to compare
    assert history_variance(split, uniform, 5) == BIAS_CLIP**2 / 5  # pools not whole rounds of the steps
    assert history_variance(split, uniform, 0) == BIAS_CLIP**2  # pooled draws


def test_forecast_noise_takes_a_measured_history_term() -> None:
    """With `history` given, it replaces BIAS_CLIP²/H: √((σ_u² + σ_s²)·a/(2 − a) + history)."""
    a = 0.1
    s = ControlState(q=0, m=0, var_uniform=0.01, var_step=0.03, seen_step=30, history=(np.ones((2, 2), np.int64),) * 8)
    assert forecast_noise(s, a, 0.0004) == pytest.approx(math.sqrt(0.04 * a / (2 - a) + 0.0004))


def test_the_spreads_are_learnt_where_their_biases_are() -> None:
    """A split step's counterfactual at 1.2× the forecast from bias 0: var_uniform = (log 1.2)² (first value); the
    next at 1.0×: EMA of (0 − bias)² with weight bias_ema. A uniform step learns var_uniform too (clipped log-ratio)."""
    s1 = learn_uniform(ControlState(q=2, m=2), 1.2, 1.0, CFG)
    assert s1.var_uniform == pytest.approx(math.log(1.2) ** 2)
    s2 = learn_uniform(s1, 1.0, 1.0, CFG)
    b = CFG.bias_ema
    assert s2.var_uniform == pytest.approx((1 - b) * math.log(1.2) ** 2 + b * s1.bias_uniform**2)
    assert math.isnan(s2.var_step)
