"""`simulation.predict.predict_step`: one step's prediction on a model file's paged engine and on the all-admit
engine, for requests already placed on replicas (what the engine-fidelity bench compares with real steps)."""

from __future__ import annotations

import numpy as np
import pytest

from tailsieve.errors import ConfigError
from tailsieve.model.costmodel import CostModel
from tailsieve.model.curve_names import load_curve
from tailsieve.model.engine import EngineTruth, FleetSpeed
from tailsieve.model.makespan import makespan
from tailsieve.simulation.predict import predict_step
from tailsieve.simulation.replica import ReplicaConfig, run_replica

CURVE = load_curve("h100-llama3-8b")


def test_all_admit_prediction_is_the_closed_form_per_replica() -> None:
    lens = [30, 5, 12, 40, 7, 9]
    reps = [0, 1, 0, 1, 1, 0]
    model = CostModel(CURVE, engine=EngineTruth(kv_tokens=64, block_size=4))
    got = predict_step(lens, reps, model, all_admit=True)
    want = [makespan([30, 12, 9], CURVE), makespan([5, 40, 7], CURVE)]
    assert got.replica_s == pytest.approx(want)
    assert got.makespan_s == pytest.approx(max(want))
    assert (got.preemptions, got.recomputed_tokens, got.prefix_hit_tokens) == (0, 0, 0)


def test_kv_aware_prediction_is_the_paged_replica_with_speeds() -> None:
    lens, prompts, groups, reps = [30, 30, 12, 40], [20, 20, 8, 8], [0, 0, 1, 1], [0, 0, 1, 1]
    engine = EngineTruth(kv_tokens=96, block_size=4, prefix_caching=True, speed=FleetSpeed(factors=(1.0, 0.8)))
    model = CostModel(CURVE, prefill_ms_per_token=0.5, engine=engine)
    got = predict_step(lens, reps, model, prompt_tokens=prompts, group_of=groups)
    cfg = ReplicaConfig(prefill_ms_per_token=0.5, kv_tokens=96, block_size=4, prefix_caching=True)
    r0 = run_replica([30, 30], CURVE, cfg, [20, 20], prefix_keys=[0, 0])
    r1 = run_replica([12, 40], CURVE, cfg, [8, 8], prefix_keys=[1, 1])
    assert got.replica_s == pytest.approx((r0.makespan, r1.makespan / 0.8))
    assert got.prefix_hit_tokens == r0.counts()[2] + r1.counts()[2] > 0
    assert got.preemptions == r0.counts()[0] + r1.counts()[0]
    assert np.isfinite(got.finish_s).all()


def test_bad_shapes_are_one_line() -> None:
    with pytest.raises(ConfigError, match="replica_of"):
        predict_step([1, 2], [0], CostModel(CURVE))
