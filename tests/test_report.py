"""One report path: `simulate` and `rollout` summarize, serialize and tabulate the same `PolicyRun`s the same way."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest
from rich.console import Console

from tailsieve.analysis.report import (
    COLUMNS,
    fidelity_notes,
    policy_json,
    record_json,
    report_json,
    summarize,
    summary_table,
)
from tailsieve.cli import main
from tailsieve.engines.rollout.runner import report
from tailsieve.loop import PolicyRun, StepRecord
from tailsieve.model.curve_names import load_curve
from tailsieve.policy.router import RouterConfig
from tailsieve.simulation.runs import ORACLES, SimConfig, run_policies
from tailsieve.workloads import ReplayMode, load_workload


def run_of(name: str, makespans: list[float], batches: list[list[list[int]]], wasted: list[int]) -> PolicyRun:
    """A hand-made run: one record per step (keyword arguments), q = m = step index."""
    arrs = tuple(np.array(b, dtype=np.int64) for b in batches)
    steps = tuple(StepRecord(step=i, makespan_s=t, tail_s=0.0, bulk_s=t, q=i, m=i, candidates=0, wasted_tokens=w,
                             batch_mean_length=float(a.mean()), warmup=i == 0, note=f"n{i}")
                  for i, (t, a, w) in enumerate(zip(makespans, arrs, wasted, strict=True)))
    return PolicyRun(name, steps, arrs, tuple(range(len(arrs))))


UNIFORM = run_of("uniform", [10.0, 8.0, 6.0, 4.0], [[[9, 9]], [[1, 2]], [[3, 4]], [[5, 6]]], [0, 0, 0, 0])
POLICY = run_of("x", [9.0, 7.0, 3.0, 5.0], [[[1, 1]], [[1, 1]], [[6, 8]], [[10, 12]]], [100, 50, 4, 0])


def test_tiny_run_by_hand() -> None:
    s = summarize({"uniform": UNIFORM, "x": POLICY})["x"]
    # window = steps 2 and 3 (SKIP_STEPS = 2)
    assert s.mean_step_s == pytest.approx(4.0)  # (3 + 5) / 2
    assert s.speedup == pytest.approx(5.0 / 4.0)  # uniform (6 + 4) / 2 = 5
    assert (s.final_q, s.final_m) == (3, 3)
    assert s.wasted_share == pytest.approx(4 / (4 + 36))
    assert s.bias is not None
    assert s.bias.mean_ratio == pytest.approx(9.0 / 4.5)  # mean(6, 8, 10, 12) / mean(3, 4, 5, 6)
    assert s.bias.ks == pytest.approx(0.75)  # at x = 6: F_uniform = 1, F_x = 1/4
    assert (s.step_s_std, s.step_s_min, s.step_s_max) == pytest.approx((1.0, 3.0, 5.0))
    assert s.oracle is False
    doc = policy_json(POLICY, s, {"restart_s": 2.5})
    assert list(doc) == ["mean_step_s", "speedup", "verdict", "final_q", "final_m", "wasted_share", "redraws", "bias",
                         "fidelity", "oracle", "step_s_std", "step_s_min", "step_s_max", "steps", "restart_s"]
    assert doc["bias"] == {"mean_ratio": pytest.approx(2.0), "ks": pytest.approx(0.75), "truncated_ratio": None,
                           "truncated_share": None, "reference_truncated_share": None,
                           "truncated_reason": "length cap unknown (the workload has no max_length)"}
    assert doc["redraws"] == {"max": 0, "mean": 0.0}
    # paired window steps 2, 3: d = (6 − 3, 4 − 5) = (3, −1), std 2√2, SE = 2√2/√2 / mean(3, 5) = 0.5
    assert doc["verdict"] == {"within_noise": True, "left_uniform": True, "speedup_2sigma": pytest.approx(1.0),
                              "paired_steps": 2, "note": "within noise of uniform (±100.0% at 2σ over 2 paired steps)"}
    assert doc["steps"][3] == record_json(POLICY.steps[3]) == {
        "step": 3, "makespan_s": 5.0, "tail_s": 0.0, "bulk_s": 5.0, "q": 3, "m": 3, "candidates": 0,
        "wasted_tokens": 0, "batch_mean_length": 11.0, "warmup": False, "note": "n3", "redraws_max": 0,
        "preemptions": 0, "recomputed_tokens": 0, "prefix_hit_tokens": 0, "decision": None}


def test_without_uniform_speedup_and_bias_are_none() -> None:
    empty = PolicyRun("y", (), (), ())  # a policy that has not run a step yet (rollout mid-run): left out
    s = summarize({"x": POLICY, "y": empty})
    assert list(s) == ["x"] and s["x"].speedup is None and s["x"].bias is None
    doc = report_json({"x": POLICY, "y": empty}, {"k": 1})
    assert list(doc) == ["k", "window_skip", "policies"] and list(doc["policies"]) == ["x"]
    assert doc["policies"]["x"]["speedup"] is None and doc["policies"]["x"]["bias"] is None
    assert report({"x": POLICY}, {})["policies"] == doc["policies"]
    assert doc["policies"]["x"]["verdict"] is None and doc["policies"]["x"]["redraws"] == {"max": 0, "mean": 0.0}
    assert _rows(summary_table(s, title="t"))[0] == ["x", "4.00", "-", "-", "3", "3", "10.0%", "-", "-"]


def _rows(table: object) -> list[list[str]]:
    con = Console(width=200, record=True)
    con.print(table)
    lines = con.export_text().splitlines()
    body = lines[next(i for i, ln in enumerate(lines) if set(ln.strip()) == {"─"}) + 1:]
    return [re.split(r"\s{2,}", ln.strip()) for ln in body if ln.strip()]  # columns: 2+ spaces apart


def test_table_columns_star_and_extra_columns() -> None:
    s = summarize({"uniform": UNIFORM, "x": POLICY}, oracles={"x"})
    rows = _rows(summary_table(s, title="t", extra_columns={"restart s": {"x": "2.5"}}))
    assert rows == [["uniform", "5.00", "1.000×", "-", "3", "3", "0.0%", "1.000", "0.000", "-"],
                    ["x*", "4.00", "1.250×", "-", "3", "3", "10.0%", "2.000", "0.750", "2.5"]]
    assert len(COLUMNS) == 9
    judged = summarize({"uniform": UNIFORM, "x": POLICY})
    assert _rows(summary_table(judged, title="t"))[1][3] == "±100.0% ~"  # within noise: marked
    assert fidelity_notes(judged) == ["x: within noise of uniform (±100.0% at 2σ over 2 paired steps); truncation: "
                                      "length cap unknown (the workload has no max_length); redraws max 0, mean 0.00"]


def test_simulate_json_and_rollout_report_agree_on_the_same_runs(capsys: pytest.CaptureFixture[str]) -> None:
    flags = ["--replicas", "4", "--groups", "16", "--group-size", "4", "--steps", "5", "--policy",
             "uniform-oracle,static", "--q", "2", "--m", "1"]
    assert main(["simulate", "--json", *flags]) == 0
    sim = json.loads(capsys.readouterr().out)["policies"]
    workload = load_workload(None, mode=ReplayMode.RESAMPLE, seed=0)
    runs = run_policies(["uniform", "uniform-oracle", "static"], workload, load_curve("h100-llama3-8b"),
                        SimConfig(router=RouterConfig(groups=16, group_size=4, replicas=4), steps=5, q=2, m=1))
    real = report(runs, {"endpoints": []}, extra={n: {"restart_s": 0.0} for n in runs})["policies"]
    assert list(sim) == list(real) == ["uniform", "uniform-oracle", "static"]
    for name in sim:
        assert set(real[name]) == set(sim[name]) | {"restart_s"}  # rollout's one per-source extra
        oracle = sim[name].pop("oracle")
        assert oracle == (name in ORACLES) and real[name].pop("oracle") is False  # real rollouts run no oracle
        if oracle:  # a real run judges every non-uniform policy; simulate gives the oracles no verdict
            assert sim[name].pop("verdict") is None and real[name].pop("verdict")["paired_steps"] == 3
        assert {k: v for k, v in real[name].items() if k != "restart_s"} == sim[name]
    assert report_json(runs, {}, oracles=ORACLES)["policies"]["static"] == sim["static"] | {"oracle": False}


FORBIDDEN = {  # module → tailsieve modules it must not load (the cli cycle; analysis stays free of the CLI)
    "tailsieve.cli.sim_args": ("tailsieve.cli.simulate_cmd", "tailsieve.cli.simulate_spec"),
    "tailsieve.cli.simulate_spec": ("tailsieve.cli.simulate_cmd",),
    "tailsieve.analysis.report": ("tailsieve.cli.",),
}


@pytest.mark.parametrize("module", sorted(FORBIDDEN))
def test_no_back_edges(module: str) -> None:
    code = (f"import sys, {module}; "
            f"print([m for m in sys.modules if m.startswith({FORBIDDEN[module]!r})])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
