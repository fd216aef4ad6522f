"""The time warp by batch size (`policy.warp`): 1 where the engine is the model, the truth's ratio where it is not,
bin by bin against a brute-force sum over the completion gaps; the curves the controller prices on; the saved sums."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import make_curve
from tailsieve.errors import ConfigError
from tailsieve.loop import StepLoop, make_controller, step_work
from tailsieve.model.curves import TpotCurve
from tailsieve.policy.control_state import ControlState, StepWork
from tailsieve.policy.observed import pool_lanes, request_finish
from tailsieve.policy.router import Router, RouterConfig
from tailsieve.policy.warp import BINS, bin_of, learn_warp, warp_factors, warp_sums, warped
from tailsieve.simulation.executor import SimExecutor
from tailsieve.simulation.replica import ReplicaConfig
from tailsieve.workloads import load_workload

CURVE = make_curve()
TILTED = TpotCurve("tilted", CURVE.batch, tuple(t * (0.8 + 0.1 * i) for i, t in enumerate(CURVE.tpot_ms)))


def _work(lengths: list[list[int]], lanes: list[list[int]], truth: TpotCurve) -> StepWork:
    """A uniform step whose groups all completed, each at its completion on the all-admit engine `truth`."""
    ln, la = np.array(lengths, dtype=np.int64), np.array(lanes, dtype=np.int64)
    done = request_finish(ln, la, truth, 0.0, 0.0).max(axis=1)
    return StepWork(ln, la, 0, np.ones(len(lengths), dtype=bool), done_s=done)


def _sums(work: StepWork) -> tuple[np.ndarray, np.ndarray]:
    """The step's warp sums against the believed `CURVE` on both pools."""
    pools = pool_lanes(work)
    return warp_sums(work, pools, (pools[0].finish(CURVE, 0.0), pools[1].finish(CURVE, 0.0)))


def _brute(work: StepWork, belief: TpotCurve) -> tuple[np.ndarray, np.ndarray]:
    """The gaps of the sorted completions one by one, each to the bin of the running requests per replica at the
    modelled gap's midpoint."""
    fin = request_finish(work.lengths, work.lanes, belief, 0.0, 0.0)
    mod, obs = sorted(fin.max(axis=1)), sorted(work.done_s)  # type: ignore[arg-type]
    lanes = len(set(work.lanes.ravel().tolist()))
    o, m = np.zeros(BINS), np.zeros(BINS)
    prev_m, prev_o = mod[0], obs[0]
    for a, b in zip(mod[1:], obs[1:], strict=True):
        mid = (prev_m + a) / 2
        running = sum(1 for x in fin.ravel() if x > mid)
        k = min(int(np.floor(np.log2(max(running / lanes, 1.0)))), BINS - 1)
        m[k] += a - prev_m
        o[k] += b - prev_o
        prev_m, prev_o = a, b
    return o, m


LENGTHS = [[30, 5, 12], [70, 2, 44], [9, 9, 90], [15, 60, 3], [120, 1, 8], [40, 41, 42]]
LANES = [[0, 1, 0], [1, 0, 1], [0, 1, 0], [1, 0, 1], [0, 1, 0], [1, 0, 1]]


def test_the_model_engine_has_warp_one() -> None:
    obs, mod = _sums(_work(LENGTHS, LANES, CURVE))
    assert obs == pytest.approx(mod, rel=1e-12)
    done = request_finish(np.array(LENGTHS), np.array(LANES), CURVE, 0, 0).max(1)
    assert mod.sum() == pytest.approx(done.max() - done.min())  # the gaps from the first completion to the last


def test_warp_sums_equal_the_gaps_one_by_one() -> None:
    work = _work(LENGTHS, LANES, TILTED)
    got = _sums(work)
    want = _brute(work, CURVE)
    assert got[0] == pytest.approx(want[0], rel=1e-12, abs=1e-15)
    assert got[1] == pytest.approx(want[1], rel=1e-12, abs=1e-15)
    f = warp_factors(learn_warp(ControlState(q=0, m=0), got, 0.3))
    assert f is not None and f[0] < f[1]  # the tilted engine: faster than believed at batch 1 than at 2-3


def test_a_uniformly_slower_engine_warps_every_bin_alike() -> None:
    obs, mod = _sums(_work(LENGTHS, LANES, CURVE.scaled(1.3)))
    seen = mod > 0
    assert (obs[seen] / mod[seen]) == pytest.approx(np.full(seen.sum(), 1.3), rel=1e-12)


def test_factors_are_the_weighted_line_through_the_log_warps_and_warp_the_curve() -> None:
    s = ControlState(q=0, m=0)
    assert warp_factors(s) is None and warped(CURVE, None) is CURVE
    obs, mod = np.zeros(BINS), np.zeros(BINS)
    obs[[1, 4]], mod[[1, 4]] = (3.0, 1.0), (2.0, 2.0)  # warps 1.5 at bin 1 and 0.5 at bin 4, equal weights
    s = learn_warp(s, (obs, mod), 0.3)
    f = warp_factors(s)
    third = 1 / 3
    want = [1.5, 1.5, 1.5 * third ** (1 / 3), 1.5 * third ** (2 / 3)] + [0.5] * (BINS - 4)  # clamped outside 1..4
    assert f is not None and f.tolist() == pytest.approx(want)
    obs2, mod2 = np.zeros(BINS), np.zeros(BINS)
    obs2[[2, 3]], mod2[[2, 3]] = (0.0, 2.0), (1.0, 1.0)  # bin 2: the engine spent nothing there, not a measurement
    s2 = learn_warp(s, (obs2, mod2), 0.5)  # decayed sums: bin 1 1.5/1, bin 3 2/1, bin 4 0.5/1 (bin 2 0/1 left out)
    k, y = np.array([1.0, 3.0, 4.0]), np.log([1.5, 2.0, 0.5])  # equal weights (modelled 1 s each)
    beta = float(((k - k.mean()) * (y - y.mean())).sum() / ((k - k.mean()) ** 2).sum())
    alpha = float(y.mean() - beta * k.mean())
    assert warp_factors(s2) == pytest.approx(np.exp(alpha + beta * np.clip(np.arange(BINS), 1, 4)))
    assert bin_of(np.array([0.5, 1, 1.9, 2, 1023, 1024, 1e9])).tolist() == [0, 0, 0, 1, 9, 10, 10]
    w2 = warped(CURVE, f)
    assert w2.tpot_ms == pytest.approx([t * f[bin_of(np.array([float(b)]))[0]] for b, t in
                                       zip(CURVE.batch, CURVE.tpot_ms, strict=True)])


def test_step_work_carries_the_completions_and_the_controller_learns_a_slower_engine() -> None:
    """A static split on an engine 1.25× slower than believed: the warp the controller learns is 1.25 in every bin it
    measured, and the curves it prices on are the believed ones × 1.25."""
    rc = RouterConfig(groups=12, group_size=4, replicas=4, rho=0.25)
    wl = load_workload("synthetic-math", seed=3)
    ctl = make_controller("tailsieve", rc, bulk_curve=CURVE)
    loop = StepLoop(Router(rc, wl.prompts), ctl)
    ex = SimExecutor(wl, CURVE.scaled(1.25), rc, ReplicaConfig())
    state = loop.initial()
    for _ in range(3):
        out = loop.step(state, ex)
        work = step_work(out.plan, out.result)
        assert work.done_s is not None
        assert np.isnan(work.done_s[~work.kept]).all() and np.isfinite(work.done_s[work.kept]).all()
        state = out.state
    f = warp_factors(state.control)
    assert f is not None and f == pytest.approx(np.full(BINS, 1.25), rel=1e-9)
    _, bulk = ctl.curves(state.control)
    assert bulk.tpot_ms == pytest.approx([t * 1.25 for t in CURVE.tpot_ms], rel=1e-9)


def test_saved_warp_sums_round_trip_and_bad_ones_are_one_line() -> None:
    s = ControlState(q=2, m=1, warp_observed=(1.0, 0.0, 2.5), warp_modelled=(1.0, 0.0, 2.0))
    back = ControlState.from_json(json.loads(json.dumps(s.to_json())))
    assert (back.warp_observed, back.warp_modelled) == (s.warp_observed, s.warp_modelled)
    bad = s.to_json()
    bad["warp_observed"] = [1.0, -2.0]
    with pytest.raises(ConfigError, match=r"control.warp_observed\[1\]"):
        ControlState.from_json(bad)
    bad["warp_observed"] = "fast"
    with pytest.raises(ConfigError, match="control.warp_observed must be a list"):
        ControlState.from_json(bad)
