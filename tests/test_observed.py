"""The model on a step's own requests (`policy.observed`): it must equal the simulator's pool times exactly, so the
calibration it feeds measures the model's error and nothing else (issue 22)."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import make_curve
from tailsieve.loop import StepLoop, make_controller, step_work
from tailsieve.policy.observed import observed_times, pool_finish
from tailsieve.policy.router import Dispatch, Router, RouterConfig
from tailsieve.simulation.executor import SimExecutor
from tailsieve.simulation.replica import ReplicaConfig
from tailsieve.workloads import load_workload

CURVE = make_curve()
FAST_TAIL = make_curve(tpot_ms=(4.0, 6.0, 9.0, 14.0), name="fast-tail")


@pytest.mark.parametrize("kv", [0.0, 0.05])
@pytest.mark.parametrize("m", [0, 2])
def test_observed_times_equal_the_simulated_pools(kv: float, m: int) -> None:
    """Warm-up, then two-pool steps with pinned candidates (max_redraws 1) or uniform steps: the model on each step's
    requests (cut ones stopped at their progress) gives the simulator's T_tail and T_bulk: exactly where nothing is
    pinned, else within one decode iteration (a cut request's progress counts whole tokens, so in the model it leaves
    at the end of its last whole token, up to one iteration before the cutoff)."""
    rc = RouterConfig(groups=12, group_size=4, replicas=4, rho=0.25)
    wl = load_workload("synthetic-math", seed=3)
    ctl = make_controller("static", rc, bulk_curve=CURVE, tail_curve=FAST_TAIL, q=2, m=m, kv_s_per_token=kv / 1e6)
    loop = StepLoop(Router(rc, wl.prompts), ctl)
    ex = SimExecutor(wl, CURVE, rc, ReplicaConfig(kv_ms_per_1k_tokens=kv), tail_curve=FAST_TAIL)
    state = loop.initial()
    pinned_seen = 0
    for _ in range(5):
        out = loop.step(state, ex)
        state = out.state
        pinned_seen += len(out.plan.pinned)
        tail, bulk = observed_times(step_work(out.plan, out.result), tail_curve=FAST_TAIL, bulk_curve=CURVE,
                                    kv_s_per_token=kv / 1e6)
        assert tail == pytest.approx(out.result.tail_s, rel=1e-9, abs=1e-9)
        one_iteration = CURVE.tpot_s(4 * 12 * 2) + kv / 1e6 * 16384 * 48
        assert bulk == pytest.approx(out.result.bulk_s, rel=1e-9) if not out.plan.pinned else \
            abs(bulk - out.result.bulk_s) <= one_iteration
    assert m == 0 or pinned_seen > 0  # the pinned path was exercised


def test_pool_finish_prefills_a_prompt_once_per_replica_it_reaches() -> None:
    """Two groups of two requests on two replicas, dealt by request: each replica prefills both prompts (2 × p);
    by group: one prompt each (p). Lengths 10 and 20 at a flat τ = 1 ms."""
    flat = make_curve(batch=(1,), tpot_ms=(1.0,), name="flat")
    lengths = np.array([[10, 20], [10, 20]])
    dealt = np.array([[0, 1], [0, 1]])
    grouped = np.array([[0, 0], [1, 1]])
    p = 0.5
    assert pool_finish(lengths, dealt, flat, 0.0, p).tolist() == pytest.approx([0.02 + 2 * p] * 2)
    assert pool_finish(lengths, grouped, flat, 0.0, p).tolist() == pytest.approx([0.02 + p] * 2)


def test_step_work_records_cut_progress_and_lanes() -> None:
    """A warm-up: N + E groups, the E cut ones report their tokens at the cutoff and are not kept."""
    rc = RouterConfig(groups=8, group_size=2, replicas=2, rho=0.25)
    wl = load_workload("kodcode-r1", seed=0)
    loop = StepLoop(Router(rc, wl.prompts), make_controller("static", rc, bulk_curve=CURVE, q=1, m=1))
    out = loop.step(loop.initial(), SimExecutor(wl, CURVE, rc))
    w = step_work(out.plan, out.result)
    assert w.lengths.shape == (10, 2) and w.tail == 0 and int(w.kept.sum()) == 8
    cut = [o for o in out.result.outcomes if not o.lengths or o.status.value != "done"]
    assert sorted(tuple(r) for r in w.lengths[~w.kept].tolist()) == sorted(tuple(o.lengths) for o in cut)
    assert set(w.lanes.ravel().tolist()) == {0, 1}
    assert Dispatch.REQUEST is rc.dispatch  # the warm-up dealt requests: both replicas within a group
    assert bool((w.lanes[:, 0] != w.lanes[:, 1]).all())
