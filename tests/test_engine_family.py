"""The family's engine half (`workloads.engine_family`): pure in its seed, inside its documented ranges, a truth the
controller's curve does not hold, workloads with prompt tokens that run on the paged engine; and the split enforced
by `bench/bench_family.py` (validation refuses tuning knobs and names its commit)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tailsieve.errors import ConfigError
from tailsieve.model.engine import EngineTruth
from tailsieve.policy.router import RouterConfig
from tailsieve.simulation.replica import ReplicaConfig
from tailsieve.simulation.runs import SimConfig, run_policy
from tailsieve.workloads.engine_family import ENGINE_SEEDS, engine_regime, engine_seeds, engine_workload
from tailsieve.workloads.family import MAX_AGENT_REQUESTS, MAX_REQUESTS, Split

SEEDS = engine_seeds("tune", 24) + engine_seeds("validation", 24)
BENCH = Path(__file__).resolve().parent.parent / "bench" / "bench_family.py"


@pytest.fixture(scope="module")
def regimes() -> list:  # type: ignore[type-arg]
    return [engine_regime(s) for s in SEEDS]


def test_pure_in_its_seed_and_new_seeds_only() -> None:
    a, b = engine_regime(1007), engine_regime(1007)
    assert a.truth == b.truth and a.base.router == b.base.router and a.prompt_median == b.prompt_median
    with pytest.raises(ConfigError, match="start at seed"):
        engine_regime(ENGINE_SEEDS - 1)
    assert engine_seeds(Split.VALIDATION, 3) == [1001, 1003, 1005] and engine_seeds("tune", 2) == [1000, 1002]


def test_ranges_and_blind_regions_are_covered(regimes: list) -> None:  # type: ignore[type-arg]
    for r in regimes:
        shape, e = r.base.router, r.truth.engine
        limit = MAX_AGENT_REQUESTS if r.base.multi_turn else MAX_REQUESTS
        assert shape.groups * shape.group_size <= limit and 4 <= shape.replicas <= 1024 and shape.group_size <= 64
        assert 0 <= e.speed.spread <= 0.2 and 0 <= e.speed.drift <= 0.05
        assert r.truth.curve != r.curve and r.truth.prefill_ms_per_token > 0  # the truth is not the belief
        if r.base.multi_turn:
            assert e.kv_tokens is None and e.max_num_batched_tokens is None and not e.prefix_caching
        if e.kv_tokens is not None:
            assert e.kv_tokens >= r.base.generator.max_length and e.kv_tokens % 16 == 0
    assert sum(r.kv_bound for r in regimes) >= 6
    assert any(r.base.router.group_size >= 32 for r in regimes)
    assert any(r.prompt_median >= 4096 for r in regimes)
    assert any(r.base.router.replicas > 256 for r in regimes)
    assert any(r.base.multi_turn and r.base.generator.tool_wait_s > 10 for r in regimes)
    assert any(not r.base.multi_turn and r.base.cap >= 16384 and r.base.loop_share == 0 and
               r.base.generator.runaway_logit > -10 for r in regimes)  # cap-dominated chain-of-thought


def test_a_kv_bound_regime_preempts_on_the_truth_and_the_belief_is_the_curve() -> None:
    r = next(engine_regime(s) for s in SEEDS if engine_regime(s).kv_bound and engine_regime(s).base.router.groups
             * engine_regime(s).base.router.group_size < 600)
    wl = engine_workload(r, draw_seed=1)
    assert all(1 <= (wl.prompt_tokens(p) or 0) <= 2.5 * r.prompt_median for p in wl.prompts[:50])
    e = r.truth.engine
    rep = ReplicaConfig(kv_ms_per_1k_tokens=r.truth.kv_ms_per_1k, prefill_ms_per_token=r.truth.prefill_ms_per_token,
                        kv_tokens=e.kv_tokens, block_size=e.block_size, max_num_batched_tokens=e.max_num_batched_tokens,
                        prefix_caching=e.prefix_caching)
    cfg = SimConfig(router=RouterConfig(**r.base.router.kwargs()), steps=3, replica=rep, truth_curve=r.truth.curve,
                    speed=e.speed, belief=ReplicaConfig())
    run = run_policy("uniform", wl, r.curve, cfg)
    assert sum(s.preemptions for s in run.steps) > 0 and np.isfinite([s.makespan_s for s in run.steps]).all()
    assert EngineTruth() != e


@pytest.mark.parametrize("argv", [["--ablate", "no-kv-term"], ["--controller", '{"z": 1.0}']])
def test_validation_refuses_tuning_knobs(argv: list[str]) -> None:
    out = subprocess.run([sys.executable, str(BENCH), "--split", "validation", *argv], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2 and "run on --split tune only" in out.stderr.strip().splitlines()[-1]


def test_each_belief_holds_what_its_source_can_know() -> None:
    sys.path.insert(0, str(BENCH.parent))
    from family_beliefs import BELIEFS, belief_replica

    eng = next(r for r in map(engine_regime, engine_seeds(Split.TUNE, 64)) if r.truth.engine.kv_tokens is not None)
    tm, e = eng.truth, eng.truth.engine
    curve, servers, profile = (belief_replica(b, eng) for b in BELIEFS)
    assert curve == ReplicaConfig()  # the family curve only
    # a server reports its KV capacity and block size, never a cost term
    assert servers == ReplicaConfig(kv_tokens=e.kv_tokens, block_size=e.block_size)
    assert servers.kv_ms_per_1k_tokens == 0 and servers.prefill_ms_per_token == 0 and servers.kv_tokens is not None
    assert (profile.kv_ms_per_1k_tokens, profile.prefill_ms_per_token, profile.kv_tokens) == (
        tm.kv_ms_per_1k, tm.prefill_ms_per_token, e.kv_tokens)
    with pytest.raises(ValueError, match="belief must be one of"):
        belief_replica("oracle", eng)


def test_the_summary_sets_uniform_beside_the_reference(capsys: pytest.CaptureFixture[str]) -> None:
    """`family_report.summary`: P / max(reference, uniform) is P's speedup over the better of the reference and
    uniform (speedups are over uniform, which is 1): where uniform beats the reference (whole groups win), P is
    held to uniform; elsewhere it equals P / reference."""
    sys.path.insert(0, str(BENCH.parent))
    from family_report import summary

    def row(speedup: float, reference: float) -> dict:  # type: ignore[type-arg]
        return {"reference": reference, "policies": {"tailsieve": {
            "speedup": speedup, "ratio_ref": speedup / reference, "noise": 0.01, "length_ratio": 1.0}}}

    rows = [row(0.9, 0.8), row(1.1, 1.2), row(1.3, 1.25)]  # uniform beats the first's reference: 0.9, not 1.125
    s = summary(rows, ("tailsieve",))["tailsieve"]
    assert (s["ratio_ref"]["median"], s["ratio_ref"]["min"]) == (pytest.approx(1.04), pytest.approx(1.1 / 1.2))
    both = s["ratio_ref_or_uniform"]
    assert (both["median"], both["min"], both["p5"]) == (pytest.approx(1.1 / 1.2), pytest.approx(0.9),
                                                         pytest.approx(0.9 + 0.1 * (1.1 / 1.2 - 0.9)))
    assert "tailsieve        / max(reference, uniform): median 0.917  p5 0.902  min 0.900" in capsys.readouterr().out
