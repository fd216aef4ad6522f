"""The paired decision rule (issue 40; docs/controller.md, "The rule") that `tailsieve` and `tailsieve-fixed` run, as
functions of the controller that prices the options (`Controller.times`, `best_q`, `feasible`, `move_cost`).

After each steady step the options are the uniform boundary (requests dealt, or whole groups) and every tail-pool
size m of the controller's `m_grid` at its best q (`Controller.best_q`). Each is priced on the same bootstrap pools,
drawn by history step (`policy.paired`), and the controller moves to the option whose value horizon·(ḡ − t·s) − C is
largest, when it is positive; C is what the move costs once: the measured restart seconds when m changes, and for a
return to the uniform boundary the excess of its first step, which runs the E waiting candidates to completion.
There is no dwell, no confirmation and no reversal back-off: a move that was noise has, by construction, a paired
gain within t·s (t Student's quantile at the confidence of z standard errors, `paired.t_quantile`). C.2's
feasibility stays for moves between two splits.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from tailsieve.policy.calibration import factors
from tailsieve.policy.control_state import ControlState
from tailsieve.policy.controller_base import Controller
from tailsieve.policy.decision import Decision, Reason
from tailsieve.policy.paired import Paired, paired_gain, value
from tailsieve.policy.predictor import Predictor

__all__ = ["Cost", "Option", "current", "decide", "initial", "move_cost", "options"]

Option = tuple[int, int, str]  # (q, m, placement at the uniform boundary: "request" or "group"; "" for a split)
Cost = Callable[[ControlState, Predictor, Option], float]  # one-time seconds of moving to an option


def initial(ctl: Controller, state: ControlState) -> ControlState:
    """`Controller.initial`'s state, but a split at the pinned redraw limit isolates every candidate from the start
    (the rule's q there, `Controller.best_q`); the uniform boundary deals requests unless a prompt prefill makes
    that costly."""
    if state.m > 0 and ctl.router.pins_candidates:
        state = replace(state, q=ctl.q_limit(), decision=Decision(ctl.q_limit(), state.m, Reason.START))
    return replace(state, uniform_dispatch="request" if ctl.prefill_s <= 0 else "group")


def current(state: ControlState) -> Option:
    """The option the state runs."""
    return (0, 0, state.uniform_dispatch) if state.m == 0 else (state.q, state.m, "")


def options(ctl: Controller, state: ControlState, pred: Predictor, m_grid: Sequence[int],
            placements: Sequence[str]) -> list[Option]:
    """Every option but the current one: the uniform `placements` and each m of `m_grid` at its best q."""
    out: list[Option] = [(0, 0, d) for d in placements]
    for mc in m_grid:
        qc, _ = ctl.best_q(state, pred, mc, around=state.q if mc == state.m else None)
        out.append((qc, mc, ""))
    here = current(state)
    return [o for o in out if o != here]


def move_cost(ctl: Controller, state: ControlState, pred: Predictor, option: Option) -> float:
    """One-time seconds of moving to `option`: a restart when m changes; for a return to the uniform boundary also
    its first step's excess, the E waiting candidates run to completion among its N groups."""
    _, m, dispatch = option
    c = ctl.move_cost(state) if m != state.m else 0.0
    if m == 0 and state.m > 0:
        dealt = dispatch == "request"
        excess = float(np.mean(pred.uniform_return_times(dealt))) - float(np.mean(pred.uniform_times(dealt)))
        c += max(0.0, excess) * factors(state)[2]
    return c


def decide(ctl: Controller, state: ControlState, pred: Predictor, opts: Sequence[Option], cost: Cost) -> ControlState:
    """The option of largest value V = horizon·(ḡ − t·s) − C (ties: the smaller m, then the smaller q); a move when
    V > 0 (C.2's feasibility checked for moves between splits, in order of value)."""
    cfg = ctl.config
    cur = current(state)
    here = ctl.times(state, pred, cur[0], cur[1], cur[2] or None)
    steps = len(state.history)
    scored: list[tuple[float, Option, Paired]] = []
    for opt in opts:
        g, se, dof = paired_gain(here, ctl.times(state, pred, opt[0], opt[1], opt[2] or None), steps)
        p = value(g, se, dof, cost(state, pred, opt), cfg.z, cfg.horizon)
        scored.append((p.value_s, opt, p))
    scored.sort(key=lambda x: (-x[0], x[1][1], x[1][0]))
    if not scored:
        return replace(state, decision=Decision(state.q, state.m, Reason.STAY))
    probe = _probe(state, scored)
    if probe is not None:
        return _move(state, probe[1], probe[2], Reason.PROBE)
    deadline = float(np.mean(here))
    refused: tuple[Option, Paired] | None = None
    for v, opt, p in scored:
        if v <= 0:
            break
        m = opt[1]
        if state.m > 0 and m > 0 and m != state.m and not ctl.feasible(state, pred, m, deadline):
            refused = refused or (opt, p)
            continue
        return _move(state, opt, p)
    if refused is not None:
        return replace(state, decision=_decision(state, Reason.INFEASIBLE, *refused))
    v, opt, p = scored[0]
    if not math.isfinite(v):  # fewer than two history steps: nothing to compare on yet
        return replace(state, decision=Decision(state.q, state.m, Reason.STAY))
    unpaid = [(o, x) for _, o, x in scored if x.beyond_noise]  # beyond noise, not worth its cost
    if unpaid:
        return replace(state, decision=_decision(state, Reason.UNPAID, *unpaid[0]))
    return replace(state, decision=_decision(state, Reason.STAY, opt, p))


def _probe(state: ControlState, scored: Sequence[tuple[float, Option, Paired]]) -> tuple[float, Option, Paired] | None:
    """At the uniform boundary, the other placement once while its model error was never measured (two history
    steps at least): the model prices a group's shared prompt only as its file says, and dealing a group over
    replicas prefills its prompt on each, which a model without the prefill term cannot see."""
    if state.m != 0 or not math.isnan(state.calib_uniform if state.uniform_dispatch == "group" else state.calib_group):
        return None
    other = [s for s in scored if s[1][1] == 0 and s[1][2] != state.uniform_dispatch and math.isfinite(s[0])]
    return other[0] if other else None


def _move(state: ControlState, opt: Option, p: Paired, reason: Reason | None = None) -> ControlState:
    q, m, dispatch = opt
    if m == 0:
        reason = reason or (Reason.RETURN if state.m > 0 else Reason.PLACEMENT)
        return replace(state, q=0, m=0, uniform_dispatch=dispatch, decision=_decision(state, reason, opt, p, (0, 0)))
    reason = Reason.LEAVE if state.m == 0 else Reason.MOVE_M if m != state.m else Reason.MOVE_Q
    return replace(state, q=q, m=m, decision=_decision(state, reason, opt, p, (q, m)))


def _decision(state: ControlState, reason: Reason, opt: Option, p: Paired, to: tuple[int, int] | None = None
              ) -> Decision:
    q, m = to if to is not None else (state.q, state.m)
    return Decision(q, m, reason, option=(opt[0], opt[1]), gain_s=p.gain_s, se_s=p.se_s, cost_s=p.cost_s)
