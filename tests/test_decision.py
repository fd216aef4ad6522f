"""Decisions as data (issue 40): every step records the controller's `Decision` (q, m, a `Reason`, the option weighed,
its paired gain and standard error), in `simulate --json`, a rollout's steps.jsonl and report.json; `note` is derived
from it; a resumed rollout reads the decisions back (`Decision.from_json`), and a malformed one is one line."""

from __future__ import annotations

import contextlib
import io
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine_fake import FakeServer
from tailsieve.analysis.report import record_json
from tailsieve.cli import main
from tailsieve.engines.rollout.resume import step_record
from tailsieve.errors import ConfigError
from tailsieve.inputs import MAX_INT
from tailsieve.loop import StepRecord
from tailsieve.policy.controller import CONTROLLERS
from tailsieve.policy.decision import Decision, Reason
from tailsieve.policy.peers import PEERS

REASONS = {r.value for r in Reason}
MOVE = Decision(3, 2, Reason.MOVE_Q, (3, 2), 1.25, 0.5, 4.0)


def record(decision: Decision | None, note: str = "") -> StepRecord:
    return StepRecord(step=4, makespan_s=2.0, tail_s=1.0, bulk_s=2.0, q=2, m=2, candidates=3, wasted_tokens=7,
                      batch_mean_length=5.5, note=note, decision=decision)


# ---- the Decision's JSON ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("decision", [MOVE, Decision(0, 0, Reason.START), Decision(1, 1, Reason.FIXED),
                                      Decision(0, 0, Reason.STAY, (7, 4), -9.5, 1.8),
                                      *(Decision(2, 1, r, (2, 1), 0.1, 0.2, 0.3) for r in Reason)],
                         ids=lambda d: d.reason.value)
def test_a_decision_round_trips_through_json(decision: Decision) -> None:
    doc = json.loads(json.dumps(decision.to_json(), allow_nan=False))
    assert set(doc) == {"q", "m", "reason", "option", "gain_s", "se_s", "cost_s"}
    assert doc["reason"] in REASONS and isinstance(doc["reason"], str)
    back = Decision.from_json(doc)
    assert back == decision and back.note == decision.note


def test_the_json_shape_of_a_decision() -> None:
    assert MOVE.to_json() == {"q": 3, "m": 2, "reason": "move-q", "option": [3, 2], "gain_s": 1.25, "se_s": 0.5,
                              "cost_s": 4.0}
    assert Decision(0, 0, Reason.WARMUP).to_json()["option"] is None
    assert Decision.from_json({"q": 1, "m": 0, "reason": "hold"}) == Decision(1, 0, Reason.HOLD)  # the rest default


GOOD: dict[str, Any] = MOVE.to_json()
REFUSED: list[tuple[dict[str, Any], str]] = [
    (GOOD | {"reason": "bogus"},
     f"decision.reason must be one of {', '.join(r.value for r in Reason)}, got 'bogus'"),
    (GOOD | {"reason": 3}, f"decision.reason must be one of {', '.join(r.value for r in Reason)}, got 3"),
    (GOOD | {"reason": ["stay"]}, f"decision.reason must be one of {', '.join(r.value for r in Reason)}, got ['stay']"),
    (GOOD | {"reason": {}}, f"decision.reason must be one of {', '.join(r.value for r in Reason)}, got {{}}"),
    (GOOD | {"option": [1, 2, 3]}, "decision.option must be null or [q, m]"),
    (GOOD | {"option": "1,2"}, "decision.option must be null or [q, m]"),
    (GOOD | {"option": [-1, 2]}, f"decision.option[0] must be an integer in 0..{MAX_INT}, got -1"),
    (GOOD | {"option": [1, 2.5]}, f"decision.option[1] must be an integer in 0..{MAX_INT}, got 2.5"),
    (GOOD | {"gain_s": math.inf}, "decision.gain_s must be a finite number, got inf"),
    (GOOD | {"gain_s": math.nan}, "decision.gain_s must be a finite number, got nan"),
    (GOOD | {"gain_s": "1.0"}, "decision.gain_s must be a finite number, got '1.0'"),
    (GOOD | {"se_s": -1.0}, "decision.se_s must be a finite number >= 0, got -1.0"),
    (GOOD | {"cost_s": -math.inf}, "decision.cost_s must be a finite number >= 0, got -inf"),
    (GOOD | {"q": -1}, f"decision.q must be an integer in 0..{MAX_INT}, got -1"),
    (GOOD | {"m": True}, f"decision.m must be an integer in 0..{MAX_INT}, got True"),
    ({"q": 1, "m": 1}, "decision: missing key 'reason'"),
    (GOOD | {"why": "x"}, "decision: unknown key 'why'"),
]


@pytest.mark.parametrize(("doc", "message"), REFUSED, ids=[m for _, m in REFUSED])
def test_a_bad_decision_is_refused_in_one_line(doc: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        Decision.from_json(doc)
    assert str(err.value) == message


# ---- step records ------------------------------------------------------------------------------------------------


def test_a_step_record_carries_its_decision_in_every_serialization() -> None:
    rec = record(MOVE, MOVE.note)
    assert record_json(rec)["decision"] == MOVE.to_json() and record_json(rec)["note"] == MOVE.note
    line = json.loads(json.dumps(rec.to_json()))  # a rollout's step line
    assert line["decision"] == MOVE.to_json() and line["note"] == MOVE.note
    assert step_record(line) == rec  # read back on --resume
    assert record_json(record(None))["decision"] is None and record(None).to_json()["decision"] is None
    assert step_record(line | {"decision": None}).decision is None
    older = {k: v for k, v in line.items() if k != "decision"}  # step lines written before issue 40 have none
    assert step_record(older) == record(None, MOVE.note)
    with pytest.raises(ConfigError, match=r"^decision\.reason must be one of .*, got 'later'$"):
        step_record(line | {"decision": GOOD | {"reason": "later"}})


# ---- simulate --json ---------------------------------------------------------------------------------------------


def test_every_controller_step_of_a_simulated_run_has_a_decision(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", "--policy", "tailsieve,tailsieve-paper,tailsieve-fixed,static,verl-lif", "--q", "1", "--m", "1",
            "--replicas", "4", "--groups", "8", "--group-size", "2", "--steps", "6", "--rho", "0.25", "--json"]
    assert main(argv) == 0
    policies = json.loads(capsys.readouterr().out)["policies"]
    assert {"uniform", "tailsieve", "tailsieve-paper", "tailsieve-fixed", "static", "verl-lif"} <= set(policies)
    for name, entry in policies.items():
        steps = entry["steps"]
        assert len(steps) == 6
        if name in PEERS:  # a peer decides nothing
            assert all(s["decision"] is None for s in steps), name
            continue
        assert name in CONTROLLERS
        for s in steps:
            d = Decision.from_json(s["decision"])
            assert s["decision"]["reason"] in REASONS and s["note"] == d.note, (name, s)
    assert {s["decision"]["reason"] for s in policies["uniform"]["steps"]} == {"fixed"}
    assert {(s["decision"]["q"], s["decision"]["m"]) for s in policies["static"]["steps"]} == {(1, 1)}


# ---- a rollout's steps.jsonl and report.json, across a resume ------------------------------------------------------


@pytest.fixture
def servers() -> Iterator[list[FakeServer]]:
    with FakeServer() as a, FakeServer() as b:
        yield [a, b]


def rollout(servers: list[FakeServer], root: Path, steps: int, *extra: str) -> tuple[int, str]:
    if not (root / "p.jsonl").exists():
        (root / "p.jsonl").write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"what is {i}?"}) + "\n"
                                              for i in range(40)))
    argv = ["rollout", "--endpoints", ",".join(s.url for s in servers), "--prompts", str(root / "p.jsonl"),
            "--groups", "4", "--group-size", "2", "--rho", "0.5", "--max-tokens", "20", "--policy", "tailsieve",
            "--m0", "1", "--steps", str(steps), "--out", str(root / "out"), "--give-up-after", "0", *extra]
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        rc = main(argv)
    return rc, err.getvalue()


def lines(root: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (root / "out" / "tailsieve" / "steps.jsonl").read_text().splitlines()]


def test_a_rollout_records_decisions_that_survive_a_resume(servers: list[FakeServer], tmp_path: Path) -> None:
    assert rollout(servers, tmp_path, 2)[0] == 0
    first = lines(tmp_path)
    assert [row["step"] for row in first] == [0, 1]
    for row in first:
        d = Decision.from_json(row["decision"])
        assert row["decision"]["reason"] in REASONS and row["note"] == d.note
    state = json.loads((tmp_path / "out" / "tailsieve" / "state.json").read_text())
    assert state["control"]["decision"] == first[-1]["decision"]  # the decision the next step runs by
    assert rollout(servers, tmp_path, 4, "--resume")[0] == 0
    rows = lines(tmp_path)
    assert rows[:2] == first and [row["step"] for row in rows] == [0, 1, 2, 3]
    assert all(row["decision"]["reason"] in REASONS for row in rows)
    report = json.loads((tmp_path / "out" / "report.json").read_text())["policies"]["tailsieve"]["steps"]
    assert [s["decision"] for s in report] == [row["decision"] for row in rows]  # the resumed steps read back
    assert [s["note"] for s in report] == [row["note"] for row in rows]


def test_a_malformed_decision_in_a_step_line_refuses_the_resume_in_one_line(servers: list[FakeServer],
                                                                          tmp_path: Path) -> None:
    assert rollout(servers, tmp_path, 2)[0] == 0
    path = tmp_path / "out" / "tailsieve" / "steps.jsonl"
    rows = lines(tmp_path)
    rows[1]["decision"]["reason"] = "bogus"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    before = path.read_bytes()
    rc, err = rollout(servers, tmp_path, 3, "--resume")
    assert rc == 1 and err.count("\n") == 1, err
    assert err.startswith(f"tailsieve rollout: error: resume file {path}, line 2: malformed step line "
                          "(decision.reason must be one of start, ")
    assert err.rstrip().endswith("got 'bogus')") and path.read_bytes() == before
