"""The placement probe of the paired rule (`paired_rule._probe`, issue 48; docs/controller.md, "The placement
probe"): at the uniform boundary the placement never run is run once, before any move, and each placement is then
priced at its own measured model error."""

from __future__ import annotations

from dataclasses import replace

from conftest import fixed_forecast
from controller_fixtures import history, make
from tailsieve.policy.controller import ControlState
from tailsieve.policy.decision import Reason
from tailsieve.policy.paired import paired_gain

SEARCHED = 2  # a redraw limit above 1: q is searched on `q_grid`


def test_the_other_placement_is_probed_once_before_any_move() -> None:
    """At the uniform boundary, with two history steps, the placement never run is run once (PROBE, its paired
    evidence attached), whatever its value and before any move, a split beyond noise included: the model cannot
    price what dealing a group over replicas costs without the prefill term. Once both placements carry a measured
    error the rule decides on them; a split never probes."""
    hist = tuple(history(seed=k, tail=12.0) for k in range(4))
    c = make("tailsieve", r=4, max_redraws=SEARCHED, move_cost_s=1e6)  # every split unpaid: nothing moves
    s = ControlState(q=0, m=0, history=hist, tail_history=tuple(h[:4] for h in hist), uniform_dispatch="request",
                     calib_uniform=1.3)
    pred = c.predictor(s)
    out = c.decide(s, pred)
    g, se, _ = paired_gain(c.times(s, pred, 0, 0), c.times(s, pred, 0, 0, "group"), 4)
    assert out.decision is not None and out.decision.reason is Reason.PROBE and out.decision.moved
    assert (out.q, out.m, out.uniform_dispatch, out.decision.option) == (0, 0, "group", (0, 0))
    assert (out.decision.gain_s, out.decision.se_s) == (g, se) and g < 0  # probed though the model prices it slower
    assert out.decision.note.startswith("probe the other placement; (0, 0): -")
    measured = replace(s, calib_group=2.0)  # the group placement's error is known (and dear): no probe, stay
    assert c.decide(measured, c.predictor(measured)).decision.reason in (Reason.STAY, Reason.UNPAID)  # type: ignore[union-attr]
    cheap = replace(s, calib_group=1.1)  # measured cheaper than the model alone says: whole groups, by its error
    moved = c.decide(cheap, c.predictor(cheap))
    assert (moved.decision.reason, moved.uniform_dispatch) == (Reason.PLACEMENT, "group")  # type: ignore[union-attr]
    back = replace(out, calib_group=1.1)  # after the probe, from whole groups: the dealt placement is measured
    assert c.decide(back, c.predictor(back)).decision.reason is not Reason.PROBE  # type: ignore[union-attr]
    free = make("tailsieve", r=4, max_redraws=SEARCHED, move_cost_s=0.0)
    fast = fixed_forecast("tailsieve", free, lambda q, m: 100.0 if m == 0 else 1.0)
    first = fast.decide(s, fast.predictor(s))
    assert first.decision is not None and first.decision.reason is Reason.PROBE  # the probe before the split
    then = replace(s, calib_group=1.3)
    leave = fast.decide(then, fast.predictor(then))
    assert leave.decision is not None and leave.decision.reason is Reason.LEAVE  # then the split beyond noise
    split = ControlState(q=1, m=1, history=hist, tail_history=tuple(h[:4] for h in hist))
    assert c.decide(split, c.predictor(split)).decision.reason is not Reason.PROBE  # type: ignore[union-attr]


def test_a_state_saved_before_the_per_placement_errors_probes_the_placement_it_never_ran() -> None:
    """A state saved at whole groups before each placement had its own error (no `calib_group`) is restored with
    its one error as whole groups' (tests/test_control_state.py): the dealt placement is unmeasured, so the restored
    controller probes it, instead of pricing dealing at whole groups' error."""
    hist = tuple(history(seed=k, tail=12.0) for k in range(4))
    now = ControlState(q=0, m=0, history=hist, tail_history=tuple(h[:4] for h in hist), calib_uniform=1.7,
                       calib_group=1.2)
    restored = ControlState.from_json({k: v for k, v in now.to_json().items() if k != "calib_group"})
    c = make("tailsieve", r=4, max_redraws=SEARCHED, move_cost_s=1e6)
    probe = c.decide(restored, c.predictor(restored)).decision
    assert probe is not None and probe.reason is Reason.PROBE and probe.option == (0, 0)
