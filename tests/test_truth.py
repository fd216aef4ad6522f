"""Truth apart from belief: the model file's engine keys, `simulate`/`plan --truth` and the truth flags, every
policy on the truth while the controller prices with `--curve`, and the engine counts in `--json` steps."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tailsieve.cli import main
from tailsieve.errors import CurveError
from tailsieve.model.costmodel import CostModel, load_cost_model, model_from_json
from tailsieve.model.curve_names import load_curve
from tailsieve.model.engine import EngineTruth, FleetSpeed
from tailsieve.policy.router import RouterConfig
from tailsieve.simulation.replica import ReplicaConfig
from tailsieve.simulation.runs import SimConfig, policy_spec, run_policy
from tailsieve.workloads import load_workload

SMALL = ["--groups", "8", "--group-size", "4", "--replicas", "4", "--steps", "4"]
CURVE = {"batch": [1, 8, 32, 64], "tpot_ms": [8.0, 9.0, 12.0, 16.0]}


def write(tmp_path: Path, name: str, terms: dict[str, Any]) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(CURVE | {"cost_model": terms}))
    return path


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    assert main(["simulate", *SMALL, *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_engine_keys_round_trip_through_the_model_file(tmp_path: Path) -> None:
    engine = EngineTruth(kv_tokens=150_000, block_size=16, max_num_batched_tokens=8192, prefix_caching=True,
                         speed=FleetSpeed(factors=(1.0, 0.9), drift=0.05))
    model = CostModel(load_curve("h100-llama3-8b"), kv_ms_per_1k=0.01, engine=engine)
    path = tmp_path / "m.json"
    path.write_text(json.dumps(model.to_json()))
    assert load_cost_model(path).engine == engine
    assert load_cost_model("h100-llama3-8b").engine == EngineTruth()  # absent keys: the all-admit engine


@pytest.mark.parametrize(("terms", "message"), [
    ({"kv_tokens": "x"}, "cost_model.kv_tokens must be an integer"),
    ({"kv_tokens": 8, "block_size": 16}, "cost_model.kv_tokens must be an integer in \\[16"),
    ({"block_size": 0}, "cost_model.block_size"),
    ({"max_num_batched_tokens": -1}, "cost_model.max_num_batched_tokens"),
    ({"prefix_caching": "yes"}, "cost_model.prefix_caching must be true or false"),
    ({"speed_factors": [1.0, 0]}, "cost_model.speed_factors"),
    ({"speed_spread": 0.95}, "cost_model.speed_spread"),
    ({"speed_factors": [1.0], "speed_spread": 0.1}, "both speed_factors and speed_spread"),
    ({"speed_drift": float("nan")}, "cost_model.speed_drift"),
])
def test_bad_engine_keys_are_one_line(terms: dict[str, Any], message: str) -> None:
    with pytest.raises(CurveError, match=message) as e:
        model_from_json(CURVE | {"cost_model": terms}, "m.json")
    assert "\n" not in str(e.value) and "m.json" in str(e.value)


def test_default_truth_is_the_belief(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = write(tmp_path, "m.json", {"kv_ms_per_1k": 0.01})
    plain = run_json(capsys, "--curve", str(path), "--policy", "tailsieve", "--policy", "verl-lif")
    same = run_json(capsys, "--curve", str(path), "--truth", str(path), "--policy", "tailsieve", "--policy", "verl-lif")
    for name in ("uniform", "tailsieve", "verl-lif"):
        assert plain["policies"][name]["steps"] == same["policies"][name]["steps"]
    assert plain["truth"]["kv_tokens"] is None


def test_truth_runs_every_policy_and_steps_carry_engine_counts(capsys: pytest.CaptureFixture[str],
                                                               tmp_path: Path) -> None:
    truth = write(tmp_path, "truth.json", {"kv_tokens": 20_000, "prefix_caching": True, "prefill_ms_per_token": 0.05,
                                           "max_num_batched_tokens": 4096})
    doc = run_json(capsys, "--truth", str(truth), "--policy", "tailsieve", "--policy", "verl-lif",
                   "--policy", "static", "--q", "1", "--m", "1")
    assert doc["truth"]["kv_tokens"] == 20_000 and doc["truth"]["prefix_caching"] is True
    for name, p in doc["policies"].items():
        steps = p["steps"]
        assert all({"preemptions", "recomputed_tokens", "prefix_hit_tokens"} <= set(s) for s in steps)
        assert sum(s["preemptions"] for s in steps) > 0, name  # 20 K tokens of KV for ~18 long requests
        assert sum(s["prefix_hit_tokens"] for s in steps) >= 0
    flags = run_json(capsys, "--kv-tokens", "20000", "--prefix-caching", "--max-num-batched-tokens", "4096",
                     "--prefill-ms-per-token", "0.05", "--curve", str(write(tmp_path, "c.json", {})),
                     "--policy", "verl-lif")
    assert flags["truth"]["kv_tokens"] == 20_000


@pytest.mark.parametrize(("argv", "message"), [
    (["--truth", "/nonexistent/t.json"], "--truth /nonexistent/t.json: no such file"),
    (["--kv-tokens", "3"], "--kv-tokens must be an integer"),
    (["--block-size", "0"], "--block-size must be an integer"),
    (["--max-num-batched-tokens", "0"], "--max-num-batched-tokens must be an integer"),
    (["--speed-spread", "2"], "--speed-spread must be"),
    (["--speed-drift", "-1"], "--speed-drift must be"),
])
def test_bad_truth_flags_are_one_line(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    assert main(["simulate", *SMALL, "--policy", "uniform", *argv]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_controller_prices_with_the_belief_not_the_truth() -> None:
    """The policy's `FleetCost` comes from the belief's terms; the executor runs the truth's curve and replicas."""
    w = load_workload("kodcode-r1", mode="resample")
    belief = load_curve("h100-llama3-8b")
    truth = ReplicaConfig(kv_ms_per_1k_tokens=0.5, kv_tokens=40_000)
    cfg = SimConfig(router=RouterConfig(groups=8, group_size=4, replicas=4), steps=3, replica=truth,
                    belief=ReplicaConfig(), truth_curve=belief.scaled(1.3), speed=FleetSpeed(spread=0.2))
    spec = policy_spec("tailsieve", w, belief, cfg)
    assert spec.cost.kv_s_per_token == 0.0 and spec.cost.bulk_curve == belief
    slow = run_policy("uniform", w, belief, cfg)
    fast = run_policy("uniform", w, belief, replace(cfg, truth_curve=None, replica=ReplicaConfig(),
                                                    speed=FleetSpeed()))
    assert all(a.makespan_s > b.makespan_s for a, b in zip(slow.steps, fast.steps, strict=True))


def test_speeds_are_seeded_and_common_across_policies() -> None:
    sp = FleetSpeed(spread=0.2, drift=0.1)
    a, b = sp.speeds(8, 3, 5), sp.speeds(8, 3, 5)
    assert (a == b).all() and not (a == sp.speeds(8, 3, 6)).all()
    base = FleetSpeed(spread=0.2).speeds(8, 3, 0)
    assert sorted(base) == pytest.approx(sorted(1 - 0.2 * i / 7 for i in range(8)))


def test_plan_takes_the_truth(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    truth = write(tmp_path, "truth.json", {"kv_tokens": 30_000, "speed_spread": 0.1})
    assert main(["plan", "--groups", "8", "--group-size", "4", "--replicas", "3", "--steps", "3", "--truth",
                 str(truth), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["truth"]["kv_tokens"] == 30_000 and doc["truth"]["speed_spread"] == 0.1
