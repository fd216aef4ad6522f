"""`plan --spec`: the depth-per-pool grid against run_policy, the answer it picks, and its argument errors."""

from __future__ import annotations

import argparse
import math
from dataclasses import replace

import pytest

from conftest import make_curve
from tailsieve.cli.plan_spec import answer, parse_depths
from tailsieve.errors import ConfigError
from tailsieve.model.spec_parse import parse_spec
from tailsieve.model.speculative import PoolSpec
from tailsieve.policy.router import RouterConfig
from tailsieve.simulation.runs import SimConfig, run_policy
from test_sim import fake_workload

CURVE = make_curve()


def test_parse_depths() -> None:
    assert parse_depths("3, 0,1,1") == (0, 1, 3)
    with pytest.raises(ConfigError,
                       match=r"^--spec-depths must be comma-separated integers or ranges A\.\.B, got 'x'$"):
        parse_depths("0,x")
    with pytest.raises(ConfigError, match=r"^--spec-depths values must lie in 0..32, got 33$"):
        parse_depths("33")


def test_answer_is_the_fastest_pair_of_the_grid_and_matches_run_policy() -> None:
    wl = fake_workload()
    cfg = SimConfig(router=RouterConfig(groups=8, group_size=4, replicas=4, rho=0.25), steps=4)
    args = argparse.Namespace(spec="mtp", spec_depths="0,2")
    doc = answer(args, wl, CURVE, cfg, "static")
    assert [r["label"] for r in doc["range"]["profiles"]] == ["low", "central", "high"]
    central = doc["range"]["profiles"][1]
    assert central["best_split"]["speedup"] == max(g["speedup"] for g in doc["grid"])
    assert [(g["d_bulk"], g["d_tail"]) for g in doc["grid"]] == [(0, 0), (0, 2), (2, 0), (2, 2)]
    spec = parse_spec("mtp", "x")
    ref = run_policy("uniform", wl, CURVE, cfg).mean_step_s()
    assert doc["reference_s"] == ref
    r = run_policy("static", wl, CURVE, replace(cfg, spec=PoolSpec(tail=spec.with_tokens(2), bulk=spec.with_tokens(0))))
    cell = doc["grid"][1]
    assert cell["mean_step_s"] == r.mean_step_s() and cell["speedup"] == ref / r.mean_step_s()
    u2 = run_policy("uniform", wl, CURVE, replace(cfg, spec=PoolSpec.uniform(spec.with_tokens(2)))).mean_step_s()
    assert doc["uniform"][1] == {"depth": 2, "mean_step_s": u2, "speedup": ref / u2}
    fastest = min(doc["grid"], key=lambda g: g["mean_step_s"])
    best = doc["best"]
    assert (best["d_bulk"], best["d_tail"]) == (fastest["d_bulk"], fastest["d_tail"])
    assert best["vs_best_uniform"] == min(u["mean_step_s"] for u in doc["uniform"]) / best["mean_step_s"]
    assert best["uses_tail_pool"] == (fastest["tail_bound_share"] is not None)
    assert math.isclose(best["speedup"], ref / best["mean_step_s"])


def test_answer_rejects_none() -> None:
    args = argparse.Namespace(spec="none", spec_depths="0,1")
    cfg = SimConfig(router=RouterConfig(groups=8, group_size=4, replicas=4, rho=0.25), steps=2)
    with pytest.raises(ConfigError, match=r"^--spec needs a speculative method or profile, got none$"):
        answer(args, fake_workload(), CURVE, cfg, "static")
