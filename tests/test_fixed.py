"""`tailsieve-fixed` (`policy/fixed.py`): the paired rule with m held at R // 2, its only options the q of that split
(docs/controller.md)."""

from __future__ import annotations

from dataclasses import replace

from conftest import fixed_forecast, make_curve
from controller_fixtures import history, make
from tailsieve.policy.controller import ControllerConfig
from tailsieve.policy.decision import Decision, Reason
from tailsieve.policy.router import RouterConfig

SEARCHED = 2  # a redraw limit above 1: candidates left in the bulk pool are redrawn, so q is searched on `q_grid`
HIST = tuple(history(seed=k) for k in range(4))  # four history steps of 16 groups


def test_tailsieve_fixed_never_leaves_half_the_fleet() -> None:
    """m = R // 2 from the start whatever m0, and its only options are the q of that split: a faster uniform
    boundary or another m is never taken, a faster q is (q searched: a redraw limit of 2; the fastest, q = 3, lies
    inside 1..E = 4)."""
    c = make("tailsieve-fixed", r=8, m0=0, q0=1, max_redraws=SEARCHED)
    assert (c.initial().q, c.initial().m, c.initial().decision) == (1, 4, Decision(1, 4, Reason.START))
    assert c.m_grid(4) == [4] and c.placements() == ()
    f = fixed_forecast("tailsieve-fixed", c, lambda q, m: 1.0 if m != 4 else 20.0 - q + 2.0 * (q == 4))
    s = replace(c.initial(), history=HIST)
    pred = f.predictor(s)
    assert f.options(s, pred) == [(3, 4, "")]
    out = f.decide(s, pred)
    assert out.decision == Decision(3, 4, Reason.MOVE_Q, (3, 4), 2.0, 0.0, 0.0)  # 19 s at q = 1, 17 s at q = 3
    assert f.options(out, pred) == [] and f.decide(out, pred).decision == Decision(3, 4, Reason.STAY)


def test_tailsieve_fixed_in_the_simulator_stays_at_half_the_fleet() -> None:
    """A short simulated run: `tailsieve-fixed` keeps m = R/2 on every steady step, never moves m, never returns."""
    from tailsieve.simulation.runs import SimConfig, run_policy
    from test_sim import fake_workload

    cfg = SimConfig(router=RouterConfig(groups=16, group_size=4, replicas=4, rho=0.25), steps=10,
                    controller=ControllerConfig(m0=2))
    fixed = run_policy("tailsieve-fixed", fake_workload(60), make_curve(), cfg)
    assert all(r.m == 2 for r in fixed.steps if not r.warmup)
    assert all(r.decision is not None and r.decision.m == 2 and r.decision.reason not in
               (Reason.RETURN, Reason.LEAVE, Reason.MOVE_M, Reason.PLACEMENT) for r in fixed.steps)
