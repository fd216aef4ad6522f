"""The return to the uniform boundary under the paired rule (`policy/tailsieve_rule.py`; docs/controller.md, "The
rule"): its first step runs the E waiting candidates to completion among its N groups, the rule prices that excess
(calibrated) as the return's one-time cost, and a return is taken exactly when horizon·(ḡ − z·s) repays it. Split
from `test_tailsieve_rule.py`, whose other sections it shares no helper with."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from conftest import fixed_forecast, make_curve
from tailsieve.policy.controller import CONTROLLERS, ControlState
from tailsieve.policy.controller_knobs import controller_from_mapping
from tailsieve.policy.decision import Reason
from tailsieve.policy.paper import paper_state
from tailsieve.policy.predictor import Predictor, PredictorFacts
from tailsieve.policy.router import RouterConfig

CURVE = make_curve()


def flat(*, n: int, g: int = 2, length: int = 10) -> np.ndarray:
    return np.full((n, g), length, dtype=np.int64)


SMALL = RouterConfig(groups=4, group_size=2, replicas=2, rho=0.5)  # E = 2


def small(name: str = "tailsieve", **cfg: object) -> Any:
    return CONTROLLERS[name](SMALL, CURVE, controller_from_mapping(cfg, "small"))  # type: ignore[arg-type]


def test_return_step_runs_the_waiting_candidates_with_the_fresh_groups() -> None:
    """N = 4 groups of 2, E = 2 candidates of 50 tokens, fresh groups of 10, R = 2 lanes (whole groups or dealt
    requests alike): each lane runs two candidate and two fresh requests, 4 requests for 10 tokens then 2 for 40;
    steady uniform runs 4 × 10."""
    t = CURVE.tpot_s
    for dealt in (False, True):
        facts = PredictorFacts(groups=4, extra=2, replicas=2, curve=CURVE, resamples=3, uniform_by_request=dealt)
        p = Predictor(flat(n=8), facts, candidates=flat(n=8, length=50))
        np.testing.assert_allclose(p.uniform_return_times(), 10 * t(4) + 40 * t(2))
        np.testing.assert_allclose(p.uniform_times(), 10 * t(4))
    # candidates no longer than the fresh groups: nothing to repay
    same = Predictor(flat(n=8), PredictorFacts(groups=4, extra=2, replicas=2, curve=CURVE, resamples=3),
                     candidates=flat(n=8))
    np.testing.assert_allclose(same.uniform_return_times(), same.uniform_times())


RETURNING = ControlState(q=2, m=1, history=(flat(n=8),) * 2, tail_history=(flat(n=8, length=50),), calib_uniform=1.5)


def test_the_return_costs_the_calibrated_excess_of_its_first_step() -> None:
    """C(split → uniform) = restart price + c_uniform·(T̂_return − T̂_uniform) = 1.5·40·τ(2) here, either placement;
    leaving uniform costs the restart alone, a placement switch or a move of q nothing."""
    t = CURVE.tpot_s
    c = small(move_cost_s=3.0)
    pred = c.predictor(RETURNING)
    excess = float(np.mean(pred.uniform_return_times(True)) - np.mean(pred.uniform_times(True)))
    assert excess == pytest.approx(40 * t(2), rel=1e-12)
    for dispatch in ("request", "group"):
        assert c.cost(RETURNING, pred, (0, 0, dispatch)) == pytest.approx(3.0 + 1.5 * 40 * t(2), rel=1e-12)
    assert c.cost(RETURNING, pred, (1, 1, "")) == 0.0
    uniform = replace(RETURNING, q=0, m=0)
    assert c.cost(uniform, pred, (2, 1, "")) == 3.0 and c.cost(uniform, pred, (0, 0, "group")) == 0.0
    unmeasured = replace(RETURNING, calib_uniform=math.nan, calib_bulk=0.8)  # borrows the bulk pool's model error
    assert small().cost(unmeasured, pred, (0, 0, "request")) == pytest.approx(0.8 * 40 * t(2), rel=1e-12)


@pytest.mark.parametrize(("factor", "returns"), [(0.99, False), (1.01, True)])
def test_the_return_must_repay_its_first_step(factor: float, returns: bool) -> None:
    """Current split 10 s, uniform 10 − ḡ s on every pool (s = 0): V = horizon·ḡ − C. Return when it repays the
    calibrated excess by 1%; refused as UNPAID when it falls 1% short. The paper's C.2 does not price the return
    step: at `gain` 0 it returns on any gain."""
    t = CURVE.tpot_s
    price = 1.5 * 40 * t(2)
    gain = price / 8 * factor
    base = small(horizon=8)
    f = fixed_forecast("tailsieve", base, lambda q, m: 10.0 - gain if m == 0 else 10.0 + (q == 1))
    pred = f.predictor(RETURNING)
    out = f.decide(RETURNING, pred)
    assert out.decision is not None
    assert (out.decision.option, out.decision.se_s) == ((0, 0), 0.0)
    assert (out.decision.gain_s, out.decision.cost_s) == pytest.approx((gain, price), rel=1e-9)
    if returns:
        assert (out.q, out.m, out.uniform_dispatch, out.decision.reason) == (0, 0, "request", Reason.RETURN)
        assert out.decision.note.startswith("return to uniform; (0, 0): ")
    else:
        assert (out.q, out.m, out.decision.reason) == (2, 1, Reason.UNPAID)
    paper = fixed_forecast("tailsieve-paper", small(gain=0.0), lambda q, m: 10.0 - gain if m == 0 else 10.0)
    back = paper.outer(paper_state(RETURNING), pred)  # C.1's fields at their start values
    assert (back.m, back.decision.reason) == (0, Reason.RETURN)
