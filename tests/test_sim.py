"""Simulated rollouts: recorded replay of uniform by hand, step execution, oracles on uniform's draws, registry."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from numpy.typing import NDArray

from conftest import make_curve
from tailsieve.errors import ConfigError
from tailsieve.loop import build_loop
from tailsieve.model.baselines import GroupBatch, get_policy
from tailsieve.model.makespan import makespan
from tailsieve.policy.router import Dispatch, Router, RouterConfig
from tailsieve.policy.step import GroupStatus, Pool
from tailsieve.simulation.executor import SimExecutor
from tailsieve.simulation.replica import ReplicaConfig
from tailsieve.simulation.runs import (
    ORACLES,
    SimConfig,
    check_policy,
    policy_names,
    policy_spec,
    run_policies,
    run_policy,
)
from tailsieve.workloads import ReplayMode, Workload, load_workload

CURVE = make_curve()


@dataclass(frozen=True, slots=True)
class HeavyTail:
    """Test length source: a per-prompt heavy-tailed base times per-generation noise; zeros now and then."""

    n_prompts: int
    seed: int = 0
    zeros: bool = False

    def lengths(self, prompt_id: str, generation: int, step: int, group_size: int) -> NDArray[np.int64]:
        i = int(prompt_id[1:])
        base = 50 + 2000 * (np.random.default_rng([self.seed, i]).pareto(1.5) % 8)
        rng = np.random.default_rng([self.seed, i, generation, 7])
        out = np.maximum(1, base * rng.lognormal(0, 0.4, group_size)).astype(np.int64)
        if self.zeros:
            out[rng.random(group_size) < 0.05] = 0
        return out


def fake_workload(n_prompts: int = 40, *, seed: int = 0, zeros: bool = False) -> Workload:
    """A cheap multi-round workload with prompts p0, p1, …."""
    prompts = tuple(f"p{i}" for i in range(n_prompts))
    return Workload("fake", prompts, None, ReplayMode.RESAMPLE, seed, HeavyTail(n_prompts, seed, zeros))


def small_config(**kw: object) -> SimConfig:
    rc = RouterConfig(groups=16, group_size=4, replicas=4, rho=0.25)
    return SimConfig(router=rc, **kw)  # type: ignore[arg-type]


def test_recorded_uniform_reproduces_hand_computed_step_times(tmp_path: Path) -> None:
    trace = tmp_path / "tiny.csv"
    trace.write_text("prompt_id,length\na,100\nb,50\na,300\nc,250\nb,400\na,200\n", encoding="utf-8")
    wl = load_workload(trace, mode="recorded")
    curve = make_curve(batch=(1, 2), tpot_ms=(10.0, 12.0))  # τ(1) = 10 ms, τ(2) = 12 ms
    cfg = SimConfig(router=RouterConfig(groups=2, group_size=2, replicas=2), steps=3)
    run = run_policy("uniform", wl, curve, cfg)
    # a replica with [x ≥ y] takes 0.010·x + 0.002·y; stream a b | c a | b c, generation g takes samples 2g, 2g+1
    # step 0: a=[100,300] → 3.2, b=[50,400] → 4.1;  step 1: c=[250,250] → 3.0, a=[200,100] → 2.2
    # step 2: b=[50,400] → 4.1, c=[250,250] → 3.0
    assert [s.makespan_s for s in run.steps] == pytest.approx([4.1, 3.0, 4.1], abs=1e-12)
    assert [s.batch_mean_length for s in run.steps] == pytest.approx([212.5, 200.0, 237.5])
    assert run.batch_prompts == (("a", "b"), ("c", "a"), ("b", "c"))
    assert all(s.q == 0 and s.m == 0 and s.wasted_tokens == 0 for s in run.steps)
    assert run.mean_step_s() == pytest.approx(4.1)


def test_steady_step_times_and_aborted_progress() -> None:
    wl = fake_workload()
    rc = RouterConfig(groups=12, group_size=3, replicas=4, rho=0.25)
    router, ex = Router(rc, wl.prompts), SimExecutor(wl, CURVE, rc)
    state = router.initial_state()
    plan = router.plan(state, 2, 1)
    res = ex.execute(plan)
    state = router.observe(state, plan, res)
    plan = router.plan(state, 2, 1)
    res = ex.execute(plan)
    lengths = ex.last_lengths
    tail = [o for o in res.outcomes if o.pool is Pool.TAIL]
    assert len(tail) == 2 and all(o.status is GroupStatus.DONE for o in tail)
    # tail pool alone on replica 3: its makespan is the all-admit makespan of its requests
    assert res.tail_s == pytest.approx(makespan(lengths[:2].ravel(), CURVE))
    done_bulk = sorted(o.finish_s for o in res.outcomes if o.pool is Pool.BULK and o.status is GroupStatus.DONE)
    assert len(done_bulk) == plan.bulk_quota == 10 and res.bulk_s == done_bulk[-1]
    assert res.makespan_s == max(res.tail_s, res.bulk_s)
    for i, o in enumerate(res.outcomes):
        full = lengths[i].tolist()
        if o.status is GroupStatus.ABORTED:  # the progress an abort at the cutoff reports
            assert all(0 <= t <= f for t, f in zip(o.lengths, full, strict=True))
            assert o.finished_members == sum(t == f for t, f in zip(o.lengths, full, strict=True)) < len(full)
        else:
            assert list(o.lengths) == full and o.finish_s is not None and o.finish_s <= res.makespan_s


def test_run_is_deterministic_and_reports_each_step() -> None:
    wl = fake_workload()
    ticks: list[tuple[str, int]] = []
    a = run_policy("tailsieve", wl, CURVE, small_config(steps=6), on_step=lambda n, i: ticks.append((n, i)))
    b = run_policy("tailsieve", wl, CURVE, small_config(steps=6))
    assert a.steps == b.steps
    assert ticks == [("tailsieve", i) for i in range(1, 7)]
    st = run_policy("static", wl, CURVE, small_config(steps=3, q=2, m=1))
    assert st.steps[0].warmup and st.steps[0].wasted_tokens > 0 and st.steps[0].candidates == 4
    assert [(s.q, s.m) for s in st.steps] == [(0, 0), (2, 1), (2, 1)]  # warm-up: every replica bulk


def test_oracles_replay_uniform_draws_with_exact_makespans() -> None:
    wl = fake_workload()
    cfg = small_config(steps=5)
    runs = run_policies(list(policy_names()), wl, CURVE, cfg)
    assert list(runs) == list(policy_names())
    uni = runs["uniform"]
    for name in ORACLES:
        run = runs[name]
        assert run.batch_lengths is uni.batch_lengths and run.consumed_uids == uni.consumed_uids
        for rec, lens in zip(run.steps, uni.batch_lengths, strict=True):
            assert rec.makespan_s == pytest.approx(get_policy(name).assign(GroupBatch(lens), 4, CURVE).makespan_s)
            assert rec.wasted_tokens == 0
    for rec, lens in zip(uni.steps, uni.batch_lengths, strict=True):  # the sim's uniform = the baseline's uniform
        assert rec.makespan_s == pytest.approx(get_policy("uniform").assign(GroupBatch(lens), 4, CURVE).makespan_s)
        assert runs["topq-best"].steps[rec.step].makespan_s <= rec.makespan_s + 1e-9
    alone = run_policy("seer-oracle", wl, CURVE, cfg)  # without a reference it runs uniform itself
    assert alone.steps == runs["seer-oracle"].steps


def test_oracles_use_the_replica_model_when_options_are_on() -> None:
    wl = fake_workload()
    cfg = small_config(steps=2, replica=ReplicaConfig(max_num_seqs=1))
    uni = run_policy("uniform", wl, CURVE, cfg)
    run = run_policy("uniform-oracle", wl, CURVE, cfg, reference=uni)
    tau1 = CURVE.tpot_s(1)
    for rec, lens in zip(run.steps, uni.batch_lengths, strict=True):  # one request at a time: τ(1)·Σ tokens
        a = get_policy("uniform-oracle").assign(GroupBatch(lens), 4, CURVE)
        loads = np.bincount(a.replica.ravel(), weights=lens.ravel(), minlength=4)
        assert rec.makespan_s == pytest.approx(tau1 * loads.max())


def test_uniform_stays_group_atomic_with_request_dispatch() -> None:
    wl = fake_workload()
    rc = RouterConfig(groups=8, group_size=4, replicas=3, dispatch=Dispatch.REQUEST)
    router = Router(rc, wl.prompts)
    plan = router.plan(router.initial_state(), 0, 0)
    assert all(len(set(reps)) == 1 for reps in plan.placement.values())
    assert [plan.placement[r.uid][0] for r in plan.bulk] == [i % 3 for i in range(8)]


def test_policy_registry_and_errors() -> None:
    assert policy_names()[:5] == ("uniform", *ORACLES)
    assert {"static", "tailsieve", "tailsieve-fixed", "tailsieve-paper"} <= set(policy_names())
    with pytest.raises(ConfigError, match="valid: uniform"):
        check_policy("nope", 8)
    for name in ("tailsieve", "static", "streamrl-oracle", "topq-best"):
        with pytest.raises(ConfigError, match="at least 2 replicas"):
            check_policy(name, 1)
    for name in ("uniform", "uniform-oracle", "seer-oracle"):
        check_policy(name, 1)
    with pytest.raises(ConfigError, match="steps"):
        SimConfig(steps=0)


def test_restart_s_is_charged_exactly_when_m_changes() -> None:
    wl, curve = fake_workload(), make_curve()
    base = run_policy("static", wl, curve, small_config(steps=5, q=1, m=1))
    paid = run_policy("static", wl, curve, small_config(steps=5, q=1, m=1, restart_s=7.5))
    ms = [s.m for s in base.steps]
    assert ms == [0, 1, 1, 1, 1]  # warm-up runs every replica as bulk, then one move to m = 1
    extra = [p.makespan_s - b.makespan_s for p, b in zip(paid.steps, base.steps, strict=True)]
    assert extra == pytest.approx([0.0, 7.5, 0.0, 0.0, 0.0])
    with pytest.raises(ConfigError, match="restart_s must be >= 0 and finite, got -1"):
        small_config(restart_s=-1.0)


def test_engine_scale_slows_the_replicas_not_the_policies_cost_model() -> None:
    """All-admit step times are linear in τ: at engine_scale 1.4 every uniform step takes exactly 1.4× as long, and
    the controller's model error at the uniform boundary is 1.4, which a split it has not run yet borrows
    (`calibration.model_errors`)."""
    from tailsieve.policy.calibration import factors

    wl, curve = fake_workload(), make_curve()
    base = run_policy("uniform", wl, curve, small_config(steps=3))
    slow = run_policy("uniform", wl, curve, small_config(steps=3, engine_scale=1.4))
    assert [s.makespan_s for s in slow.steps] == pytest.approx([1.4 * s.makespan_s for s in base.steps])
    spec = policy_spec("tailsieve", wl, curve, small_config(engine_scale=1.4))
    assert spec.cost.bulk_curve == curve  # the policy is not told
    loop = build_loop(spec, wl.prompts)
    ex = SimExecutor(wl, curve.scaled(1.4), spec.router)
    out = loop.step(loop.initial(), ex)
    assert out.plan.m == 0 and out.state.control.calib_uniform == pytest.approx(1.4)
    assert factors(out.state.control)[:2] == pytest.approx((1.4, 1.4), rel=0.05)  # × the forecast biases (≤ ±2%)
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ConfigError, match="engine_scale must be > 0 and finite, got"):
            small_config(engine_scale=bad)


@pytest.mark.slow
def test_controller_that_prices_restarts_moves_less_and_finishes_sooner() -> None:
    """rare-cap (isolation pays, so the controller leaves uniform and moves m) with a 120 s restart per pool move:
    the controller that learns the price moves less and beats one that ignores it (a horizon so long that any gain
    repays any restart). Measured: 1 move against 4, 112.4 s against 121.1 s per step."""
    from tailsieve.model.curve_names import load_curve
    from tailsieve.policy.controller import ControllerConfig
    from tailsieve.policy.decision import Reason

    wl, curve = load_workload("rare-cap"), load_curve("h100-llama3-8b")
    runs = {name: run_policy("tailsieve", wl, curve, SimConfig(steps=40, restart_s=120.0, controller=ctl))
            for name, ctl in (("aware", ControllerConfig()), ("blind", ControllerConfig(horizon=10**9)))}
    moves = {k: sum(a.m != b.m for a, b in zip(r.steps, r.steps[1:], strict=False)) for k, r in runs.items()}
    assert moves["aware"] < moves["blind"]
    # what the aware controller turned down, it turned down for the restart: a gain beyond noise, unpaid
    refused = [r.decision for r in runs["aware"].steps if r.decision is not None and r.decision.reason is Reason.UNPAID]
    assert refused and all(d.cost_s == pytest.approx(120.0) and d.gain_s > 0 for d in refused)
    assert runs["aware"].mean_step_s() < runs["blind"].mean_step_s()
    free = run_policy("tailsieve", wl, curve, SimConfig(steps=40, controller=ControllerConfig()))
    blind_free = run_policy("tailsieve", wl, curve,
                            SimConfig(steps=40, controller=ControllerConfig(horizon=10**9)))
    assert [s.m for s in free.steps] == [s.m for s in blind_free.steps]  # without restarts the price changes nothing


@dataclass(frozen=True, slots=True)
class Scaled:
    """`HeavyTail` with every length multiplied by `factor` (a pure growth of the lengths, no cap)."""

    inner: HeavyTail
    factor: int

    def lengths(self, prompt_id: str, generation: int, step: int, group_size: int) -> NDArray[np.int64]:
        return self.inner.lengths(prompt_id, generation, step, group_size) * self.factor


@pytest.mark.parametrize(("policy", "q", "m"), [("uniform", None, None), ("static", 2, 1), ("static", 4, 2)])
def test_pure_length_growth_scales_every_step_time(policy: str, q: int | None, m: int | None) -> None:
    """With τ a function of concurrency alone and no cap, lengths × c give step times × c for every split: the
    cutoff and the candidate ranking depend on order only. So a growth of all lengths (`math-drift`'s ramp) cannot
    change which split is best; only what does not scale (the cap, a ceiling, KV and prefill terms) can."""
    base = fake_workload()
    grown = Workload("fake", base.prompts, None, ReplayMode.RESAMPLE, 0, Scaled(HeavyTail(40, 0), 3))
    cfg = small_config(steps=6, q=q, m=m) if policy == "static" else small_config(steps=6)
    a, b = run_policy(policy, base, CURVE, cfg), run_policy(policy, grown, CURVE, cfg)
    np.testing.assert_allclose([s.makespan_s for s in b.steps], [3 * s.makespan_s for s in a.steps], rtol=1e-9)
    # aborted progress is whole tokens: equal up to one token of rounding per aborted request (64 requests per step)
    np.testing.assert_allclose([s.wasted_tokens for s in b.steps], [3 * s.wasted_tokens for s in a.steps], atol=3 * 64)
    assert b.batch_prompts == a.batch_prompts
