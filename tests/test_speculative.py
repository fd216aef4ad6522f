"""Speculative decoding model (§3.4): limits, exact derived curve, per-pool curves in the simulator, configuration."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import curves, make_curve
from tailsieve.errors import ConfigError
from tailsieve.loop import SKIP_STEPS
from tailsieve.model.curve_names import load_curve
from tailsieve.model.curves import TpotCurve
from tailsieve.model.makespan import finish_times
from tailsieve.model.speculative import (
    MAX_TOKENS,
    METHOD_DEFAULTS,
    Drafter,
    PoolSpec,
    SpecConfig,
    SpecMethod,
)
from tailsieve.policy.controller import CONTROLLERS, ControllerConfig, ControlState
from tailsieve.policy.predictor import Predictor, PredictorFacts
from tailsieve.policy.router import Router, RouterConfig
from tailsieve.simulation.executor import SimExecutor
from tailsieve.simulation.replica import run_replica
from tailsieve.simulation.runs import SimConfig, run_policy
from tailsieve.simulation.spec_budget import matched_budget
from test_sim import fake_workload

CURVE = make_curve()
MTP, EAGLE3, DFLASH, SUFFIX = SpecMethod.MTP, SpecMethod.EAGLE3, SpecMethod.DFLASH, SpecMethod.SUFFIX


def draft_s(spec: SpecConfig, tau: np.ndarray, b: int) -> float:
    """The documented drafting cost per iteration, written out per drafter (v = p = 1)."""
    d, c = spec.depth, spec.cost
    drafter = spec.defaults.drafter
    if drafter is Drafter.AUTOREGRESSIVE:
        return c * d * float(tau[b])
    if drafter is Drafter.PARALLEL:
        return c * float(tau[b * (d + 1)])
    return c * float(tau[b])


def iteration_s(spec: SpecConfig, tau: np.ndarray, b: int) -> float:
    """One verification iteration with b running requests, written out from docs/speculative.md (any v, p): the
    verified tokens b(1 + p·d) read off the piecewise-linear curve by hand."""
    x = b * (1 + spec.share * spec.depth)
    lo = math.floor(x)
    tau_x = float(tau[lo]) + (x - lo) * (float(tau[lo + 1]) - float(tau[lo])) if lo + 1 < tau.size else float(tau[lo])
    verify = float(tau[b]) + spec.verify * (tau_x - float(tau[b]))
    drafter = spec.defaults.drafter
    if drafter is Drafter.AUTOREGRESSIVE:
        return verify + spec.cost * spec.depth * float(tau[b])
    if drafter is Drafter.PARALLEL:
        return verify + spec.cost * verify
    return verify + spec.cost * float(tau[b])


@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.85, 0.999])
@pytest.mark.parametrize("d", [1, 2, 3, 7])
def test_expected_tokens_is_the_geometric_closed_form(alpha: float, d: int) -> None:
    spec = SpecConfig(EAGLE3, d, acceptance=alpha, decay=1.0)
    assert spec.expected_tokens() == pytest.approx((1 - alpha ** (d + 1)) / (1 - alpha), rel=1e-12)


def test_expected_tokens_limits_and_decay() -> None:
    for d in (1, 4, MAX_TOKENS):
        assert SpecConfig(MTP, d, acceptance=1.0, decay=1.0).expected_tokens() == d + 1  # α = 1: d + 1 per step
        assert SpecConfig(MTP, d, acceptance=1 - 1e-9, decay=1.0).expected_tokens() == pytest.approx(d + 1)
        assert SpecConfig(MTP, d, acceptance=0.0).expected_tokens() == 1.0  # α = 0: the bonus token only
    spec = SpecConfig(MTP, 5, acceptance=0.8, decay=0.9)
    by_hand = sum(0.8**k * 0.9 ** (k * (k - 1) / 2) for k in range(6))
    assert spec.expected_tokens() == pytest.approx(by_hand, rel=1e-12)
    assert spec.position_acceptance() == pytest.approx([0.8 * 0.9**k for k in range(5)])
    assert SpecConfig().expected_tokens() == 1.0 and SpecConfig(MTP, 0).expected_tokens() == 1.0


def test_alpha_zero_costs_only_verification() -> None:
    n = 700  # far past the base curve's last measured point (64): the extension is exact too
    for d in (1, 3, 8):
        spec = SpecConfig(MTP, d, acceptance=0.0, draft_cost=0.0)
        table = spec.curve(CURVE).table(n)
        base = CURVE.table(n * (d + 1))
        b = np.arange(1, n + 1)
        assert table[1:] == pytest.approx(base[b * (d + 1)], rel=1e-12)  # τ_spec(b) = τ(b(d+1)), ā = 1
        assert np.all(table[1:] >= CURVE.table(n)[1:])  # never cheaper than plain decoding


def test_alpha_one_gives_d_plus_one_tokens_per_step() -> None:
    d = 4
    spec = SpecConfig(EAGLE3, d, acceptance=1.0, decay=1.0, draft_cost=0.0)
    curve = spec.curve(CURVE)
    base = CURVE.table(10 * (d + 1))
    for b in (1, 5, 10):
        assert curve.tpot_s(b) == pytest.approx(base[b * (d + 1)] / (d + 1), rel=1e-12)
    run = run_replica([50], curve)  # one request, 50 tokens: 50/(d+1) = 10 verification iterations of τ(d+1)
    assert run.makespan == pytest.approx(10 * base[d + 1], rel=1e-12)


@settings(max_examples=60, deadline=None)
@given(
    curves(),
    st.sampled_from(list(SpecMethod)[1:]),
    st.integers(1, 8),
    st.floats(0.0, 1.0),
    st.floats(0.5, 1.0),
    st.floats(0.0, 0.5),
)
def test_derived_curve_is_exact_at_every_batch_size(
    base: TpotCurve, method: SpecMethod, d: int, alpha: float, gamma: float, cost: float
) -> None:
    spec = SpecConfig(method, d, acceptance=alpha, decay=gamma, draft_cost=cost)
    n = 12 * base.batch[-1] + 5
    table = spec.curve(base).table(n)
    tau = base.table(n * (d + 1))
    want = [(tau[b * (d + 1)] + draft_s(spec, tau, b)) / spec.expected_tokens() for b in range(1, n + 1)]
    assert table[0] == 0.0
    assert table[1:] == pytest.approx(want, rel=1e-11)


@settings(max_examples=60, deadline=None)
@given(curves(), st.sampled_from(list(SpecMethod)[1:]), st.integers(1, 8), st.floats(0.0, 1.0),
       st.floats(0.0, 1.0), st.floats(0.0, 1.0))
def test_verify_cost_and_draft_share_are_exact_at_every_batch_size(
    base: TpotCurve, method: SpecMethod, d: int, alpha: float, v: float, p: float
) -> None:
    spec = SpecConfig(method, d, acceptance=alpha, verify_cost=v, draft_share=p)
    assert spec.expected_tokens() == pytest.approx(1 + p * (SpecConfig(method, d, acceptance=alpha)
                                                           .expected_tokens() - 1), rel=1e-12)
    n = 12 * base.batch[-1] + 5
    table = spec.curve(base).table(n)
    tau = base.table(n * (d + 1) + 1)
    want = [iteration_s(spec, tau, b) / spec.expected_tokens() for b in range(1, n + 1)]
    assert table[1:] == pytest.approx(want, rel=1e-11)


def test_verify_cost_and_draft_share_limits() -> None:
    tau = CURVE.table(2000)
    for d in (1, 4):
        free = SpecConfig(MTP, d, acceptance=1.0, decay=1.0, draft_cost=0.0, verify_cost=0.0).curve(CURVE)
        for b in (1, 7, 64, 300):  # v = 0: verification costs a plain decode step, every step gains d + 1
            assert free.tpot_s(b) == pytest.approx(tau[b] / (d + 1), rel=1e-12)
        # p = 0: nothing is drafted, nothing is verified beyond the target token; only the overhead c remains
        idle = SpecConfig(SpecMethod.NGRAM, d, draft_cost=0.2, draft_share=0.0).curve(CURVE)
        assert [idle.tpot_s(b) for b in (1, 9, 64, 200)] == pytest.approx([1.2 * tau[b] for b in (1, 9, 64, 200)])
    literal = SpecConfig(MTP, 3, verify_cost=1.0, draft_share=1.0).curve(CURVE)
    assert literal.tpot_ms == SpecConfig(MTP, 3).curve(CURVE).tpot_ms  # the defaults are the literal model, bit for bit
    cheaper = SpecConfig(MTP, 3, verify_cost=0.4).curve(CURVE)
    assert all(cheaper.tpot_s(b) <= literal.tpot_s(b) for b in range(1, 300))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 40), max_size=9), st.sampled_from([MTP, DFLASH, SUFFIX]), st.integers(1, 6))
def test_all_admit_replica_equals_the_speculative_closed_form(lengths: list[int], method: SpecMethod, d: int) -> None:
    """Token by token: while b requests remain, every token of each costs (τ(b(d+1)) + draft(b))/ā."""
    spec = SpecConfig(method, d)
    tau = CURVE.table(64 * (d + 1))
    t, finish, left = 0.0, [0.0] * len(lengths), list(lengths)
    while any(left):
        running = [i for i, x in enumerate(left) if x > 0]
        b = len(running)
        t += (tau[b * (d + 1)] + draft_s(spec, tau, b)) / spec.expected_tokens()
        for i in running:
            left[i] -= 1
            if left[i] == 0:
                finish[i] = t
    run = run_replica(lengths, spec.curve(CURVE))
    assert run.finish_s == pytest.approx(finish, rel=1e-11, abs=1e-12)
    assert finish_times(lengths, spec.curve(CURVE)) == pytest.approx(finish, rel=1e-11, abs=1e-12)


def test_off_is_the_base_curve_and_labels() -> None:
    assert SpecConfig().curve(CURVE) is CURVE and SpecConfig(MTP, 0).curve(CURVE) is CURVE
    assert SpecConfig(MTP, 3).label == "mtp-3" and SpecConfig(MTP, 0).label == "none"
    assert SpecConfig(DFLASH).depth == METHOD_DEFAULTS[DFLASH].tokens
    assert SpecConfig(MTP, 5).vllm_config() == {"method": "mtp", "num_speculative_tokens": 5}
    assert SpecConfig().vllm_config() is None
    assert SpecConfig(MTP, 3).curve(CURVE).name == "test+mtp-3"


def test_deep_speculation_pays_at_low_batch_and_costs_at_high_batch() -> None:
    """The §3.4 premise on the default curve: the best depth falls as concurrency rises."""
    curve = load_curve("h100-llama3-8b")
    for method in (MTP, EAGLE3, DFLASH):
        best = [min(range(9), key=lambda d: SpecConfig(method, d).curve(curve).tpot_s(b)) for b in (1, 16, 64, 128)]
        assert best == sorted(best, reverse=True) and best[0] >= 3 and best[-1] <= 1, (method, best)


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"method": MTP, "tokens": -1}, "integer in 0..32, got -1"),
        ({"method": MTP, "tokens": 33}, "got 33"),
        ({"method": MTP, "tokens": 2.0}, "got 2.0"),
        ({"method": SpecMethod.NONE, "tokens": 2}, "none takes no speculative tokens, got tokens=2"),
        ({"method": MTP, "acceptance": 1.5}, "acceptance must be [0, 1], got 1.5"),
        ({"method": MTP, "acceptance": math.nan}, "acceptance must be [0, 1], got nan"),
        ({"method": MTP, "decay": -0.1}, "decay must be [0, 1], got -0.1"),
        ({"method": MTP, "draft_cost": math.inf}, "draft_cost must be >= 0 and finite, got inf"),
        ({"method": MTP, "verify_cost": 1.2}, "verify_cost must be [0, 1], got 1.2"),
        ({"method": MTP, "draft_share": -0.5}, "draft_share must be [0, 1], got -0.5"),
        ({"method": "mtp"}, "must be one of none, mtp, eagle3, dflash, ngram, suffix, got 'mtp'"),
    ],
)
def test_config_validates_itself(kwargs: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError) as exc:
        SpecConfig(**kwargs)  # type: ignore[arg-type]
    assert needle in str(exc.value) and "\n" not in str(exc.value)


def test_executor_runs_tail_replicas_on_the_tail_curve() -> None:
    wl = fake_workload()
    rc = RouterConfig(groups=12, group_size=3, replicas=4, rho=0.25)
    fast = SpecConfig(MTP, 4, acceptance=0.95, decay=1.0).curve(CURVE)
    results = []
    for tail_curve in (None, fast):
        router, ex = Router(rc, wl.prompts), SimExecutor(wl, CURVE, rc, tail_curve=tail_curve)
        state = router.initial_state()
        plan = router.warmup(state)
        state = router.observe(state, plan, ex.execute(plan))
        plan = router.plan(state, 2, 1)
        results.append(ex.execute(plan))
    plain, spec = results
    assert spec.bulk_s == plain.bulk_s  # bulk replicas unchanged
    assert 0 < spec.tail_s < plain.tail_s  # the tail pool speculates (low concurrency: it pays)


def test_uniform_runs_every_replica_on_the_bulk_curve() -> None:
    wl, cfg = fake_workload(), SimConfig(router=RouterConfig(groups=8, group_size=4, replicas=4), steps=4)
    bulk = SpecConfig(DFLASH, 2)
    with_spec = run_policy("uniform", wl, CURVE, SimConfig(router=cfg.router, steps=4, spec=PoolSpec(bulk=bulk)))
    direct = run_policy("uniform", wl, bulk.curve(CURVE), cfg)
    tail_only = run_policy("uniform", wl, CURVE, SimConfig(router=cfg.router, steps=4, spec=PoolSpec(tail=bulk)))
    plain = run_policy("uniform", wl, CURVE, cfg)
    assert [s.makespan_s for s in with_spec.steps] == [s.makespan_s for s in direct.steps]
    assert [s.makespan_s for s in tail_only.steps] == [s.makespan_s for s in plain.steps]


def test_predictor_and_controller_use_the_tail_curve() -> None:
    rng = np.random.default_rng(0)
    hist = rng.integers(50, 3000, size=(40, 4))
    fast = SpecConfig(MTP, 4, acceptance=0.95, decay=1.0).curve(CURVE)
    plain = Predictor(hist, PredictorFacts(groups=8, extra=2, replicas=4, curve=CURVE, resamples=3))
    spec = Predictor(hist, PredictorFacts(groups=8, extra=2, replicas=4, curve=CURVE, resamples=3, tail_curve=fast))
    assert np.all(spec.tail_times(2, 1) < plain.tail_times(2, 1))
    assert np.array_equal(spec.bulk_times(2, 1), plain.bulk_times(2, 1))
    assert np.array_equal(spec.bulk_times(0, 0), plain.bulk_times(0, 0))
    rc = RouterConfig(groups=8, group_size=4, replicas=4)
    ctl = CONTROLLERS["tailsieve"](rc, CURVE, ControllerConfig(), tail_curve=fast)
    state = ControlState(q=1, m=1, history=(hist,))
    assert ctl.predictor(state).tail_curve is fast and ctl.predictor(state).curve is CURVE
    assert CONTROLLERS["tailsieve"](rc, CURVE).predictor(state).tail_curve is CURVE  # default: one curve


def test_matched_budget_structure() -> None:
    wl = fake_workload()
    cfg = SimConfig(router=RouterConfig(groups=8, group_size=4, replicas=4, rho=0.25), steps=4)
    seen: list[str] = []
    table = matched_budget(SpecConfig(MTP), [2, 0, 1], wl, CURVE, cfg, policy="static",
                           on_step=lambda label, _i: seen.append(label))
    assert [r.d_base for r in table.rows] == [0, 1, 2]
    assert [len(r.splits) for r in table.rows] == [1, 2, 3]
    assert all(s.d_bulk + s.d_tail == 2 * r.d_base and s.d_tail >= s.d_bulk for r in table.rows for s in r.splits)
    assert table.rows[0].baseline_s == table.reference_s
    assert table.rows[1].baseline_s == run_policy(
        "uniform", wl, CURVE, SimConfig(router=cfg.router, steps=4, spec=PoolSpec.uniform(SpecConfig(MTP, 1)))
    ).mean_step_s()
    assert all(r.best in r.splits and r.best.mean_step_s == min(s.mean_step_s for s in r.splits) for r in table.rows)
    assert table.speedup(table.reference_s) == 1.0
    assert len(seen) == 4 * (1 + 2 + 1 + 2 + 3 + 2) and "static 0/2" in seen  # + tail-only 0/1 and 0/2
    assert table.rows[0].tail_only is None
    assert [(r.tail_only.d_bulk, r.tail_only.d_tail) for r in table.rows[1:] if r.tail_only] == [(0, 1), (0, 2)]
    tail_only = PoolSpec(tail=SpecConfig(MTP, 2), bulk=SpecConfig(MTP, 0))
    only = run_policy("static", wl, CURVE, replace(cfg, spec=tail_only))
    assert table.rows[2].tail_only is not None and table.rows[2].tail_only.mean_step_s == only.mean_step_s()
    assert [r.route_credit for r in table.rows] == [r.splits[0].mean_step_s / r.best.mean_step_s for r in table.rows]
    split = table.rows[2].splits[1]  # 1/3: recompute the tail-bound share from the run's own steps
    run = run_policy("static", wl, CURVE, replace(cfg, spec=PoolSpec(tail=SpecConfig(MTP, 3), bulk=SpecConfig(MTP, 1))))
    two_pool = [s for s in run.steps[SKIP_STEPS:] if s.m > 0 and s.q > 0]
    assert two_pool and split.tail_bound == sum(s.tail_s >= s.bulk_s for s in two_pool) / len(two_pool)
    assert split.mean_step_s == run.mean_step_s()
    with pytest.raises(ConfigError, match="two-pool policy"):
        matched_budget(SpecConfig(MTP), [1], wl, CURVE, cfg, policy="uniform")
    with pytest.raises(ConfigError, match="--spec-budgets values must lie in 0..16, got 17"):
        matched_budget(SpecConfig(MTP), [17], wl, CURVE, cfg)
