"""Bias-correction weights (`tailsieve.analysis.weights`): exact weights on hand-built histories, normalization and
clipping, determinism, the ESS formula, the report keys (only when on) and the rollout batch files' `weight`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from engine_fake import FakeServer
from tailsieve.analysis.report import report_json
from tailsieve.analysis.weights import (
    BiasWeights,
    WeightConfig,
    WeightObservation,
    WeightState,
    kish_ess,
    observe,
    weighted_bias,
)
from tailsieve.cli import main
from tailsieve.errors import ConfigError
from tailsieve.model.curve_names import load_curve
from tailsieve.policy.router import RouterConfig
from tailsieve.policy.step import GroupOutcome, GroupRef, GroupStatus, Pool
from tailsieve.simulation.runs import SimConfig, run_policies
from tailsieve.workloads import load_workload


def obs(consumed: list[float], first: list[bool], censored: list[float]) -> WeightObservation:
    return WeightObservation(np.array(consumed, dtype=np.float64), np.array(first, dtype=bool),
                             np.array(censored, dtype=np.float64))


def test_no_cuts_gives_exactly_one() -> None:
    est = BiasWeights()
    state = est.initial()
    for k in range(3):
        state, w = est.update(state, obs([1.0 + k, 5.0, 9.0, 2.0], [True] * 4, []))
        assert w.tolist() == [1.0, 1.0, 1.0, 1.0]
    assert len(state.history) == 3


def test_known_density_ratio_gives_the_expected_weights() -> None:
    # two bins split at the median 2.5 of the consumed pool [1, 2, 3, 4]; first attempts 1, 2 (bin 0) and 3 (bin 1)
    # completed, a fourth first attempt cut at 2.5 (mass to the completed first attempt above it: 3, bin 1); the
    # consumed 4 is a later attempt. Target (2, 2)/4 = (1/2, 1/2), consumed (2, 2)/4: ratio 1 in both bins.
    est = BiasWeights(WeightConfig(bins=2, clip=(0.01, 100.0)))
    _, w = est.update(WeightState(), obs([1.0, 2.0, 3.0, 4.0], [True, True, True, False], [2.5]))
    assert w.tolist() == [1.0, 1.0, 1.0, 1.0]
    # cut at 0.5 instead: its mass spreads over the first attempts above it, 1, 2 (bin 0) and 3 (bin 1) → target
    # (2 + 2/3, 1 + 1/3)/4 = (2/3, 1/3); consumed (1/2, 1/2); raw ratio (4/3, 2/3), mean over the batch 1 already
    _, w = est.update(WeightState(), obs([1.0, 2.0, 3.0, 4.0], [True, True, True, False], [0.5]))
    np.testing.assert_allclose(w, [4 / 3, 4 / 3, 2 / 3, 2 / 3], rtol=1e-12)


def test_a_cut_beyond_every_completed_first_attempt_goes_to_the_top_bin() -> None:
    # pool [1, 2, 3, 10]: bins split at 2.5; first attempts 1, 2, 3 completed, one cut at 5 (no completed first
    # attempt above): top bin. Target (2, 2)/4, consumed (2, 2)/4 → ones.
    est = BiasWeights(WeightConfig(bins=2))
    _, w = est.update(WeightState(), obs([1.0, 2.0, 3.0, 10.0], [True, True, True, False], [5.0]))
    assert w.tolist() == [1.0, 1.0, 1.0, 1.0]


def test_clipping_then_normalization_to_mean_one() -> None:
    # one bin per group: pool [1, 2, 3, 4] (4 quantile bins), first attempts 1, 2, 3; three cuts at 2.5 all go to
    # 3 (bin 2): target (1, 1, 4, 0)/6, consumed 1/4 each → raw (2/3, 2/3, 8/3, 0) → clip [0.5, 2] → (2/3, 2/3, 2,
    # 0.5), then divided by its mean
    est = BiasWeights(WeightConfig(bins=4, clip=(0.5, 2.0)))
    _, w = est.update(WeightState(), obs([1.0, 2.0, 3.0, 4.0], [True, True, True, False], [2.5, 2.5, 2.5]))
    clipped = np.array([2 / 3, 2 / 3, 2.0, 0.5])
    np.testing.assert_allclose(w, clipped / clipped.mean(), rtol=1e-12)
    assert float(w.mean()) == pytest.approx(1.0, abs=1e-12)


def test_window_keeps_the_last_history_steps_and_is_deterministic() -> None:
    est = BiasWeights(WeightConfig(history=2, bins=2))
    steps = [obs([1.0, 2.0, 3.0, 4.0], [True, True, True, False], [0.5]),
             obs([1.0, 5.0, 2.0, 6.0], [True, False, True, True], [3.0]),
             obs([2.0, 2.0, 7.0, 1.0], [True, True, True, True], [])]
    runs = []
    for _ in range(2):
        state, ws = est.initial(), []
        for o in steps:
            state, w = est.update(state, o)
            ws.append(w.tolist())
        runs.append(ws)
        assert state.history == tuple(steps[1:])
    assert runs[0] == runs[1]


def test_config_is_validated() -> None:
    with pytest.raises(ConfigError):
        WeightConfig(history=0)
    with pytest.raises(ConfigError):
        WeightConfig(clip=(1.5, 5.0))


def test_kish_ess_and_weighted_mean() -> None:
    assert kish_ess(np.array([1.0, 1.0, 1.0, 1.0])) == 4.0
    assert kish_ess(np.array([2.0, 0.0])) == 1.0
    assert kish_ess(np.array([3.0, 1.0])) == 16.0 / 10.0
    batches = [np.array([[1, 3], [5, 7]], dtype=np.int64)]  # group totals 4 and 12, G = 2
    wb = weighted_bias(batches, [np.array([1.5, 0.5])], reference_mean=4.0)
    assert wb.weighted_mean_ratio == (1.5 * 4 + 0.5 * 12) / (2 * 2.0) / 4.0
    assert wb.ess_ratio == (2.0 ** 2 / 2.5) / 2


def test_observe_reads_first_attempts_and_cut_progress() -> None:
    def out(uid: int, cuts: int, status: GroupStatus, lengths: tuple[int, ...]) -> GroupOutcome:
        return GroupOutcome(GroupRef(uid, f"p{uid}", cuts), Pool.BULK, status, 1.0, lengths, 2)

    done = [out(0, 0, GroupStatus.DONE, (2, 4)), out(1, 1, GroupStatus.DONE, (6, 8))]
    cut = [out(2, 0, GroupStatus.ABORTED, (1, 2)), out(3, 1, GroupStatus.ABORTED, (5, 5))]
    o = observe((*done, *cut), done)
    assert o.consumed.tolist() == [4.0, 8.0] and o.first.tolist() == [True, False] and o.censored.tolist() == [2.0]


def sim(bias_correction: bool) -> dict[str, object]:
    cfg = SimConfig(router=RouterConfig(groups=16, group_size=4, replicas=4, max_redraws=8), steps=8, q=2, m=1,
                    bias_correction=bias_correction)
    runs = run_policies(["static"], load_workload("synthetic-math-strong"), load_curve("h100-llama3-8b"), cfg)
    return report_json(runs, {})


def test_report_keys_only_when_on() -> None:
    off, on = sim(False), sim(True)
    pol_off, pol_on = off["policies"], on["policies"]
    assert isinstance(pol_off, dict) and isinstance(pol_on, dict)
    assert "weighted_mean_ratio" not in pol_off["static"]["bias"] and "ess_ratio" not in pol_off["static"]["bias"]
    assert pol_on["uniform"]["bias"]["weighted_mean_ratio"] == pytest.approx(1.0, rel=1e-12)
    assert pol_on["uniform"]["bias"]["ess_ratio"] == 1.0
    b = pol_on["static"]["bias"]
    assert 0.5 < b["ess_ratio"] < 1.0 and b["weighted_mean_ratio"] > b["mean_ratio"]  # cuts happened: weights moved
    assert {k: v for k, v in b.items() if k not in ("weighted_mean_ratio", "ess_ratio")} == pol_off["static"]["bias"]


def test_rollout_batch_files_carry_a_weight(tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"question_id": f"q{i}", "question": f"what is {i}+{i}?"}) + "\n"
                               for i in range(30)))
    out = tmp_path / "run"
    with FakeServer() as a, FakeServer() as b:
        rc = main(["rollout", "--endpoints", f"{a.url},{b.url}", "--prompts", str(prompts), "--groups", "4",
                   "--group-size", "3", "--rho", "0.5", "--max-tokens", "30", "--stall-timeout", "2", "--steps", "3",
                   "--policy", "static,uniform", "--bias-correction", "--out", str(out)])
    assert rc == 0
    for step in range(3):
        rows = [json.loads(x) for x in (out / "static" / f"batch-{step:05d}.jsonl").read_text().splitlines()]
        ws = [r["weight"] for r in rows]
        assert len(ws) == 4 and sum(ws) == pytest.approx(4.0, abs=1e-9)
    rep = json.loads((out / "report.json").read_text())
    assert rep["bias_correction"] is True and "ess_ratio" in rep["policies"]["static"]["bias"]
    lines = [json.loads(x) for x in (out / "static" / "steps.jsonl").read_text().splitlines()]
    assert all(len(ln["weights"]) == 4 for ln in lines)
