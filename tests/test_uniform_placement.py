"""The uniform boundary as a placement choice (issue 22 item 3): whole groups (one prompt prefill per group, the
paper's uniform group routing) or dealt requests (what verl's balancer does; each replica a group reaches prefills
its prompt again). The simulator prices the prefill per prompt per replica, the predictor forecasts both, and
`tailsieve` picks the faster."""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from conftest import make_curve
from tailsieve.loop import SKIP_STEPS, make_controller
from tailsieve.model.curve_names import load_curve
from tailsieve.policy.control_state import ControlState
from tailsieve.policy.decision import Decision, Reason
from tailsieve.policy.lanes import lane_prefill, round_robin_lanes
from tailsieve.policy.paired import paired_gain
from tailsieve.policy.predictor import Predictor, PredictorFacts
from tailsieve.policy.router import Dispatch, Router, RouterConfig
from tailsieve.simulation.executor import shared_prefill
from tailsieve.simulation.replica import ReplicaConfig
from tailsieve.simulation.runs import SimConfig, prompt_prefill_s, run_policy
from tailsieve.workloads import load_workload

FLAT = make_curve(batch=(1,), tpot_ms=(1.0,), name="flat")


@pytest.mark.parametrize(("p", "g", "lanes", "by_request", "want"), [
    (5, 4, 2, False, [3, 2]),  # groups 0, 2, 4 on lane 0
    (5, 4, 2, True, [5, 5]),  # every group reaches both lanes
    (3, 2, 4, True, [2, 2, 1, 1]),  # requests 0..5: groups {0,0,1,1,2,2} on lanes {0,1,2,3,0,1}
])
def test_lane_prefill_counts_one_prefill_per_group_per_lane(p: int, g: int, lanes: int, by_request: bool,
                                                            want: list[int]) -> None:
    got = lane_prefill(round_robin_lanes(p, g, lanes, by_request), lanes, 0.25)
    assert got.tolist() == pytest.approx([0.25 * w for w in want])


def test_the_simulator_prefills_a_prompt_once_per_replica() -> None:
    """Requests of one group on one replica share the prompt's prefill (prefix cache): only the first pays."""
    place = np.array([[0, 0, 1], [1, 1, 1]])
    tokens = np.array([100, 100, 100, 7, 7, 7])
    assert shared_prefill(tokens, place).tolist() == [100, 0, 100, 7, 0, 0]


def test_router_deals_a_uniform_step_by_request_when_asked() -> None:
    rc = RouterConfig(groups=3, group_size=2, replicas=4, rho=0.0)
    router = Router(rc, [f"p{i}" for i in range(10)])
    grouped = router.plan(router.initial_state(), 0, 0)
    dealt = router.plan(router.initial_state(), 0, 0, uniform_dispatch=Dispatch.REQUEST)
    assert [grouped.placement[r.uid] for r in grouped.bulk] == [(0, 0), (1, 1), (2, 2)]
    assert [dealt.placement[r.uid] for r in dealt.bulk] == [(0, 1), (2, 3), (0, 1)]


def _controller(prefill_s: float):  # type: ignore[no-untyped-def]
    rc = RouterConfig(groups=8, group_size=4, replicas=4, rho=0.25)
    # a τ(b) that rises with the batch: at a flat τ a lane's time is its longest request, wherever the others go
    return make_controller("tailsieve", rc, bulk_curve=make_curve(), prefill_s=prefill_s)


def test_tailsieve_deals_requests_unless_the_prefill_makes_splitting_a_group_dearer() -> None:
    """Groups of very unequal work: dealing balances them (one long group spread over four replicas); a prompt
    prefill that costs more than the imbalance makes whole groups the faster placement."""
    hist = np.array([[400, 400, 400, 400]] * 3 + [[10, 10, 10, 10]] * 5, dtype=np.int64)  # every pool draws a long one
    for prefill_s, want in ((0.0, "request"), (5.0, "group")):
        c = _controller(prefill_s)
        other = "group" if want == "request" else "request"
        s = ControlState(q=0, m=0, history=(hist,) * 4, uniform_dispatch=other, calib_uniform=1.0,
                         calib_group=1.0)  # both placements measured (no probe), at the model's own error
        pred = c.predictor(s)
        assert np.mean(c.times(s, pred, 0, 0, want)) < np.mean(c.times(s, pred, 0, 0, other))
        out = c.decide(s, pred)
        # the paired rule switches the placement: its gain is the paired one over the four history steps
        g, se, _ = paired_gain(c.times(s, pred, 0, 0, other), c.times(s, pred, 0, 0, want), 4)
        assert (out.q, out.m, out.uniform_dispatch) == (0, 0, want)
        assert out.decision == Decision(0, 0, Reason.PLACEMENT, (0, 0), g, se, 0.0)
        kept = c.decide(replace(s, uniform_dispatch=want), pred)  # already there: no placement move
        assert kept.uniform_dispatch == want and kept.decision is not None and not kept.decision.moved
    assert _controller(0.0).initial().uniform_dispatch == "request"
    assert _controller(1.0).initial().uniform_dispatch == "group"
    assert make_controller("uniform", RouterConfig(), bulk_curve=FLAT).initial().uniform_dispatch == "group"


def test_uniform_forecast_by_request_is_the_exact_dealt_makespan() -> None:
    """The predictor's dealt-uniform forecast equals the all-admit makespan of its own pools dealt request by
    request, prefill included."""
    rng = np.random.default_rng(2)
    hist = rng.integers(1, 300, size=(16, 4)).astype(np.int64)
    p = Predictor(hist, PredictorFacts(groups=8, extra=2, replicas=3, curve=FLAT, resamples=3, prefill_s=0.5))
    lanes = round_robin_lanes(8, 4, 3, True)
    pre = lane_prefill(lanes, 3, 0.5)
    want = [max(float(pool[lanes == k].max()) * 1e-3 + pre[k] for k in range(3)) for pool in p.fresh]
    assert p.uniform_times(True).tolist() == pytest.approx(want)


def test_where_isolation_cannot_pay_tailsieve_is_verls_balancer_step_for_step() -> None:
    """On a trace where 80% of responses hit the cap, `tailsieve` never leaves the uniform boundary; dealing requests
    there, every step is exactly verl-lif's (the same requests on the same replicas) but the one step that probes
    whole groups, which is exactly uniform's; its mean beats uniform's."""
    rows = ["prompt_id,sample,length"]
    rng = np.random.default_rng(0)
    for i in range(64):
        for s in range(3):
            rows.append(f"p{i},{s},{2048 if rng.random() < 0.8 else int(rng.integers(100, 2048))}")
    path = Path(tempfile.mkdtemp()) / "capped.csv"
    path.write_text("\n".join(rows) + "\n")
    wl = load_workload(path, mode="resample", seed=0)
    cfg = SimConfig(router=RouterConfig(groups=16, group_size=4, replicas=4), steps=8)
    curve = load_curve("h100-llama3-8b")
    ts, lif = run_policy("tailsieve", wl, curve, cfg), run_policy("verl-lif", wl, curve, cfg)
    uni = run_policy("uniform", wl, curve, cfg)
    assert all(r.m == 0 for r in ts.steps)
    probes = [k + 1 for k, r in enumerate(ts.steps) if r.decision is not None and r.decision.reason is Reason.PROBE]
    assert probes == [2]  # after two history steps, once
    for k, r in enumerate(ts.steps):
        want = uni.steps[k] if k in probes else lif.steps[k]
        assert r.makespan_s == pytest.approx(want.makespan_s, rel=1e-12), k
    assert ts.mean_step_s(SKIP_STEPS) < uni.mean_step_s(SKIP_STEPS)


def test_the_simulation_prices_the_prefill_from_the_workloads_prompts() -> None:
    wl = load_workload("kodcode-r1", seed=0)
    tokens = [wl.prompt_tokens(p) or 0 for p in wl.prompts]
    assert prompt_prefill_s(wl, ReplicaConfig(prefill_ms_per_token=0.02)) == pytest.approx(np.mean(tokens) * 2e-5)
    assert prompt_prefill_s(wl, ReplicaConfig()) == 0.0
