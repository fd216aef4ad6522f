"""`tailsieve analyze` and `tailsieve workloads`: JSON keys, every bundled and test trace, plots, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from conftest import DATA
from tailsieve.cli import main
from tailsieve.workloads.traces import bundled_trace_names, bundled_trace_path

TRACES = [bundled_trace_path(n) for n in bundled_trace_names()] + sorted((DATA / "traces").glob("*.csv"))
STATS_KEYS = {"p50", "p90", "p99", "max", "p90_p50", "truncated_share", "samples_per_prompt"}


def analyze_json(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    assert main(["analyze", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_default_trace_json(capsys: pytest.CaptureFixture[str]) -> None:
    out = analyze_json(capsys)
    assert out["name"] == "kodcode-r1"
    assert set(out["stats"]) >= STATS_KEYS
    assert out["stats"]["p50"] == 2131.5 and out["stats"]["samples_per_prompt"] == 3
    assert out["checkpoints"] == [] and out["auc"] == []
    shares = out["variance_shares"]
    assert set(shares) == {"prompt", "checkpoint", "interaction", "sampling"}
    assert sum(shares.values()) == pytest.approx(1.0) and shares["prompt"] > 0.8
    assert out["between_within"]["between"] == pytest.approx(shares["prompt"])


@pytest.mark.parametrize("path", TRACES, ids=[p.name for p in TRACES])
def test_every_trace(capsys: pytest.CaptureFixture[str], path: Path) -> None:
    out = analyze_json(capsys, str(path))
    assert set(out["stats"]) >= STATS_KEYS and out["stats"]["max"] > 0


def test_synthetic_workload(capsys: pytest.CaptureFixture[str]) -> None:
    out = analyze_json(capsys, "synthetic-math", "--prompts", "32", "--checkpoints", "4", "--samples", "4")
    assert out["kind"] == "synthetic" and "I=32 prompts × S=4 checkpoints" in out["design"]
    assert out["checkpoints"] == sorted(out["checkpoints"]) and len(out["checkpoints"]) == 4
    assert len(out["auc"]) == 4 and all(len(row) == 4 for row in out["auc"])
    assert sum(out["variance_shares"].values()) == pytest.approx(1.0)
    assert out["stats"]["truncated_share"] > 0


def test_trace_with_steps_and_column_overrides(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    p = tmp_path / "t.csv"
    lines = ["q,n,step"] + [f"p{i},{(i + 1) * 10 + s + k},{s}" for i in range(12) for s in (1, 2) for k in range(2)]
    p.write_text("\n".join(lines) + "\n")
    out = analyze_json(capsys, str(p), "--length-column", "n", "--prompt-column", "q")
    assert out["checkpoints"] == [1, 2]
    assert out["auc"][0][1] == 1.0


def test_table_output_and_plot(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    png = tmp_path / "a.png"
    assert main(["analyze", "kodcode-tests", "--plot", str(png)]) == 0
    text = capsys.readouterr().out
    assert "P90/P50" in text and "variance shares" in text and png.stat().st_size > 1000
    png2 = tmp_path / "b.png"
    assert main(["analyze", "synthetic-math-strong", "--prompts", "16", "--checkpoints", "3", "--plot",
                 str(png2)]) == 0
    assert "tail-ranking AUC" in capsys.readouterr().out and png2.exists()


def test_bad_file_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    p = tmp_path / "bad.csv"
    p.write_text("prompt_id,length\na,1\nb,-3\n")
    assert main(["analyze", str(p)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("tailsieve analyze: error: trace ") and "bad.csv, line 3" in err and "negative" in err


def test_bad_plot_path_fails_before_work(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["analyze", "--plot", str(tmp_path / "x.txt")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "use a .png, .pdf or .svg" in err
    assert main(["analyze", "--plot", str(tmp_path / "nope" / "x.png")]) == 1
    assert "does not exist" in capsys.readouterr().err


def test_workloads_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["workloads", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    names = [w["name"] for w in out["workloads"]]
    assert out["default"] == "kodcode-r1" and names[0] == "kodcode-r1" and len(names) == 9
    assert {w["kind"] for w in out["workloads"]} == {"trace", "synthetic"}
    assert main(["workloads"]) == 0
    listing = capsys.readouterr().out
    assert "synthetic-math-strong" in listing and "rare-cap" in listing


def test_single_epoch_trace_gives_statistics_and_says_why_auc_is_null(capsys: pytest.CaptureFixture[str],
                                                                      tmp_path: Path) -> None:
    p = tmp_path / "epoch.csv"  # 3 steps × 4 prompts × 2 samples; a prompt id never repeats across steps
    rows = [f"s{s}p{i},{s},{10 * (i + 1) + k}" for s in range(3) for i in range(4) for k in range(2)]
    p.write_text("prompt_id,step,length\n" + "\n".join(rows) + "\n")
    out = analyze_json(capsys, str(p))
    reason = ("single-epoch trace: no prompt id repeats across its 3 steps, and the cross-checkpoint tail AUC ranks "
              "the same prompts at two or more checkpoints")
    assert out["auc"] is None and out["auc_reason"] == reason and out["checkpoints"] == []
    assert out["design"] == "12 prompts × 1 checkpoint × 2 samples"
    assert out["stats"]["n"] == 24 and out["stats"]["max"] == 41
    # per prompt (10i+10, 10i+11): within SS = 12 × 0.5 = 6 of SS_total
    total = sum((x - 25.5) ** 2 for i in range(4) for x in (10 * (i + 1), 10 * (i + 1) + 1)) * 3
    assert out["between_within"]["within"] == pytest.approx(6 / total)
    assert out["variance_shares"]["sampling"] == pytest.approx(6 / total)
    assert f"{reason}; statistics and variance shares treat the trace as one checkpoint" in out["notes"]
    assert main(["analyze", str(p)]) == 0
    printed = capsys.readouterr().out
    assert "statistic " in printed and "P90/P50" in printed
    assert f"tail-ranking AUC over checkpoints: n/a ({reason})" in printed


def test_partially_repeated_prompts_say_why_auc_is_null(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    p = tmp_path / "partial.csv"  # p0 at steps 0 and 1, p1 at 1 and 2, p2 at 2 only: none at every step
    rows = ["p0,0,5", "p0,0,6", "p0,1,7", "p0,1,8", "p1,1,9", "p1,1,10", "p1,2,11", "p1,2,12", "p2,2,20", "p2,2,21"]
    p.write_text("prompt_id,step,length\n" + "\n".join(rows) + "\n")
    out = analyze_json(capsys, str(p))
    assert out["auc"] is None and out["auc_reason"] == ("no prompt appears at all 3 steps: the cross-checkpoint tail "
                                                        "AUC needs the same prompts at every checkpoint")
