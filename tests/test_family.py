"""The generated regime family (issue 40, `family:SEED`): purity, documented ranges over 200 seeds, the prompt share's
span, the loop share, the splits, and the `load_workload` / `load_curve` hooks with their one-line errors."""

from __future__ import annotations

import math
from dataclasses import MISSING, fields

import numpy as np
import pytest

from tailsieve.analysis.length_stats import between_within_shares
from tailsieve.errors import ConfigError, CurveError
from tailsieve.model.curve_family import family_curve
from tailsieve.model.curve_names import load_curve
from tailsieve.policy.router import RouterConfig
from tailsieve.simulation.runs import SimConfig, run_policy
from tailsieve.workloads import load_workload
from tailsieve.workloads.family import (
    GROUP_SIZES,
    MAX_AGENT_REQUESTS,
    MAX_REQUESTS,
    FamilyRegime,
    RouterShape,
    Split,
    family_generator,
    family_regime,
    family_workload,
    runaway_logit,
    split_of,
    split_seeds,
)
from tailsieve.workloads.regimes import VIDEO_CONFIG, AgentConfig
from tailsieve.workloads.synthetic import SyntheticConfig

SEEDS = range(200)


@pytest.fixture(scope="module")
def regimes() -> list[FamilyRegime]:
    return [family_regime(s) for s in SEEDS]


def test_same_seed_same_regime_and_draws() -> None:
    for seed in (0, 5, 123456):
        a, b = family_regime(seed), family_regime(seed)
        assert a == b and a.describe() == b.describe()
        wa, wb = family_workload(seed), family_workload(seed)
        p = wa.prompts[17]
        assert np.array_equal(wa.lengths(p, 3, 40, 16), wb.lengths(p, 3, 40, 16))
        assert np.array_equal(wa.turns(p, 3, 40, 16), wb.turns(p, 3, 40, 16))
    assert family_regime(0) != family_regime(1)
    w0, w1 = family_workload(7, draw_seed=0), family_workload(7, draw_seed=1)  # the draw seed moves only the draws
    assert w0.prompts == w1.prompts
    assert not np.array_equal(w0.lengths(w0.prompts[0], 0, 0, 64), w1.lengths(w1.prompts[0], 0, 0, 64))


def test_every_parameter_inside_its_documented_range(regimes: list[FamilyRegime]) -> None:
    for r in regimes:
        sh = r.router
        assert r.split is split_of(r.seed) and r.name == f"family:{r.seed}"
        assert sh.group_size in GROUP_SIZES and sh.rho == 0.1 and RouterConfig(**sh.kwargs()).max_redraws == 1
        assert 0.7 <= r.engine_scale <= 1.5 and 0.1 <= r.prompt_share <= 0.9
        assert 2048 <= r.cap <= 32768 and r.cap % 1024 == 0
        assert 5.0 <= r.curve.tpot_ms[0] <= 35.0 and r.curve.is_monotone and r.curve.batch[-1] == 512
        if r.multi_turn:
            g = r.generator
            assert isinstance(g, AgentConfig)
            assert 4 <= sh.replicas <= 64 and sh.groups * sh.group_size <= MAX_AGENT_REQUESTS
            assert sh.groups <= round(32 * sh.replicas) and r.loop_share == 0.0
            assert 0.2 <= g.tool_wait_s <= 5.0 and g.min_turns in (1, 2) and 4 <= g.max_turns <= 12
            assert 40 <= math.exp(g.turn_mu) <= 600 and 2.0 <= g.turns_mean <= 6.0
        else:
            g = r.generator
            assert isinstance(g, SyntheticConfig)
            assert 4 <= sh.replicas <= 256 and sh.groups * sh.group_size <= MAX_REQUESTS
            assert 4 * sh.replicas <= sh.groups <= 32 * sh.replicas + 1
            assert r.loop_share == 0.0 or 0.002 <= r.loop_share <= 0.03
            assert g.runaway_prompt_slope == 0.0 or 0.5 <= g.runaway_prompt_slope <= 3.0
            assert 0.03 * r.cap <= math.exp(g.mu) <= 0.3 * r.cap and 0.35 * r.cap <= g.ceiling <= 0.9 * r.cap
            assert 0.0 <= g.sigma_checkpoint <= 0.3 and 8 <= g.drift_window <= 32
            assert 0.6 <= g.growth <= 2.0 and 20 <= g.growth_steps <= 200
            total = math.sqrt(g.sigma_prompt**2 + g.sigma_interaction**2 + g.sigma_sample**2)
            assert 0.4 <= total <= 1.3 and math.isclose(g.sigma_prompt**2 / total**2, r.prompt_share)


def test_the_family_is_diverse(regimes: list[FamilyRegime]) -> None:
    single = [r for r in regimes if not r.multi_turn]
    assert {r.split for r in regimes} == {Split.TUNE, Split.VALIDATION}
    assert 0.12 <= 1 - len(single) / len(regimes) <= 0.3  # ~20 % multi-turn
    kinds = {("none" if r.loop_share == 0 else "dep" if r.generator.runaway_prompt_slope > 0 else "indep")
             for r in single if isinstance(r.generator, SyntheticConfig)}
    assert kinds == {"none", "dep", "indep"}
    assert any(isinstance(r.generator, SyntheticConfig) and r.generator.growth != 1.0 for r in single)
    reps = [r.router.replicas for r in regimes]
    assert min(reps) <= 5 and max(reps) >= 200
    knees = [r.curve.tpot_ms[4] / r.curve.tpot_ms[0] for r in regimes]  # τ(16) / τ(1)
    assert min(knees) < 1.2 and max(knees) > 2.3  # flat dense .. steep MoE knee
    caps = [r.cap for r in regimes]
    assert min(caps) == 2048 and max(caps) >= 28672
    scales = [r.engine_scale for r in regimes]
    assert min(scales) < 0.75 and max(scales) > 1.45


def test_prompt_share_spans_the_range(regimes: list[FamilyRegime]) -> None:
    """App. B's between-prompt share (one checkpoint, 64 prompts × 8) tracks the drawn share and spans ~0.1-0.9."""
    measured = []
    for r in regimes:
        g = family_generator(r.seed)
        measured.append(between_within_shares([g.lengths(p, 0, 0, 8) for p in g.prompts[:64]])[0])
    m = np.array(measured)
    assert m.min() < 0.2 and m.max() > 0.8
    assert np.corrcoef([r.prompt_share for r in regimes], m)[0, 1] > 0.5


@pytest.mark.parametrize("dependent", [False, True])
def test_loop_share_is_the_drawn_one(regimes: list[FamilyRegime], dependent: bool) -> None:
    """Samples at the cap = loops exactly (the soft ceiling stays below it); their share is the drawn one (4σ)."""
    r = next(r for r in regimes if isinstance(r.generator, SyntheticConfig) and r.loop_share > 0.01
             and (r.generator.runaway_prompt_slope > 0) == dependent)
    g = family_generator(r.seed)
    x = np.stack([g.lengths(p, 0, 0, 8) for p in g.prompts[:2048]])
    share = float((x >= r.cap).mean())
    assert abs(share - r.loop_share) <= 4 * math.sqrt(r.loop_share * (1 - r.loop_share) / x.size)
    assert int(x[x < r.cap].max()) < 0.9 * r.cap


def test_runaway_logit_solves_the_mean() -> None:
    assert math.isclose(runaway_logit(0.01, 0.0), -math.log(99), abs_tol=1e-9)
    assert math.isclose(runaway_logit(0.03, 0.5), VIDEO_CONFIG.runaway_logit, abs_tol=1e-3)  # video-rl's calibration
    assert runaway_logit(0.0, 2.0) == -40.0


def test_splits_by_seed() -> None:
    assert [split_of(s) for s in range(4)] == [Split.TUNE, Split.VALIDATION, Split.TUNE, Split.VALIDATION]
    assert split_seeds("tune", 3) == [0, 2, 4] and split_seeds(Split.VALIDATION, 3) == [1, 3, 5]
    assert split_seeds("tune", 2, start=5) == [6, 8] and split_seeds("validation", 2, start=5) == [5, 7]


def test_load_workload_and_load_curve() -> None:
    w = load_workload("family:3")
    ref = family_workload(3)
    assert w.name == "family:3" and w.is_synthetic and w.max_length == family_regime(3).cap
    assert np.array_equal(w.lengths(w.prompts[5], 2, 9, 8), ref.lengths(ref.prompts[5], 2, 9, 8))
    assert load_workload("family:3", mode="resample", seed=4).seed == 4  # generated: the mode is ignored
    assert load_curve("family:3") == family_regime(3).curve == family_curve(3)
    assert load_curve("family:3").name == "family:3"
    agent = next(s for s in SEEDS if family_regime(s).multi_turn)
    wa = load_workload(f"family:{agent}")
    g = family_regime(agent).generator
    assert isinstance(g, AgentConfig) and wa.tool_wait_s == g.tool_wait_s
    assert wa.turns(wa.prompts[0], 0, 0, 8).min() >= g.min_turns


@pytest.mark.parametrize("bad", ["family:abc", "family:-1", "family:", "family:1.5", "family: 3", "family:4294967296"])
def test_bad_specs_are_one_line_errors(bad: str) -> None:
    text = bad.removeprefix("family:")
    tail = (r"the generated family is addressed as family:SEED with SEED an integer in 0\.\.4294967295 "
            rf"\(e\.g\. family:3\), got '{text}'$")
    with pytest.raises(ConfigError, match=rf"^workload '{bad}': {tail}"):
        load_workload(bad)
    with pytest.raises(CurveError, match=rf"^curve '{bad}': {tail}"):
        load_curve(bad)


def test_bad_arguments() -> None:
    with pytest.raises(ConfigError, match="length or prompt column applies to trace files only"):
        load_workload("family:3", length_column="n")
    for seed in (-1, 2**32, True, 1.5):
        with pytest.raises(ConfigError, match="family seed must be an integer in 0..4294967295"):
            family_regime(seed)  # type: ignore[arg-type]


def test_a_regime_runs_in_the_simulator() -> None:
    """The shape, engine speed, workload and curve plug into `SimConfig` / `run_policy` as bench_family uses them."""
    seed = min(SEEDS, key=lambda s: family_regime(s).router.groups * (99 if family_regime(s).multi_turn else 1))
    r = family_regime(seed)
    cfg = SimConfig(router=RouterConfig(**r.router.kwargs()), engine_scale=r.engine_scale, steps=3, seed=seed)
    run = run_policy("uniform", family_workload(seed, draw_seed=seed), r.curve, cfg)
    assert len(run.steps) == 3 and all(s.makespan_s > 0 for s in run.steps)
    assert all(b.shape == (r.router.groups, r.router.group_size) for b in run.batch_lengths)


def test_the_router_shape_is_router_config_fields_with_their_defaults() -> None:
    """`RouterShape` (the workloads layer may not import the policy layer) declares no router knob of its own: its
    fields are `RouterConfig`'s, with RouterConfig's defaults, and the redraw limit is RouterConfig's default."""
    want = {f.name: f.default for f in fields(RouterConfig)}
    assert {f.name for f in fields(RouterShape)} <= set(want)
    assert all(f.default == want[f.name] for f in fields(RouterShape) if f.default is not MISSING)
    shape = RouterShape(groups=16, group_size=4, replicas=8)
    assert RouterConfig(**shape.kwargs()) == RouterConfig(groups=16, group_size=4, replicas=8)
