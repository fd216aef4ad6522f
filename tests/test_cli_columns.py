"""`--length-column` / `--prompt-column` (cli._common.add_trace_columns) on every command that reads a trace: a trace
with two length columns gives the closed-form result of the column chosen, and an unknown column is one error line."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine_fake import FakeServer
from tailsieve.cli import main

# Four prompts × three samples: `response_tokens` (with tool output, longest 2100) and `generated_tokens` (model
# tokens only, longest 400). Groups of G = 3 hold exactly a prompt's three rows in recorded replay.
ROWS = {"a": ((900, 100), (1000, 110), (950, 120)), "b": ((300, 400), (320, 380), (310, 390)),
        "c": ((50, 60), (40, 70), (55, 65)), "d": ((2000, 150), (2100, 160), (1900, 140))}
TAU_S = 0.01  # a flat curve, 10 ms per token at every batch size: a replica's makespan = its longest request × τ
STEP = ["--groups", "4", "--group-size", "3", "--replicas", "4"]


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    path = tmp_path / "tools.csv"
    path.write_text("prompt_id,response_tokens,generated_tokens\n" + "".join(
        f"{p},{r},{g}\n" for p, rows in ROWS.items() for r, g in rows))
    return path


@pytest.fixture
def flat(tmp_path: Path) -> Path:
    path = tmp_path / "flat.json"
    path.write_text(json.dumps({"batch": [1], "tpot_ms": [1000 * TAU_S]}))
    return path


def longest(column: int) -> int:
    return max(row[column] for rows in ROWS.values() for row in rows)


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def both(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[Any, Any]:
    """The command's JSON with the default length column (response_tokens, an alias) and with generated_tokens."""
    return run_json(capsys, *argv), run_json(capsys, *argv, "--length-column", "generated_tokens")


def test_analyze(capsys: pytest.CaptureFixture[str], trace: Path) -> None:
    default, generated = both(capsys, "analyze", str(trace))
    assert default["stats"]["max"] == longest(0) == 2100
    assert generated["stats"]["max"] == longest(1) == 400


def test_route(capsys: pytest.CaptureFixture[str], trace: Path, flat: Path) -> None:
    """Uniform puts each of the 4 groups on its own replica: the step is the longest request × τ."""
    default, generated = both(capsys, "route", "--workload", str(trace), "--curve", str(flat), *STEP)
    spans = [d["mean"]["uniform"]["makespan_s"] for d in (default, generated)]
    assert spans == pytest.approx([2100 * TAU_S, 400 * TAU_S])


def test_oracle(capsys: pytest.CaptureFixture[str], trace: Path, flat: Path) -> None:
    """All 12 requests on two lanes: with a flat τ every split's makespan is the longest request × τ."""
    default, generated = both(capsys, "oracle", "--workload", str(trace), "--curve", str(flat))
    assert [d["uniform_s"] for d in (default, generated)] == pytest.approx([21.0, 4.0])
    assert [d["optimal_s"] for d in (default, generated)] == pytest.approx([21.0, 4.0])


def test_simulate(capsys: pytest.CaptureFixture[str], trace: Path, flat: Path) -> None:
    """Recorded replay, N = 4: every uniform step runs all four prompts' rows, so every step is 2100 (400) × τ."""
    default, generated = both(capsys, "simulate", "--workload", str(trace), "--replay", "recorded", "--curve",
                              str(flat), "--policy", "uniform", "--steps", "4", *STEP)
    means = [d["policies"]["uniform"]["mean_step_s"] for d in (default, generated)]
    assert means == pytest.approx([21.0, 4.0])


def test_plan(capsys: pytest.CaptureFixture[str], trace: Path, flat: Path) -> None:
    default, generated = both(capsys, "plan", "--workload", str(trace), "--replay", "recorded", "--curve", str(flat),
                              "--steps", "3", *STEP)
    assert [d["uniform_mean_step_s"] for d in (default, generated)] == pytest.approx([21.0, 4.0])


@pytest.fixture
def server() -> Iterator[FakeServer]:
    with FakeServer() as s:
        yield s


def test_rollout_replays_the_chosen_column(server: FakeServer, trace: Path, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """Fixed-length replay (ignore_eos, max_tokens = the replayed length): each sample has exactly its row's tokens."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": p, "question": f"q {p}"}) + "\n" for p in ROWS))
    for column, extra in ((0, []), (1, ["--length-column", "generated_tokens"])):
        out = tmp_path / f"run{column}"
        assert main(["rollout", "--endpoints", server.url, "--prompts", str(prompts), "--groups", "4",
                     "--group-size", "3", "--steps", "1", "--policy", "uniform", "--replay-lengths", str(trace),
                     "--max-tokens", "4096", "--stall-timeout", "5", "--out", str(out), *extra]) == 0
        got = {}
        for line in (out / "uniform" / "batch-00000.jsonl").read_text().splitlines():
            row = json.loads(line)
            got[row["prompt_id"]] = sorted(row["tokens"])
        assert got == {p: sorted(r[column] for r in rows) for p, rows in ROWS.items()}
    capsys.readouterr()


@pytest.mark.parametrize("argv", [
    ["analyze", "{trace}"],
    ["route", "--workload", "{trace}", *STEP],
    ["oracle", "--workload", "{trace}"],
    ["simulate", "--workload", "{trace}", "--steps", "2", "--policy", "uniform", *STEP],
    ["plan", "--workload", "{trace}", "--steps", "2", *STEP],
    ["rollout", "--endpoints", "http://127.0.0.1:9", "--prompts", "{trace}", "--replay-lengths", "{trace}",
     "--out", "{out}"],
])
@pytest.mark.parametrize(("flag", "what"), [("--length-column", "length"), ("--prompt-column", "prompt")])
def test_unknown_column_is_one_error_line(argv: list[str], flag: str, what: str, trace: Path, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    cmd = [a.format(trace=trace, out=tmp_path / "out") for a in argv]
    assert main([*cmd, flag, "nope"]) == 1
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert lines == [f"tailsieve {cmd[0]}: error: trace {trace}: missing {what} column 'nope'; columns are "
                     "prompt_id, response_tokens, generated_tokens"]
    assert captured.out == ""


@pytest.mark.parametrize("cmd", [["analyze", "rare-cap"], ["simulate", "--workload", "rare-cap"],
                                 ["plan", "--workload", "synthetic-math"]])
def test_a_column_of_a_generated_workload_is_refused(cmd: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*cmd, "--length-column", "generated_tokens"]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        f"tailsieve {cmd[0]}: error: workload '{cmd[-1]}' is generated, not read from a file: a length or prompt "
        "column applies to trace files only"]


def test_an_empty_column_name_is_an_argument_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["oracle", "--length-column", " "])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "tailsieve oracle: error: argument --length-column: expected a column name, got ' '"]
