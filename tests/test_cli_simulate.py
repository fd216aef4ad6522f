"""`tailsieve simulate`: JSON structure and windows, table, plot, progress kept off stdout, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tailsieve.cli import main
from tailsieve.sim import policy_names

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


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--steps", "0"], "--steps must be a positive integer"),
        (["--replicas", "1", "--policy", "tailsieve"], "at least 2 replicas"),
        (["--policy", "nope"], "valid: uniform, uniform-oracle"),
        (["--workload", "/no/such/trace.csv"], "no such trace"),
        (["--dispatch", "sideways"], "--dispatch must be request or group"),
        (["--replay", "synthetic"], "--replay must be recorded or resample"),
        (["--policy", "uniform", "--q", "2"], "--q/--m set the static policy"),
        (["--m", "8"], "--m must lie in 0..7"),
        (["--plot", "out.txt"], "--plot out.txt"),
        (["--rho", "2"], "rho must lie in [0, 1]"),
        (["--groups", "-3"], "--groups must be a positive integer"),
    ],
)
def test_bad_input_is_one_line(capsys: pytest.CaptureFixture[str], argv: list[str], needle: str) -> None:
    assert main(["simulate", *argv]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("tailsieve simulate: error: ") and needle in err


def test_argparse_errors_are_one_line_too(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["simulate", "--steps", "many"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "invalid int value" in err
