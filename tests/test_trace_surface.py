"""A new user's trace (issue 42): column aliases are recognised whatever their case (`Length` is `length`), and a
trace or prompt set with fewer prompts than a step draws (N + E) is run with a one-line warning, not silently."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine_fake import FakeServer
from tailsieve.cli import main
from tailsieve.policy.router import RouterConfig
from tailsieve.workloads.traces import (
    LENGTH_ALIASES,
    PROMPT_ALIASES,
    PROMPT_TOKEN_ALIASES,
    SAMPLE_ALIASES,
    STEP_ALIASES,
    read_trace,
)

CASES = {"upper": str.upper, "title": str.title, "swapcase": str.swapcase}
ALIASES = [("length", a) for a in LENGTH_ALIASES] + [("prompt", a) for a in PROMPT_ALIASES] + \
    [("step", a) for a in STEP_ALIASES] + [("sample", a) for a in SAMPLE_ALIASES] + \
    [("prompt_tokens", a) for a in PROMPT_TOKEN_ALIASES]
DEFAULTS = {"length": "length", "prompt": "prompt_id", "step": "step", "sample": "sample",
            "prompt_tokens": "prompt_tokens"}


def write(tmp_path: Path, header: list[str], rows: list[list[int | str]]) -> Path:
    p = tmp_path / "t.csv"
    p.write_text(",".join(header) + "\n" + "".join(",".join(map(str, r)) + "\n" for r in rows), encoding="utf-8")
    return p


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize(("role", "alias"), ALIASES, ids=[f"{r}-{a}" for r, a in ALIASES])
def test_every_alias_is_recognised_in_any_case(role: str, alias: str, case: str, tmp_path: Path) -> None:
    spelled = CASES[case](alias)
    header = [spelled if r == role else DEFAULTS[r] for r in DEFAULTS]
    path = write(tmp_path, header, [[7 + i, f"p{i}", 0, i, 3] for i in range(4)])
    t = read_trace(path)
    assert t.meta[f"{role}_column"] == spelled
    assert t.length.tolist() == [7, 8, 9, 10] and t.prompt_id.tolist() == ["p0", "p1", "p2", "p3"]
    assert t.sample is not None and t.sample.tolist() == [0, 1, 2, 3]


def test_the_reported_length_header_is_read(tmp_path: Path) -> None:
    t = read_trace(write(tmp_path, ["prompt_id", "Length"], [["a", 5], ["a", 9]]))
    assert t.length.tolist() == [5, 9] and t.meta["length_column"] == "Length"


@pytest.mark.parametrize(("header", "expect"), [
    (["LENGTH", "length"], "length"),  # the exact spelling wins over a case variant
    (["length", "LENGTH"], "length"),
    (["Response_Tokens", "LENGTH"], "LENGTH"),  # alias order first: length before response_tokens
    (["NUM_TOKENS", "Output_Length"], "Output_Length"),
])
def test_exact_spelling_and_alias_order_decide(header: list[str], expect: str, tmp_path: Path) -> None:
    t = read_trace(write(tmp_path, ["prompt_id", *header], [["a", 1, 2], ["b", 3, 4]]))
    assert t.meta["length_column"] == expect
    assert t.length.tolist() == ([1, 3] if header.index(expect) == 0 else [2, 4])


def test_an_override_is_matched_ignoring_case_too(tmp_path: Path) -> None:
    t = read_trace(write(tmp_path, ["Prompt", "Tokens"], [["a", 1], ["b", 2]]), length_column="tokens",
                   prompt_column="PROMPT")
    assert t.meta["length_column"] == "Tokens" and t.meta["prompt_column"] == "Prompt"


SHAPES = [(groups, rho) for groups in (4, 10, 64) for rho in (0.0, 0.1, 0.5)]


@pytest.mark.parametrize("short", [True, False], ids=["short", "enough"])
@pytest.mark.parametrize(("groups", "rho"), SHAPES)
def test_simulate_warns_exactly_when_a_step_draws_more_groups_than_there_are_prompts(
        groups: int, rho: float, short: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    need = groups + RouterConfig(groups=groups, rho=rho).extra
    prompts = need - 1 if short else need
    path = write(tmp_path, ["prompt_id", "length"], [[f"p{i}", 50 + 37 * i % 900] for i in range(prompts)])
    assert main(["simulate", "--workload", str(path), "--groups", str(groups), "--group-size", "2", "--rho", str(rho),
                 "--replicas", "2", "--steps", "3", "--policy", "uniform", "--json"]) == 0
    cap = capsys.readouterr()
    assert json.loads(cap.out)["groups"] == groups  # the run itself goes ahead
    warning = (f"tailsieve simulate: warning: workload t has {prompts:,} prompts but a step draws N + E = {need:,} "
               f"groups (N = {groups}, rho = {rho:g}), so prompts repeat within a step; lower --groups or give more "
               "prompts\n")
    assert cap.err == (warning if short else "")


def test_the_reported_case_warns_in_plan_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """50 prompts at the default N = 64 (ρ = 0.1: 71 groups a step)."""
    path = write(tmp_path, ["prompt_id", "length"], [[f"p{i}", 100 + 13 * i] for i in range(50) for _ in range(2)])
    assert main(["plan", "--workload", str(path), "--steps", "3", "--json"]) == 0
    err = capsys.readouterr().err
    assert err == ("tailsieve plan: warning: workload t has 50 prompts but a step draws N + E = 71 groups (N = 64, "
                   "rho = 0.1), so prompts repeat within a step; lower --groups or give more prompts\n")


@pytest.mark.parametrize("prompts", [5, 8])
def test_rollout_warns_about_a_short_prompt_set_once_the_run_goes_ahead(
        prompts: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps({"question_id": f"q{i}", "question": "1+1?"}) + "\n" for i in range(prompts)))
    with FakeServer() as a, FakeServer() as b:
        rc = main(["rollout", "--endpoints", f"{a.url},{b.url}", "--prompts", str(path), "--groups", "8",
                   "--group-size", "2", "--rho", "0", "--steps", "1", "--max-tokens", "8", "--policy", "uniform",
                   "--template", "none", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 0, err
    warning = (f"tailsieve rollout: warning: prompt set {path} has 5 prompts but a step draws N + E = 8 groups "
               "(N = 8, rho = 0), so prompts repeat within a step; lower --groups or give more prompts")
    assert [line for line in err.splitlines() if "warning" in line] == ([warning] if prompts < 8 else [])


def test_a_failing_command_prints_its_error_line_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The warning is noted, but the run does not go ahead: the error stays one line (and the warning is not
    carried into the next command)."""
    path = write(tmp_path, ["prompt_id", "length"], [["a", 10], ["b", 20]])
    assert main(["simulate", "--workload", str(path), "--curve", "no-such-curve", "--steps", "3"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("tailsieve simulate: error: ")
    assert main(["simulate", "--workload", str(path), "--groups", "1", "--rho", "0", "--replicas", "1",
                 "--steps", "3", "--policy", "uniform", "--json"]) == 0
    assert capsys.readouterr().err == ""
