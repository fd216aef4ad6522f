"""`tailsieve route`: steps from traces, cyclic groups, table and JSON output, progress off stdout, one-line errors."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tailsieve.cli import main, route_cmd
from tailsieve.cli.route_cmd import prompt_groups, trace_steps
from tailsieve.workloads.traces import load_trace

ALL = ["uniform", "uniform-oracle", "streamrl-oracle", "seer-oracle", "topq-best"]


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    assert main(["route", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def error_of(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(["route", *argv]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("tailsieve route: error: ")
    return err


def write_csv(path: Path, header: str, rows: list[tuple[object, ...]]) -> str:
    path.write_text(header + "\n" + "\n".join(",".join(map(str, r)) for r in rows) + "\n", encoding="utf-8")
    return str(path)


def test_prompt_groups_cycle_samples_in_file_order() -> None:
    ids = np.array(["b", "a", "b", "a", "b"])
    lengths = np.array([5, 1, 6, 2, 7])
    batch = prompt_groups(ids, lengths, 8)
    assert batch.group_ids == ("b", "a")
    assert batch.lengths.tolist() == [[5, 6, 7, 5, 6, 7, 5, 6], [1, 2, 1, 2, 1, 2, 1, 2]]
    assert prompt_groups(ids, lengths, 2).lengths.tolist() == [[5, 6], [1, 2]]


def test_bundled_trace_cut_into_three_steps() -> None:
    steps, left = trace_steps(load_trace(None), 64, 8)
    assert [s.step for s in steps] == [0, 1, 2]
    assert left == 232 - 3 * 64
    assert all(s.batch.lengths.shape == (64, 8) for s in steps)


def test_default_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["route"]) == 0
    out = capsys.readouterr().out
    for name in ALL[1:]:
        assert name in out
    assert "mean" in out and "q=" in out and "d=" in out and "40 prompt(s)" in out


def test_json_structure(capsys: pytest.CaptureFixture[str]) -> None:
    doc = run_json(capsys)
    assert (doc["replicas"], doc["group_size"], doc["groups"], doc["curve"]) == (8, 8, 64, "h100-llama3-8b")
    assert len(doc["steps"]) == 3
    for st in doc["steps"]:
        pol = st["policies"]
        assert list(pol) == ALL
        assert pol["uniform"]["speedup"] == 1.0
        base = pol["uniform"]["makespan_s"]
        for name in ALL:
            assert pol[name]["speedup"] == pytest.approx(base / pol[name]["makespan_s"])
        assert pol["topq-best"]["speedup"] >= 1.0  # (0, 0) is a candidate
        assert {"q", "m"} <= set(pol["topq-best"])
        assert 1 <= pol["streamrl-oracle"]["dedicated"] <= 7
        assert pol["streamrl-oracle"]["isolated_requests"] == 103  # ceil(0.2 · 512)
    mean = doc["mean"]
    total = sum(st["policies"]["uniform"]["makespan_s"] for st in doc["steps"])
    seer = sum(st["policies"]["seer-oracle"]["makespan_s"] for st in doc["steps"])
    assert mean["seer-oracle"]["speedup"] == pytest.approx(total / seer)
    assert mean["uniform"]["makespan_s"] == pytest.approx(total / 3)


def test_topq_and_subset(capsys: pytest.CaptureFixture[str]) -> None:
    doc = run_json(capsys, "--q", "8", "--m", "2")
    assert doc["steps"][0]["policies"]["topq"]["q"] == 8
    doc = run_json(capsys, "--policy", "seer-oracle, topq", "--q", "0", "--m", "0", "--replicas", "1")
    pol = doc["steps"][0]["policies"]
    assert list(pol) == ["uniform", "seer-oracle", "topq"]
    assert pol["topq"]["makespan_s"] == pol["uniform"]["makespan_s"] == pol["seer-oracle"]["makespan_s"]
    repeated = run_json(capsys, "--policy", "seer-oracle", "--policy", "topq", "--q", "0", "--m", "0",
                        "--replicas", "1")
    assert repeated == doc  # repeatable, as in simulate


def test_trace_without_step_column(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = [(f"p{i}", 100 * (i + 1)) for i in range(5) for _ in range(2)]
    path = write_csv(tmp_path / "t.csv", "prompt_id,length", rows)
    doc = run_json(capsys, "--workload", path, "--groups", "2", "--group-size", "3", "--replicas", "2")
    assert [s["step"] for s in doc["steps"]] == [0, 1] and doc["prompts_left_out"] == 1
    doc = run_json(capsys, "--workload", path, "--groups", "10", "--replicas", "2")
    assert [(s["step"], s["groups"]) for s in doc["steps"]] == [(0, 5)]  # the only, partial, step is kept


def test_trace_with_step_column(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = [(s, f"p{i}", 10 * s + i + 1) for s in (3, 7) for i in range(3 if s == 3 else 5)]
    path = write_csv(tmp_path / "t.csv", "step,prompt_id,length", rows)
    doc = run_json(capsys, "--workload", path, "--groups", "4", "--replicas", "2")
    assert [(s["step"], s["groups"]) for s in doc["steps"]] == [(3, 3), (7, 4)]
    assert doc["prompts_left_out"] == 1


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--policy", "uniform,bogus"], "unknown policy 'bogus' (valid: uniform, uniform-oracle, streamrl-oracle"),
        (["--replicas", "1"], "--replicas 1: streamrl-oracle, topq-best need at least 2 replicas"),
        (["--replicas", "0"], "--replicas must be a positive integer, got 0"),
        (["--group-size", "0"], "--group-size must be a positive integer, got 0"),
        (["--groups", "-3"], "--groups must be a positive integer, got -3"),
        (["--policy", "topq"], "policy topq needs both --q and --m"),
        (["--policy", "seer-oracle", "--q", "3"], "--q/--m apply to policy topq"),
        (["--q", "3", "--m", "0"], "got q=3, m=0"),
        (["--q", "65", "--m", "1"], "q must lie in 0..64 (the number of groups), got q=65"),
        (["--q", "2", "--m", "8"], "m must lie in 0..7 (R=8 replicas), got m=8"),
        (["--curve", "nope"], "unknown curve 'nope'"),
        (["--workload", "/nonexistent.csv"], "no such trace"),
        (["--policy", " , "], "--policy is empty"),
    ],
)
def test_bad_arguments(capsys: pytest.CaptureFixture[str], argv: list[str], needle: str) -> None:
    assert needle in error_of(capsys, *argv)


def test_progress_on_stderr_only_when_it_is_a_terminal(capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    doc = run_json(capsys)
    assert capsys.readouterr().err == ""  # stderr is not a terminal here: nothing at all
    monkeypatch.setattr(route_cmd, "progress_enabled", lambda: True)  # as if stderr were a terminal
    assert main(["route", "--json"]) == 0
    cap = capsys.readouterr()
    assert json.loads(cap.out) == doc  # stdout is the JSON document alone
    err = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", cap.err)
    assert "routing" in err and "3/3 steps" in err and "0/3 steps" in err
