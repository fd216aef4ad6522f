"""The prompt prefill the controller learns (`policy.prefill_fit`): exact on an all-admit engine whose prefill the
model file lacks, a correction that keeps a right estimate, never below 0, and the placement it changes."""

from __future__ import annotations

import math

import numpy as np
import pytest

from conftest import make_curve
from tailsieve.policy.control_state import ControlState, StepWork
from tailsieve.policy.observed import pool_lanes, request_finish
from tailsieve.policy.prefill_fit import learn_prefill, prefill_moments

CURVE = make_curve()
LENGTHS = np.array([[30, 5, 12], [70, 2, 44], [9, 9, 90], [15, 60, 3], [120, 1, 8], [40, 41, 42]], dtype=np.int64)
WHOLE = np.array([[0, 0, 0], [1, 1, 1], [2, 2, 2], [0, 0, 0], [1, 1, 1], [0, 0, 0]], dtype=np.int64)


def _moments(work: StepWork, prefill_s: float) -> tuple[float, float]:
    """The step's prefill moments on the believed `CURVE` at `prefill_s` seconds per prompt."""
    pools = pool_lanes(work)
    return prefill_moments(work, pools, (pools[0].finish(CURVE, 0.0), pools[1].finish(CURVE, 0.0)), prefill_s)


def _work(prefill_s: float, tail: int = 0) -> StepWork:
    """Whole groups on 3 replicas, every group consumed, each completing as the all-admit engine with `prefill_s`
    seconds per prompt per replica has it."""
    done = request_finish(LENGTHS, WHOLE, CURVE, 0.0, prefill_s).max(axis=1)
    return StepWork(LENGTHS, WHOLE, tail, np.ones(len(LENGTHS), dtype=bool), done_s=done)


def test_an_unknown_prefill_is_learnt_in_one_step() -> None:
    work = _work(0.25)
    moments = _moments(work, 0.0)
    x = np.array([3, 2, 1, 3, 2, 3], dtype=np.float64)  # prompts the replica of each group prefills
    assert moments == pytest.approx((0.25 * float(x @ x), float(x @ x)))
    state = learn_prefill(ControlState(q=0, m=0), moments, 0.0)
    assert state.prefill_s == pytest.approx(0.25)
    again = _moments(work, state.prefill_s)
    assert learn_prefill(state, again, 0.0).prefill_s == pytest.approx(0.25)  # a right estimate stays


def test_both_pools_count_and_a_model_that_overprices_is_corrected_to_zero() -> None:
    """Two tail groups on replicas 0 and 1 and four bulk groups on 2, 0, 1, 0, each pool completing as the engine
    without prefill has it; a model at 0.5 s per prompt is corrected to 0, and every group's prompts count."""
    tail, bulk = slice(0, 2), slice(2, None)
    done = np.concatenate([request_finish(LENGTHS[sl], WHOLE[sl], CURVE, 0.0, 0.0).max(axis=1) for sl in (tail, bulk)])
    work = StepWork(LENGTHS, WHOLE, 2, np.ones(len(LENGTHS), dtype=bool), done_s=done)
    moments = _moments(work, 0.5)
    x = np.array([1, 1, 1, 2, 1, 2], dtype=np.float64)  # tail: one prompt per replica; bulk: 2 on replica 0
    assert moments == pytest.approx((-0.5 * float(x @ x), float(x @ x)))
    state = ControlState(q=1, m=1, prefill_s=0.5)  # learnt at 0.5 from a model file without prefill
    assert learn_prefill(state, moments, 0.0).prefill_s == pytest.approx(0.0, abs=1e-12)
    assert learn_prefill(state, (-100.0, 1.0), 0.0).prefill_s == 0.0


def test_a_measured_prefill_is_kept() -> None:
    """A model file with a prefill (`profile` measured it) keeps it, whatever the residuals say."""
    state = ControlState(q=0, m=0)
    assert learn_prefill(state, (7.0, 2.0), 0.3) is state
    assert learn_prefill(state, (7.0, 2.0), 0.0).prefill_s == pytest.approx(3.5)


def test_without_completion_times_nothing_is_learnt() -> None:
    work = StepWork(LENGTHS, WHOLE, 0, np.ones(len(LENGTHS), dtype=bool))
    moments = _moments(work, 0.0)
    assert moments == (0.0, 0.0)
    state = ControlState(q=0, m=0)
    assert learn_prefill(state, moments, 0.3) is state and math.isnan(state.prefill_s)
