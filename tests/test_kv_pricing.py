"""The controller's engine-aware pricing (issue 48 item 3, controller side): the KV-pressure floor of a pool
(`predictor.kv_floor`) from the KV capacity its model file holds, and the uniform boundary's placement chosen by
modelled cost where the paged truth (prefix caching) makes one placement at least 10% faster than the other."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from tailsieve.loop import make_controller
from tailsieve.model.costmodel import CostModel
from tailsieve.model.curves import TpotCurve
from tailsieve.model.engine import EngineTruth
from tailsieve.policy.control_state import ControlState
from tailsieve.policy.decision import Reason
from tailsieve.policy.lanes import round_robin_lanes
from tailsieve.policy.predictor import Predictor, PredictorFacts, kv_floor
from tailsieve.policy.router import RouterConfig
from tailsieve.simulation.predict import predict_step

STEEP = TpotCurve(name="steep", batch=(1, 4, 16, 64), tpot_ms=(10.0, 14.0, 40.0, 140.0))
FLAT = TpotCurve(name="flat", batch=(1, 64), tpot_ms=(10.0, 11.0))


def test_kv_floor_is_the_throughput_bound_at_the_batch_the_cache_holds() -> None:
    """16 requests of 100 tokens on 2 replicas, prompts of 50: a mean context of 50 + 50 + 1 = 101 tokens, so 404
    tokens of KV hold 4 requests at once: 800 tokens per replica at τ(4)/4 = 3.5 ms each = 2.8 s."""
    pools = np.full((1, 4, 4), 100.0)
    assert kv_floor(pools, 2, STEEP, 404, 50.0) == pytest.approx([800 * 0.014 / 4])
    # unbounded (every request of a replica held at once): the all-admit throughput, below the all-admit makespan
    assert kv_floor(pools, 2, STEEP, 10**9, 50.0) == pytest.approx([800 * STEEP.tpot_s(8) / 8])
    smaller = [float(kv_floor(pools, 2, STEEP, kv, 50.0)[0]) for kv in (10**6, 808, 404, 202, 101)]
    assert smaller == sorted(smaller)  # less KV never prices a pool faster


def test_a_known_kv_capacity_prices_the_bulk_pool_that_overflows() -> None:
    """With the KV capacity known, a split whose bulk pool has fewer replicas (more requests each) costs more, while
    the tail pool of the longest requests on m replicas is priced too; unknown (0), the forecast is all-admit."""
    rng = np.random.default_rng(0)
    hist = rng.integers(200, 4000, size=(64, 8)).astype(np.int64)
    kw = {"groups": 32, "extra": 4, "replicas": 8, "curve": STEEP, "resamples": 8}
    facts = PredictorFacts(**kw)  # type: ignore[arg-type]
    plain, tight = Predictor(hist, facts), Predictor(hist, replace(facts, kv_tokens=5_000, prompt_tokens=500.0))
    for m in (1, 2, 4):
        assert (tight.split_times(4, m) >= plain.split_times(4, m) - 1e-12).all()
    assert (tight.uniform_times(True) >= plain.uniform_times(True)).all()
    assert (tight.uniform_times(True) > plain.uniform_times(True) * 1.05).all()  # 5 K tokens hold ~3 requests: KV-bound
    gap = [float(np.mean(tight.bulk_times(4, m) / plain.bulk_times(4, m))) for m in (1, 4)]
    assert gap[1] >= gap[0]  # fewer bulk replicas, more KV pressure


@pytest.mark.parametrize(("name", "curve", "prefill_ms", "prompt", "hist"), [
    ("request", STEEP, 0.001, 100, [[900] * 4] * 2 + [[30] * 4] * 6),  # cheap prefill, steep curve, uneven groups
    ("group", FLAT, 0.5, 2000, [[400] * 4] * 3 + [[40] * 4] * 5),  # 1 s prompts, a flat curve
])
def test_placement_follows_the_truths_cost(name: str, curve: TpotCurve, prefill_ms: float, prompt: int,
                                           hist: list[list[int]]) -> None:
    """On the paged truth with prefix caching, one placement of a step is >= 10% faster; the controller, whose
    model holds the curve and the prefill term (not the truth's engine), moves the uniform boundary to it."""
    lens = np.array(hist, dtype=np.int64)
    truth = CostModel(curve, prefill_ms_per_token=prefill_ms, engine=EngineTruth(prefix_caching=True, kv_tokens=10**6))
    groups = np.repeat(np.arange(8), 4)
    span = {dealt: predict_step(lens.ravel(), round_robin_lanes(8, 4, 4, dealt).ravel(), truth,
                                prompt_tokens=[prompt] * 32, group_of=groups).makespan_s for dealt in (True, False)}
    faster, slower = (True, False) if name == "request" else (False, True)
    assert span[slower] >= 1.1 * span[faster]
    c = make_controller("tailsieve", RouterConfig(groups=8, group_size=4, replicas=4, rho=0.25), bulk_curve=curve,
                        prefill_s=prompt * prefill_ms / 1e3)
    other = "group" if name == "request" else "request"
    s = ControlState(q=0, m=0, history=(lens,) * 4, uniform_dispatch=other, calib_uniform=1.0,
                     calib_group=1.0)  # both placements measured at the model's own error: priced, not probed
    out = c.decide(s, c.predictor(s))
    assert (out.m, out.uniform_dispatch) == (0, name)
    assert out.decision is not None and out.decision.reason is Reason.PLACEMENT
