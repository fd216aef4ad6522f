"""`tailsieve simulate`: JSON structure and windows, table, plot, progress kept off stdout, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tailsieve.cli import main
from tailsieve.cli.sim_args import progress_bar
from tailsieve.simulation.runs import policy_names
from tailsieve.workloads.workload import bundled_workloads, generator_names

SMALL = ["--groups", "8", "--group-size", "4", "--replicas", "4", "--steps", "5"]
STEP_KEYS = {"step", "makespan_s", "tail_s", "bulk_s", "q", "m", "candidates", "wasted_tokens", "batch_mean_length"}


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    assert main(["simulate", *SMALL, *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_has_every_policy_and_the_documented_fields(capsys: pytest.CaptureFixture[str]) -> None:
    doc = run_json(capsys)
    assert list(doc["policies"]) == list(policy_names())
    assert doc["workload"] == "kodcode-r1" and doc["replay"] == "resample" and doc["curve"] == "h100-llama3-8b"
    uni = doc["policies"]["uniform"]["mean_step_s"]
    for p in doc["policies"].values():
        assert len(p["steps"]) == 5 and all(set(s) >= STEP_KEYS for s in p["steps"])
        mean = float(np.mean([s["makespan_s"] for s in p["steps"][2:]]))  # all steps but the first two
        assert p["mean_step_s"] == pytest.approx(mean)
        assert p["speedup"] == pytest.approx(uni / mean)
        assert {"final_q", "final_m", "wasted_share", "bias"} <= set(p)
        assert (p["final_q"], p["final_m"]) == (p["steps"][-1]["q"], p["steps"][-1]["m"])
    assert doc["policies"]["uniform"]["speedup"] == 1.0
    assert [c["rho"] for c in doc["capture"]] == [0.05, 0.1, 0.25]


def test_static_flags_and_policy_selection(capsys: pytest.CaptureFixture[str]) -> None:
    doc = run_json(capsys, "--policy", "static", "--q", "2", "--m", "1", "--rho", "0.25", "--dispatch", "group",
                   "--replay", "recorded")
    assert list(doc["policies"]) == ["uniform", "static"]  # uniform always runs: it is the reference
    assert doc["dispatch"] == "group" and doc["replay"] == "recorded"
    assert [(s["q"], s["m"]) for s in doc["policies"]["static"]["steps"]] == [(0, 0)] + [(2, 1)] * 4
    doc = run_json(capsys, "--policy", "tailsieve,seer-oracle", "--m0", "0", "--q0", "1")
    assert list(doc["policies"]) == ["uniform", "seer-oracle", "tailsieve"]
    assert doc["policies"]["tailsieve"]["steps"][0]["m"] == 0


def test_engine_scale_slows_the_simulated_fleet_and_is_reported(capsys: pytest.CaptureFixture[str]) -> None:
    """All-admit step times are linear in τ: --engine-scale 1.5 makes every uniform step exactly 1.5× as long."""
    base = run_json(capsys, "--policy", "uniform")
    slow = run_json(capsys, "--policy", "uniform", "--engine-scale", "1.5")
    assert (base["engine_scale"], slow["engine_scale"]) == (1.0, 1.5)
    assert [s["makespan_s"] for s in slow["policies"]["uniform"]["steps"]] == pytest.approx(
        [1.5 * s["makespan_s"] for s in base["policies"]["uniform"]["steps"]])


def test_replica_options_and_synthetic_workload(capsys: pytest.CaptureFixture[str]) -> None:
    base = run_json(capsys, "--policy", "uniform", "--workload", "synthetic-math")
    assert base["replay"] == "synthetic"
    slow = run_json(capsys, "--policy", "uniform", "--workload", "synthetic-math", "--max-num-seqs", "2",
                    "--kv-ms-per-1k", "0.5", "--prefill-ms-per-token", "0.01")
    assert slow["policies"]["uniform"]["mean_step_s"] > base["policies"]["uniform"]["mean_step_s"]


def test_table_and_plot(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out_png = tmp_path / "sim.png"
    assert main(["simulate", *SMALL, "--policy", "all", "--plot", str(out_png)]) == 0
    cap = capsys.readouterr()
    for name in policy_names():
        assert name in cap.out
    assert "resample, default" in cap.out and "speedup" in cap.out and "capture" in cap.out
    assert out_png.stat().st_size > 1000 and out_png.read_bytes()[:4] == b"\x89PNG"
    assert cap.err == ""  # no progress bar when stderr is not a terminal


def test_progress_names_each_finished_policy(capsys: pytest.CaptureFixture[str]) -> None:
    with progress_bar(4, enabled=True, steps=2) as tick:
        for name in ("uniform", "topq-best"):
            tick(name, 1)
            tick(name, 2)
    cap = capsys.readouterr()
    assert cap.out == ""
    assert "uniform: 2 steps in" in cap.err and "topq-best: 2 steps in" in cap.err
    with progress_bar(4, enabled=False, steps=2) as tick:
        tick("uniform", 2)
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--steps", "0"], "--steps must be a positive integer"),
        (["--replicas", "1", "--policy", "tailsieve"], "at least 2 replicas"),
        (["--policy", "nope"], "valid: uniform, uniform-oracle"),
        (["--workload", "/no/such/trace.csv"], "no such trace"),
        (["--dispatch", "sideways"], "dispatch must be request or group, got 'sideways'"),
        (["--replay", "synthetic"], "--replay must be recorded or resample"),
        (["--policy", "uniform", "--q", "2"], "--q/--m set the static policy"),
        (["--m", "8"], "m must lie in 0..7 (R=8 replicas), got m=8"),
        (["--plot", "out.txt"], "--plot out.txt"),
        (["--rho", "2"], "rho must lie in [0, 1]"),
        (["--groups", "-3"], "--groups must be a positive integer"),
        (["--tail-spec", "warp:3"], "--tail-spec.method must be one of none, mtp, eagle3, dflash, ngram, suffix"),
        (["--bulk-spec", "mtp:3,alpha=1"], "--bulk-spec: expected key=value with key in acceptance"),
        (["--tail-spec", "none:2"], "none takes no speculative tokens, got tokens=2"),
        (["--config", "/no/such/sim.toml"], "cannot read config file /no/such/sim.toml"),
        (["--spec", "none"], "--spec needs a speculative method"),
        (["--spec", "mtp:3"], "--spec takes a method, not a depth"),
        (["--spec", "mtp", "--spec-budgets", "0,x"],
         "--spec-budgets must be comma-separated integers or ranges A..B, got 'x'"),
        (["--spec", "mtp", "--spec-budgets", "20"], "--spec-budgets values must lie in 0..16, got 20"),
        (["--spec", "mtp", "--tail-spec", "mtp:2"], "--spec sweeps the depths itself"),
        (["--spec", "mtp", "--policy", "tailsieve,static"], "give one --policy"),
        (["--spec", "mtp", "--policy", "seer-oracle"], "give one --policy"),
        (["--spec-budgets", "1,2"], "--spec-budgets belongs to the matched-budget table; add --spec METHOD"),
        (["--engine-scale", "0"], "--engine-scale must be a finite number > 0 and <= 100, got 0.0"),
        (["--engine-scale", "nan"], "--engine-scale must be a finite number > 0 and <= 100, got nan"),
    ],
)
def test_bad_input_is_one_line(capsys: pytest.CaptureFixture[str], argv: list[str], needle: str) -> None:
    assert main(["simulate", *argv]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("tailsieve simulate: error: ") and needle in err


def test_unknown_workload_lists_every_valid_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--workload", "nosuch"]) == 1
    err = capsys.readouterr().err
    assert err == (f"tailsieve simulate: error: no such trace 'nosuch': not a bundled workload "
                   f"({', '.join(bundled_workloads())}) and no such file\n")
    assert all(name in err for name in ("kodcode-r1", "kodcode-tests", *generator_names()))


def test_argparse_errors_are_one_line_too(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["simulate", "--steps", "many"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "invalid int value" in err


def test_per_pool_speculation_flags_and_config_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    plain = run_json(capsys, "--policy", "static", "--q", "1", "--m", "1")
    assert plain["spec"]["tail"]["method"] == "none" and plain["spec"]["bulk"]["tokens"] == 0
    flags = run_json(capsys, "--policy", "static", "--q", "1", "--m", "1", "--tail-spec",
                     "mtp:default:4,acceptance=0.8,verify_cost=0.5")  # a config file's table: the plain constants
    assert flags["spec"]["tail"] | {"expected_tokens": 0} == {
        "method": "mtp", "tokens": 4, "acceptance": 0.8, "decay": 0.95, "draft_cost": 0.1, "verify_cost": 0.5,
        "draft_share": 1.0, "token_cost": 0.0, "token_cost_slope": 0.0, "acceptance_slope": 0.0,
        "drafter": "autoregressive", "draft_cpu_s": 0.0, "expected_tokens": 0}
    # uniform runs every replica as bulk: unchanged; the static policy's tail pool speculates
    assert flags["policies"]["uniform"]["steps"] == plain["policies"]["uniform"]["steps"]
    tail = [s["tail_s"] for s in flags["policies"]["static"]["steps"][1:2]]
    assert tail[0] < plain["policies"]["static"]["steps"][1]["tail_s"]
    conf = tmp_path / "sim.toml"
    conf.write_text('[spec.tail]\nmethod = "mtp"\ntokens = 4\nacceptance = 0.8\nverify_cost = 0.5\n'
                    '[spec.bulk]\nmethod = "ngram"\ntokens = 2\n', encoding="utf-8")
    doc = run_json(capsys, "--policy", "static", "--q", "1", "--m", "1", "--config", str(conf))
    assert doc["spec"]["tail"] == flags["spec"]["tail"] and doc["spec"]["bulk"]["method"] == "ngram"
    over = run_json(capsys, "--policy", "static", "--q", "1", "--m", "1", "--config", str(conf), "--bulk-spec", "none")
    assert over["spec"]["bulk"]["method"] == "none"
    assert over["policies"]["static"]["steps"] == flags["policies"]["static"]["steps"]
    conf.write_text('[spec.tail]\nmethod = "mtp"\ntokens = -1\n', encoding="utf-8")
    assert main(["simulate", "--config", str(conf)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"config {conf}: spec.tail: speculative tokens must be an integer" in err


def test_matched_budget_table(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    doc = run_json(capsys, "--spec", "eagle3,acceptance=0.7", "--spec-budgets", "1,0", "--policy", "static")
    assert doc["policy"] == "static" and doc["spec"]["method"] == "eagle3" and doc["spec"]["acceptance"] == 0.7
    assert "tokens" not in doc["spec"]
    rows = doc["budgets"]
    assert [r["d_base"] for r in rows] == [0, 1] and rows[0]["uniform_speedup"] == 1.0
    assert [(s["d_bulk"], s["d_tail"]) for s in rows[1]["splits"]] == [(1, 1), (0, 2)]
    assert all(s["tail_bound_share"] is None or 0 <= s["tail_bound_share"] <= 1 for s in rows[1]["splits"])
    assert rows[0]["uniform_s"] == pytest.approx(doc["reference_s"])
    assert doc["best_uniform_budget"] in (0, 1) and doc["best_uniform_budget"] in doc["useful_uniform_budgets"]
    assert rows[0]["tail_only"] is None and (rows[1]["tail_only"]["d_bulk"], rows[1]["tail_only"]["d_tail"]) == (0, 1)
    best = min(s["mean_step_s"] for s in rows[1]["splits"])
    assert rows[1]["route_credit"] == rows[1]["splits"][0]["mean_step_s"] / best
    out_png = tmp_path / "budget.png"
    assert main(["simulate", *SMALL, "--spec", "mtp", "--spec-budgets", "0,1", "--plot", str(out_png)]) == 0
    cap = capsys.readouterr()
    assert "Matched-budget speculation" in cap.out and "best budget: uniform d=" in cap.out and cap.err == ""
    assert "Route credit" in cap.out and "route-specific depths" in cap.out
    assert out_png.read_bytes()[:4] == b"\x89PNG"


def test_ranking_is_chosen_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    default = run_json(capsys, "--policy", "static", "--q", "1", "--m", "1")
    by_stream = run_json(capsys, "--policy", "static", "--q", "1", "--m", "1", "--ranking", "stream-order")
    assert default["ranking"] == "least-progress" and by_stream["ranking"] == "stream-order"
    # the uniform reference never isolates, so only the two-pool run can differ
    assert by_stream["policies"]["uniform"] == default["policies"]["uniform"]
    assert main(["simulate", *SMALL, "--ranking", "nope"]) == 1
    err = capsys.readouterr().err.strip()
    assert err == ("tailsieve simulate: error: unknown candidate ranking 'nope' (valid: least-progress, "
                   "stream-order)")


def test_side_by_side_verdict_separates_depths_from_placement() -> None:
    from tailsieve.cli.simulate_spec import side_by_side_verdict
    from tailsieve.model.speculative import SpecConfig, SpecMethod
    from tailsieve.simulation.spec_budget import BudgetRow, BudgetTable, SplitRun

    nan = float("nan")
    rows = (BudgetRow(0, 100.0, (SplitRun(0, 0, 90.0, 2, 2, 0.5),)),
            BudgetRow(1, 80.0, (SplitRun(1, 1, 75.0, 2, 2, 0.5), SplitRun(0, 2, 70.0, 2, 2, 0.6))),
            BudgetRow(2, 85.0, (SplitRun(2, 2, 80.0, 0, 0, 0.4), SplitRun(1, 3, 72.0, 0, 0, nan),
                                SplitRun(0, 4, 79.0, 1, 1, 0.2))))
    table = BudgetTable(SpecConfig(SpecMethod.MTP), "tailsieve", 100.0, rows)
    assert side_by_side_verdict(table) == (
        "route-specific depths beat tailsieve d/d by more than 1% at budgets [1] (best 1.071×); at budgets [2] the "
        "best split beats d/d only because its run never placed a tail pool (its tail depth made the predictor keep "
        "every replica bulk at d_bulk): a placement effect, not route-specific depths; best of each: uniform d=1 "
        "1.250×, tailsieve d/d d=1 1.333×, best split d=1 0/2 1.429× (1.071× its best d/d).")
