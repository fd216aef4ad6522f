"""Golden decision traces (issue 40, build item 7): `tailsieve`'s (q, m, reason) at every step of three 20-step runs
must equal tests/data/golden/decisions.json exactly, so a change of behaviour shows in review. After an intended
change, rewrite them with `python scripts/golden_decisions.py` and explain the diff."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("golden_decisions", ROOT / "scripts" / "golden_decisions.py")
assert _spec is not None and _spec.loader is not None
golden = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(golden)

SAVED: dict[str, list[list[object]]] = json.loads(golden.GOLDEN.read_text())


@pytest.fixture(scope="module")
def now() -> dict[str, list[list[object]]]:
    return golden.traces()  # type: ignore[no-any-return]


@pytest.mark.parametrize("case", [f"{w}/{c}" for w, c in golden.CASES])
def test_decision_trace_is_the_golden_one(case: str, now: dict[str, list[list[object]]]) -> None:
    assert len(now[case]) == golden.STEPS
    for got, want in zip(now[case], SAVED[case], strict=True):
        assert got == want, f"{case} step {want[0]}: (q, m, reason) {got[1:]} != golden {want[1:]}"


def test_the_golden_traces_cover_the_rule() -> None:
    # the three cases exercise the placement probe, a leave, a hold in the split, moves of m, and a return to the
    # uniform boundary
    reasons = {row[3] for rows in SAVED.values() for row in rows}
    assert {"probe", "leave", "stay", "warmup", "move-m", "return"} <= reasons
    assert all(rows[1][3] == "probe" for rows in SAVED.values())  # once, after the first two history steps
    assert all(row[2] > 0 for row in SAVED["rare-cap/h100-llama3-8b"][4:])
    assert SAVED["video-rl/a100x4-mixtral-8x7b"][-1][3] == "return"  # back to the uniform boundary
