"""The saved controller state (`policy/control_state.py`, docs/controller.md "Saved state"): every field survives the
JSON round trip with its type, a policy's own state is restored as itself, a state of another format or kind is
refused in one line, and a state saved before the per-placement errors keeps its error at its placement."""

from __future__ import annotations

import json
import math
from dataclasses import fields, replace

import numpy as np
import pytest

from tailsieve.errors import ConfigError
from tailsieve.policy.controller import ControlState, PaperState
from tailsieve.policy.decision import Decision, Reason

UNPAID = Decision(2, 1, Reason.UNPAID, (3, 2), 0.5, 0.25, 120.0)
STATE = ControlState(q=2, m=1, calib_tail=1.25, calib_bulk=0.8, calib_uniform=1.1, last_m=1,
                     uniform_dispatch="request", history=(np.array([[3, 70], [12, 5]]), np.array([[1, 2], [0, 9]])),
                     tail_history=(np.array([[70, 12]]),), decision=UNPAID)  # calib_group, move_cost_s: NaN


def trip(obj: object) -> ControlState:
    """Through JSON text and back, as a saved file is."""
    return ControlState.from_json(json.loads(json.dumps(obj)))


def test_every_field_survives_the_json_round_trip_with_its_type() -> None:
    """Every scalar with its type (NaN as null), the histories as tables of token counts, the decision; the note is
    derived from the decision, not saved."""
    back = trip(STATE.to_json())
    for f in fields(ControlState):
        a, b = getattr(back, f.name), getattr(STATE, f.name)
        if f.name in ("history", "tail_history"):
            assert [t.tolist() for t in a] == [t.tolist() for t in b]
        else:
            assert type(a) is type(b) and (a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b)))
    assert STATE.to_json()["calib_group"] is None and math.isnan(back.move_cost_s)
    assert back.note == UNPAID.note == "unpaid; (3, 2): +0.50 s/step ± 0.25, cost 120.0 s"
    assert trip(replace(STATE, move_cost_s=12.5).to_json()).move_cost_s == 12.5


def test_a_policys_own_state_is_restored_as_itself() -> None:
    """`tailsieve-paper`'s state (its C.1 fields) comes back as a `PaperState`; a plain one names its kind."""
    paper = PaperState(**{f.name: getattr(STATE, f.name) for f in fields(ControlState)}, hold=2, velocity=-0.75,
                       rate_tail=0.5)
    doc = json.loads(json.dumps(paper.to_json()))
    assert (doc["format"], doc["state"]) == (2, "tailsieve-paper") and STATE.to_json()["state"] == "control"
    again = ControlState.from_json(doc)
    assert type(again) is PaperState and (again.hold, again.velocity, again.rate_tail) == (2, -0.75, 0.5)
    assert math.isnan(again.rate_bulk) and again.decision == UNPAID
    with pytest.raises(ConfigError, match=r"^control.velocity must be"):
        ControlState.from_json(doc | {"velocity": "x"})


def test_another_format_or_kind_is_refused_in_one_line() -> None:
    """A state saved by an older version (no format; the fields of the controller before issue 40 among them, e.g.
    `last_fresh`) or in another format is refused in one line, never read in part; so is an unknown kind or key."""
    assert "last_fresh" not in STATE.to_json()
    older = {k: v for k, v in STATE.to_json().items() if k not in ("format", "state")} | {
        "bias_tail": 0.05, "last_fresh": []}
    for old, saved in ((older, "by an older TailSieve (no format)"), (older | {"format": 1}, "in format 1"),
                       (older | {"format": 3, "state": "control"}, "in format 3")):
        with pytest.raises(ConfigError) as err:
            trip(old)
        assert str(err.value) == (f"control: saved {saved}; this version restores format 2 only: start a fresh run, "
                                  "or resume with the version that saved it")
    with pytest.raises(ConfigError, match=r"^control.state must name the controller state it holds \(control, "
                                          r"tailsieve-paper\), got 'paper'$"):
        trip(STATE.to_json() | {"state": "paper"})
    with pytest.raises(ConfigError, match=r"^control: unknown key 'hold'$"):  # C.1's fields are the paper's alone
        trip(STATE.to_json() | {"hold": 1})


def test_a_state_saved_before_the_per_placement_errors_keeps_its_error_at_its_placement() -> None:
    """A state saved before each placement had its own error (no `calib_group`) held one uniform error, measured at
    the placement it saved: restored at whole groups, that error is the group placement's and the dealt one is
    unmeasured (the placement probe then measures it, tests/test_placement_probe.py); at dealt requests it stays the
    dealt one. A state saved since is read as saved, and a bad value keeps its own name."""
    now = replace(STATE, q=0, m=0, uniform_dispatch="group", calib_uniform=1.7, calib_group=1.2)
    older = {k: v for k, v in now.to_json().items() if k != "calib_group"}
    at_groups = trip(older)
    assert at_groups.calib_group == 1.7 and math.isnan(at_groups.calib_uniform)
    dealt = trip(older | {"uniform_dispatch": "request"})
    assert dealt.calib_uniform == 1.7 and math.isnan(dealt.calib_group)
    unmeasured = trip({k: v for k, v in older.items() if k != "calib_uniform"})
    assert math.isnan(unmeasured.calib_uniform) and math.isnan(unmeasured.calib_group)
    assert (trip(now.to_json()).calib_uniform, trip(now.to_json()).calib_group) == (1.7, 1.2)
    with pytest.raises(ConfigError, match=r"^control.calib_uniform must be"):
        trip(older | {"calib_uniform": "x"})
