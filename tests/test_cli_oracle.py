"""`tailsieve oracle`: JSON keys, the App. A.4 summary, plots, progress kept off stdout and one-line errors."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from tailsieve.cli import main, oracle_cmd
from tailsieve.workloads.traces import load_trace

SINGLE_KEYS = {"requests", "uniform_s", "best_k", "topk_s", "optimal_s", "optimal_lane", "states", "seconds"}
SUMMARY_KEYS = {
    "groups", "max_gap_topk", "median_gap_topk", "share_within_1pct", "max_gap_fixed10", "median_gap_fixed10",
    "max_gap_uniform", "median_gap_uniform", "median_seconds", "max_seconds", "median_states",
}


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    lengths = np.random.default_rng(5).integers(50, 4000, size=40)
    lengths[:3] = [15000, 12000, 9000]
    path = tmp_path / "t.csv"
    path.write_text("prompt_id,length\n" + "".join(f"p{i // 4},{n}\n" for i, n in enumerate(lengths)))
    return path


@pytest.fixture
def hard_trace(tmp_path: Path) -> Path:
    """80 requests of the bundled trace whose optimum needs a real search (best-k is 0.43% off)."""
    lengths = np.random.default_rng(5).choice(load_trace().length, size=80, replace=False)
    path = tmp_path / "hard.jsonl"
    path.write_text("".join(f'{{"prompt_id": "p{i}", "length": {n}}}\n' for i, n in enumerate(lengths)))
    return path


def run_json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict[str, object]:
    assert main(argv) == 0
    out: dict[str, object] = json.loads(capsys.readouterr().out)
    return out


def test_single_group_json(capsys: pytest.CaptureFixture[str], trace: Path) -> None:
    out = run_json(capsys, ["oracle", "--workload", str(trace), "--json"])
    assert set(out) == SINGLE_KEYS
    lane = out["optimal_lane"]
    assert isinstance(lane, list) and len(lane) == out["requests"] == 40
    assert 2 * sum(lane) <= len(lane)
    assert isinstance(out["optimal_s"], float) and isinstance(out["topk_s"], float)
    assert out["optimal_s"] <= out["topk_s"]
    assert isinstance(out["uniform_s"], float) and out["topk_s"] <= out["uniform_s"]
    assert isinstance(out["states"], int) and out["states"] > 0


def test_sampled_groups_json_and_reproducible(capsys: pytest.CaptureFixture[str], trace: Path) -> None:
    argv = ["oracle", "--workload", str(trace), "--sample", "12", "--repeat", "4", "--seed", "3", "--json"]
    first = run_json(capsys, argv)
    second = run_json(capsys, argv)
    groups = first["groups"]
    assert isinstance(groups, list) and len(groups) == 4
    assert set(groups[0]) >= SINGLE_KEYS and len(set(groups[0]["rows"])) == 12
    summary = first["summary"]
    assert isinstance(summary, dict) and set(summary) == SUMMARY_KEYS
    assert 0.0 <= summary["share_within_1pct"] <= 1.0 and summary["max_gap_topk"] >= 0.0
    assert summary["max_gap_uniform"] >= summary["median_gap_uniform"] >= 0.0
    again = second["groups"]
    assert isinstance(again, list)
    assert [{k: v for k, v in g.items() if k != "seconds"} for g in groups] == [
        {k: v for k, v in g.items() if k != "seconds"} for g in again
    ]


def test_human_output_and_plot(capsys: pytest.CaptureFixture[str], trace: Path, tmp_path: Path) -> None:
    plot = tmp_path / "a4.png"
    argv = ["oracle", "--workload", str(trace), "--sample", "10", "--repeat", "3", "--plot", str(plot)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "best top-k" in out and "uniform" in out and "fixed 10%" in out
    assert plot.stat().st_size > 0
    assert main(["oracle", "--workload", str(trace)]) == 0
    assert "exact optimum" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--sample", "41"], "--sample 41 is larger than the trace (40 requests)"),
        (["--repeat", "3"], "--repeat and --seed need --sample"),
        (["--plot", "out.txt"], "use a .png, .pdf or .svg"),
        (["--curve", "no-such-curve"], "unknown curve"),
    ],
)
def test_errors_are_one_line(capsys: pytest.CaptureFixture[str], trace: Path, extra: list[str], message: str) -> None:
    assert main(["oracle", "--workload", str(trace), *extra]) == 1
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and err.startswith("tailsieve oracle: error:")


def test_budget_error(capsys: pytest.CaptureFixture[str], hard_trace: Path) -> None:
    assert main(["oracle", "--workload", str(hard_trace), "--max-states", "500", "--json"]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert "exact oracle stopped (state budget 500 exhausted" in captured.err and "--max-states" in captured.err
    out = run_json(capsys, ["oracle", "--workload", str(hard_trace), "--json"])
    assert out["optimal_s"] < out["topk_s"]  # type: ignore[operator]


@pytest.mark.parametrize("bad", [["--sample", "0"], ["--repeat", "-2"], ["--max-seconds", "0"], ["--seed", "x"]])
def test_non_positive_values_rejected_by_argparse(capsys: pytest.CaptureFixture[str], bad: list[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["oracle", *bad])
    assert info.value.code == 2
    assert "expected a" in capsys.readouterr().err


def test_missing_trace(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["oracle", "--workload", str(tmp_path / "nope.csv")]) == 1
    assert "no such trace" in capsys.readouterr().err


ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def test_progress_on_stderr_only_when_it_is_a_terminal(capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch, hard_trace: Path) -> None:
    out = run_json(capsys, ["oracle", "--workload", str(hard_trace), "--json"])
    assert capsys.readouterr().err == ""  # stderr is not a terminal here: nothing at all
    monkeypatch.setattr(oracle_cmd, "progress_enabled", lambda: True)  # as if stderr were a terminal
    assert main(["oracle", "--workload", str(hard_trace), "--json"]) == 0
    cap = capsys.readouterr()
    again = json.loads(cap.out)  # stdout is the JSON document alone
    assert again["states"] == out["states"]
    err = ANSI.sub("", cap.err)
    final = f"{oracle_cmd._count(again['states'])}/20.0M states"  # the last report: every state of the solve
    # the bar refreshes on a clock, so under load early searches may never be drawn; the last report always is
    assert "oracle search " in err and final in err and "/80 requests" in err
    assert main(["oracle", "--workload", str(hard_trace), "--sample", "8", "--repeat", "3", "--json"]) == 0
    cap = capsys.readouterr()
    assert json.loads(cap.out)["repeat"] == 3 and "3/3 groups" in ANSI.sub("", cap.err)
