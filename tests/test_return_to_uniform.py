"""The one-time price of returning from a split to the uniform boundary (issue 14): the first uniform step also runs
the E waiting candidates to completion (`Predictor.uniform_return_times`), and `tailsieve` returns only when the
forecast gain repays that within `move_horizon` steps (`Controller.return_cost`)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from conftest import fixed_forecast, make_curve
from tailsieve.policy.controller import CONTROLLERS, ControllerConfig, ControlState
from tailsieve.policy.predictor import Predictor
from tailsieve.policy.router import RouterConfig

CURVE = make_curve()


def flat(*, n: int, g: int = 2, length: int = 10) -> np.ndarray:
    return np.full((n, g), length, dtype=np.int64)


def make(name: str = "tailsieve", **cfg: object):  # type: ignore[no-untyped-def]
    rc = RouterConfig(groups=4, group_size=2, replicas=2, rho=0.5)  # E = 2
    return CONTROLLERS[name](rc, CURVE, ControllerConfig(**cfg))  # type: ignore[arg-type]


def test_return_step_runs_the_waiting_candidates_with_the_fresh_groups() -> None:
    """N = 4 groups of 2, E = 2 candidates of 50 tokens, fresh groups of 10, R = 2 group-atomic lanes: each lane runs
    one candidate group and one fresh group, 4 requests for 10 tokens then 2 for 40; steady uniform runs 4 × 10."""
    p = Predictor(flat(n=8), candidates=flat(n=8, length=50), groups=4, extra=2, replicas=2, curve=CURVE,
                  resamples=3)
    t = CURVE.tpot_s
    np.testing.assert_allclose(p.uniform_return_times(), 10 * t(4) + 40 * t(2))
    np.testing.assert_allclose(p.bulk_times(0, 0), 10 * t(4))
    # candidates no longer than the fresh groups: nothing to repay
    same = Predictor(flat(n=8), candidates=flat(n=8), groups=4, extra=2, replicas=2, curve=CURVE, resamples=3)
    np.testing.assert_allclose(same.uniform_return_times(), same.bulk_times(0, 0))


def test_return_cost_is_the_calibrated_excess_of_the_return_step() -> None:
    c = make()
    s = ControlState(q=2, m=1, history=(flat(n=8),), tail_history=(flat(n=8, length=50),), calib_uniform=1.5)
    pred = c.predictor(s)
    t = CURVE.tpot_s
    assert c.return_cost(s, pred) == pytest.approx(1.5 * 40 * t(2))
    assert make("tailsieve-paper").return_cost(s, pred) == 0.0  # the literal C.2 does not price it


@pytest.mark.parametrize(("uniform_s", "returns"), [(9.9, False), (1.0, True)])
def test_return_to_uniform_must_repay_the_waiting_candidates(uniform_s: float, returns: bool) -> None:
    """Current split 10 s; uniform forecast at 9.9 s gains 0.1 s × 8 steps, less than the return step's excess: stay,
    and say why. At 1 s the gain repays it: go straight to uniform."""
    long_tail = flat(n=8, length=2_000)
    base = make(m_gain=0.0, min_dwell=1, move_horizon=8)

    f = fixed_forecast("tailsieve", base, lambda q, m: uniform_s if m == 0 else 10.0)
    s = ControlState(q=2, m=1, dwell=5, history=(flat(n=8),), tail_history=(long_tail,))
    pred = f.predictor(s)
    assert 8 * 0.1 < f.return_cost(s, pred) < 8 * 9.0  # about 17 s: more than 0.8 s, less than 9 s × 8
    out = f.outer(s, pred)
    if returns:
        assert (out.q, out.m) == (0, 0)
    else:
        assert (out.q, out.m) == (2, 1)
        assert out.note == "m 1->0 would not repay the waiting candidates"


def test_leaving_uniform_needs_a_gain_beyond_the_forecasts_noise() -> None:
    """`tailsieve` leaves the uniform boundary only for a forecast gain above max(m_gain, forecast noise): with
    spreads of 0.3² and one step of history the noise is ≈ 22%; the literal `tailsieve-paper` keeps C.2's m_gain."""
    from tailsieve.policy.calibration import forecast_noise

    s = ControlState(q=0, m=0, var_uniform=0.09, var_step=0.09, history=(flat(n=4),))
    ts, paper = make("tailsieve"), make("tailsieve-paper")
    assert ts.leave_gain(s) == pytest.approx(forecast_noise(s, ts.config.bias_ema)) and ts.leave_gain(s) > 0.2
    assert paper.leave_gain(s) == paper.config.m_gain
    quiet = ControlState(q=0, m=0, var_uniform=1e-6, var_step=1e-6, seen_step=40, history=(flat(n=4),) * 8)
    assert ts.leave_gain(quiet) == pytest.approx(0.2 / 8**0.5, rel=1e-3)  # the history's own error remains
    # with the predictor the history term is measured on its pools: eight identical steps leave the prior's share,
    # 0.2²/8/8, so the noise is 2.5% and m_gain (3%) is the gate
    pred = ts.predictor(quiet)
    qc, _ = ts.split_q(quiet, pred, 1)  # R = 2: the one split there is
    a = ts.config.bias_ema
    noise = math.sqrt(2e-6 * a / (2 - a) + 0.2**2 / 8 / 8)
    assert forecast_noise(quiet, a, 0.2**2 / 8 / 8) == pytest.approx(noise) and noise < ts.config.m_gain
    assert ts.leave_gain(quiet, pred, qc, 1) == ts.config.m_gain
