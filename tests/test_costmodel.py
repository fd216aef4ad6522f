"""The cost model of `tailsieve profile` (issue 13): the least-squares fit recovers known terms exactly, the model
file round-trips and stays a curve file, the terms mean what the replica simulator and the predictor compute, and
`simulate` / `rollout` / `plan` take it (flags override)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tailsieve.cli import main
from tailsieve.engines.rollout.api import Rollout, RolloutConfig
from tailsieve.engines.rollout.prompts import PromptRecord
from tailsieve.errors import CurveError
from tailsieve.model.costmodel import (
    MODEL_FORMAT,
    CostModel,
    DecodePoint,
    PrefillPoint,
    fit_cost_model,
    fit_decode,
    fit_prefill,
    load_cost_model,
)
from tailsieve.model.curve_names import load_curve
from tailsieve.model.curves import TpotCurve
from tailsieve.policy.lanes import lane_finish_times
from tailsieve.policy.router import RouterConfig
from tailsieve.simulation.replica import ReplicaConfig, run_replica
from tailsieve.simulation.runs import SimConfig, run_policy, static_grid
from tailsieve.workloads import load_workload

TAU0 = {1: 2.0, 2: 2.125, 4: 2.25, 8: 2.75, 16: 3.5}  # ms, binary fractions: exact in floating point
KV = 0.0390625  # ms per 1k context tokens per iteration
PRE, OVER = 0.0234375, 12.5


def synthetic(kv: float = KV) -> list[DecodePoint]:
    return [DecodePoint(b, c, t + kv * b * c / 1000.0) for b, t in TAU0.items() for c in (128.0, 1152.0, 3200.0)]


def test_fit_recovers_known_terms_exactly() -> None:
    batch, tau, kv = fit_decode(synthetic())
    assert batch == tuple(TAU0)
    np.testing.assert_allclose(tau, list(TAU0.values()), rtol=1e-12)
    assert kv == pytest.approx(KV, rel=1e-10)
    per, over = fit_prefill([PrefillPoint(p, OVER + PRE * p) for p in (16, 1040, 3088)])
    assert per == pytest.approx(PRE, rel=1e-10) and over == pytest.approx(OVER, rel=1e-10)


def test_fit_cost_model_residuals_and_terms() -> None:
    m = fit_cost_model(synthetic(), [PrefillPoint(p, OVER + PRE * p) for p in (16, 1040)], name="syn")
    assert m.curve.tpot_ms == tuple(TAU0.values())
    assert m.kv_ms_per_1k == pytest.approx(KV) and m.prefill_ms_per_token == pytest.approx(PRE)
    assert m.request_overhead_ms == pytest.approx(OVER)
    assert len(m.fit["decode"]) == 15 and all(abs(r["residual_ms"]) < 1e-9 for r in m.fit["decode"])
    assert m.fit["decode_rms_rel"] < 1e-9 and len(m.fit["prefill"]) == 2


def test_noisy_fit_is_least_squares_and_negative_kv_is_clamped() -> None:
    rng = np.random.default_rng(0)
    pts = [DecodePoint(p.batch, p.context, p.tpot_ms * (1 + 0.01 * rng.standard_normal())) for p in synthetic()]
    _, _, kv = fit_decode(pts)
    assert kv == pytest.approx(KV, rel=0.3)
    flat = [DecodePoint(b, c, 3.0 - 1e-5 * c) for b in (1, 2) for c in (100.0, 2000.0)]  # faster with context
    _, tau, kv = fit_decode(flat)
    assert kv == 0.0 and np.all(tau > 0)


def test_too_few_points_is_one_line_error() -> None:
    with pytest.raises(CurveError, match="two context lengths"):
        fit_decode([DecodePoint(b, 128.0, 2.0) for b in (1, 2, 4)])  # one context: kv undetermined
    with pytest.raises(CurveError, match="1 measured points for 2 unknowns"):
        fit_prefill([PrefillPoint(100, 5.0)])
    with pytest.raises(CurveError, match="no decode points"):
        fit_decode([])


def test_terms_mean_what_the_replica_simulator_computes() -> None:
    """b equal requests (prompt P, L tokens): the replica's makespan is L iterations at the model's per-token time for
    the mean context P + (L − 1)/2 (the profile's P + L/2 is the same mean over iterations 1..L − 1)."""
    model = CostModel(TpotCurve("t", tuple(TAU0), tuple(TAU0.values())), KV, PRE)
    b, p, length = 8, 1000, 200
    cfg = ReplicaConfig(kv_ms_per_1k_tokens=model.kv_ms_per_1k, prefill_ms_per_token=model.prefill_ms_per_token)
    run = run_replica([length] * b, model.curve, cfg, prompt_tokens=[p] * b)
    want = (length * model.tpot_ms(b, p + (length - 1) / 2) + PRE * b * p) / 1000.0
    assert run.makespan == pytest.approx(want, rel=1e-12)
    fin = lane_finish_times(np.full(b, float(length)), np.zeros(b, np.int64), 1, model.curve, model.kv_s_per_token)
    no_prompt = run_replica([length] * b, model.curve, ReplicaConfig(kv_ms_per_1k_tokens=KV))
    assert fin.max() == pytest.approx(no_prompt.makespan, rel=1e-12)  # the predictor: same kv term


def test_model_file_round_trip_and_plain_curve_readers(tmp_path: Path) -> None:
    m = fit_cost_model(synthetic(), [PrefillPoint(p, OVER + PRE * p) for p in (16, 1040)], name="syn")
    path = tmp_path / "model.json"
    path.write_text(json.dumps(m.to_json()))
    back = load_cost_model(str(path))
    assert back == CostModel(back.curve, m.kv_ms_per_1k, m.prefill_ms_per_token, m.request_overhead_ms)
    assert back.curve.tpot_ms == m.curve.tpot_ms and back.fit["decode"] == m.fit["decode"]
    assert json.loads(path.read_text())["cost_model"]["format"] == MODEL_FORMAT
    assert load_curve(str(path)).tpot_ms == m.curve.tpot_ms  # a plain-curve reader still reads it
    assert main(["curves", str(path), "--json"]) == 0
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps({"batch": [1, 8], "tpot_ms": [2.0, 3.0]}))
    pm = load_cost_model(str(plain))
    assert (pm.kv_ms_per_1k, pm.prefill_ms_per_token) == (0.0, 0.0) and pm.curve.batch == (1, 8)
    assert load_cost_model("h100-llama3-8b").curve is load_curve("h100-llama3-8b")


@pytest.mark.parametrize("terms, match", [
    ([1], "must be an object"),
    ({"kv_ms_per_1k": -1}, "kv_ms_per_1k must be a number"),
    ({"prefill_ms_per_token": "x"}, "prefill_ms_per_token must be a number"),
    ({"kv_ms_per_1k": float("inf")}, "Infinity is not a JSON number"),
    ({"kv_ms_per_1k": 1e7}, "kv_ms_per_1k must be a number"),
    ({"format": "other/9"}, "is not"),
])
def test_malformed_model_file(tmp_path: Path, terms: object, match: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"batch": [1], "tpot_ms": [2.0], "cost_model": terms}))
    with pytest.raises(CurveError, match=match):
        load_cost_model(str(path))


def _sim(curve: str, *flags: str, capsys: pytest.CaptureFixture[str]) -> float:
    argv = ["simulate", "--curve", curve, "--json", "--steps", "4", "--groups", "8", "--group-size", "4",
            "--replicas", "2", "--policy", "uniform", "--workload", "synthetic-math", *flags]
    assert main(argv) == 0
    return float(json.loads(capsys.readouterr().out)["policies"]["uniform"]["mean_step_s"])


def test_simulate_takes_the_model_and_flags_override(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    curve = TpotCurve("c", (1, 16, 64), (8.0, 11.0, 18.0))
    model, plain = tmp_path / "m.json", tmp_path / "p.json"
    model.write_text(json.dumps(CostModel(curve, 0.5, 0.0).to_json()))
    plain.write_text(json.dumps(curve.to_json()))
    with_model = _sim(str(model), capsys=capsys)
    assert with_model == _sim(str(plain), "--kv-ms-per-1k", "0.5", capsys=capsys)
    assert _sim(str(model), "--kv-ms-per-1k", "0", capsys=capsys) == _sim(str(plain), capsys=capsys) < with_model


def test_rollout_controller_uses_the_model_kv_term(tmp_path: Path) -> None:
    model = tmp_path / "m.json"
    model.write_text(json.dumps(CostModel(TpotCurve("c", (1, 8), (2.0, 3.0)), 0.25, 0.01).to_json()))
    prompts = [PromptRecord(f"p{i}", "hi") for i in range(8)]
    r = Rollout(["http://127.0.0.1:9", "http://127.0.0.1:10"], RolloutConfig(groups=2, group_size=2, curve=model),
                prompts)
    assert r.controller.kv_s_per_token == pytest.approx(0.25e-6)
    r2 = Rollout(["http://127.0.0.1:9", "http://127.0.0.1:10"],
                 RolloutConfig(groups=2, group_size=2, curve=model, kv_ms_per_1k=0.0), prompts)
    assert r2.controller.kv_s_per_token == 0.0


def test_plan_best_static_is_the_brute_force_minimum(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "--curve", "h100-llama3-8b", "--workload", "synthetic-math", "--replicas", "3", "--groups", "6",
            "--group-size", "2", "--rho", "0.34", "--steps", "5", "--json"]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    work = load_workload("synthetic-math", mode="resample", seed=0)
    cfg = SimConfig(router=RouterConfig(groups=6, group_size=2, replicas=3, rho=0.34), steps=5)
    means = {(q, m): run_policy("static", work, load_curve("h100-llama3-8b"),
                                SimConfig(router=cfg.router, steps=5, q=q, m=m)).mean_step_s()
             for q in range(1, cfg.router.extra + 1) for m in (1, 2)}
    q, m = min(means, key=lambda k: (means[k], k))
    assert (doc["best_static"]["q"], doc["best_static"]["m"]) == (q, m)
    assert doc["best_static"]["mean_step_s"] == pytest.approx(means[(q, m)])
    assert len(doc["static_grid"]) == len(means) == cfg.router.extra * 2
    uni = run_policy("uniform", work, load_curve("h100-llama3-8b"), cfg).mean_step_s()
    assert doc["uniform_mean_step_s"] == pytest.approx(uni)
    assert doc["best_static"]["speedup"] == pytest.approx(uni / means[(q, m)])
    assert set(doc["tailsieve"]["bias"]) >= {"mean_ratio", "ks", "truncated_ratio"}
    assert doc["max_redraws"] == 1 and isinstance(doc["pays"], bool)
    grid = static_grid(work, load_curve("h100-llama3-8b"), cfg)
    assert (grid.q, grid.m) == (q, m)


def test_plan_prints_the_answer(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--workload", "synthetic-math", "--replicas", "3", "--groups", "6", "--group-size", "2",
                 "--steps", "4"]) == 0
    out = capsys.readouterr().out
    assert "best static split: q = " in out and "adaptive tailsieve:" in out


@pytest.mark.parametrize("argv, match", [
    (["plan", "--replicas", "1"], "--replicas 1: plan weighs a tail pool against the bulk, which needs at least 2 "
                                  "replicas (a tail and a bulk pool)"),
    (["plan", "--curve", "/nope/model.json"], "unknown curve"),
    (["plan", "--steps", "0"], "--steps"),
    (["plan", "--kv-ms-per-1k", "nan"], "--kv-ms-per-1k"),
])
def test_plan_errors_are_one_line(argv: list[str], match: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tailsieve plan: error:") and match in err[0]


def test_profile_cli_bad_contexts_and_unreachable_server(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = str(tmp_path / "m.json")
    assert main(["profile", "--endpoint", "http://127.0.0.1:9", "--contexts", "x", "--out", out]) != 0
    assert main(["profile", "--endpoint", "http://127.0.0.1:9", "--contexts", "0,512", "--batches", "1",
                 "--retries", "0", "--out", out]) != 0
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2 and all(x.startswith("tailsieve profile: error:") for x in lines)
    assert "--contexts" in lines[0] and not Path(out).exists()
