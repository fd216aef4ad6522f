"""`simulate --spec suffix` / `plan --spec suffix` (issue 52): the four arms against run_policy on the same stream,
each arm's best depth, the verdicts across brackets, the CLI's parsing and output."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

import pytest

from conftest import make_curve
from tailsieve.cli import main
from tailsieve.cli.plan_spec import answer
from tailsieve.cli.suffix_view import suffix_brackets
from tailsieve.errors import ConfigError
from tailsieve.model.spec_records import Bracket
from tailsieve.model.speculative import PoolSpec
from tailsieve.policy.router import RouterConfig
from tailsieve.simulation.runs import SimConfig, run_policy
from tailsieve.simulation.suffix_range import (
    SuffixArm,
    SuffixRow,
    arm_sources,
    suffix_compare,
    verdict_lines,
)
from test_sim import fake_workload

CURVE = make_curve()
CFG = SimConfig(router=RouterConfig(groups=8, group_size=4, replicas=4, rho=0.25), steps=4)


def test_suffix_brackets_parsing() -> None:
    assert suffix_brackets("suffix") == tuple(Bracket)
    assert suffix_brackets("Suffix:LOW") == (Bracket.LOW,)
    assert suffix_brackets("suffix:default") is None and suffix_brackets("mtp") is None
    assert suffix_brackets("suffix,acceptance=0.5") is None and suffix_brackets(None) is None
    with pytest.raises(ConfigError, match=r"^--spec suffix takes :low, :central, :high or :default, got 'suffix:4'"):
        suffix_brackets("suffix:4")


def test_arms_match_run_policy_and_take_each_arms_best_depth() -> None:
    wl = fake_workload()
    table = suffix_compare(wl, CURVE, CFG, policy="static", depths=(2, 4), brackets=(Bracket.CENTRAL,))
    ref = run_policy("verl-lif", wl, CURVE, CFG).mean_step_s()
    assert table.reference_s == ref
    row = table.rows[0]
    from tailsieve.model.suffix_model import pool_spec

    src = arm_sources(CFG)
    tail_times = {d: run_policy("static", wl, CURVE, replace(CFG, spec=PoolSpec(tail=pool_spec(src["tail"][0],
                  Bracket.CENTRAL, d)))).mean_step_s() for d in (2, 4)}
    best = min(tail_times, key=lambda d: (tail_times[d], d))
    assert row.tail_only.depth == best and row.tail_only.mean_step_s == tail_times[best]
    assert row.tail_only.speedup == pytest.approx(ref / tail_times[best], rel=1e-12)
    uniform = {(n, d): run_policy(n, wl, CURVE, replace(CFG, spec=PoolSpec.uniform(pool_spec(
        src["verl-lif" if n == "verl-lif" else "uniform"][1], Bracket.CENTRAL, d)))).mean_step_s()
               for n in ("verl-lif", "uniform") for d in (2, 4)}
    assert row.uniform.mean_step_s == min(uniform.values())
    assert row.vs_uniform == pytest.approx(row.uniform.mean_step_s / row.tail_only.mean_step_s)


def test_arm_sources_follow_dispatch() -> None:
    src = arm_sources(CFG)  # G = 4 on R = 4 by request: verl-lif never co-locates siblings, group routing always does
    assert src["verl-lif"][1].sibling_share == 0.0 and src["uniform"][1].sibling_share == 1.0
    assert src["tail"][0].label == "prompt+cut" and src["tail"][1].label == "prompt"
    assert src["everywhere"][1].sibling_share == pytest.approx(0.5)  # 4 members on 3 bulk replicas: 2 share one


def _row(b: Bracket, uni: float, tail: float, every: float) -> SuffixRow:
    return SuffixRow(b, 1.05, SuffixArm("uniform + suffix", 4, 1 / uni, uni, ""),
                     SuffixArm("tail", 4, 1 / tail, tail, ""), SuffixArm("every", 4, 1 / every, every, ""))


def test_verdicts_hold_or_flip_with_the_brackets() -> None:
    rows = [_row(Bracket.LOW, 0.9, 1.2, 1.1), _row(Bracket.CENTRAL, 1.1, 1.6, 1.5), _row(Bracket.HIGH, 1.6, 1.7, 1.9)]
    lines = verdict_lines(rows)
    assert lines[0] == ("flips (low no, central yes, high yes): suffix pays under uniform routing (uniform + suffix "
                        "beats verl-lif without it)")
    assert lines[1].startswith("holds (yes under every bracket): TailSieve with tail-pool suffix beats uniform")
    assert lines[2].startswith("flips (low no, central yes, high yes): TailSieve with tail-pool suffix ≥ 1.5×")
    assert lines[3].startswith("flips (low yes, central yes, high no): TailSieve with tail-pool suffix ≥ 1.1×")
    assert lines[5].startswith("flips (low no, central no, high yes): suffix on the bulk pool too")


def test_plan_and_simulate_spec_suffix_cli(capsys: pytest.CaptureFixture[str]) -> None:
    doc = answer(argparse.Namespace(spec="suffix:low", spec_depths="2"), fake_workload(), CURVE, CFG, "static")
    assert [r["bracket"] for r in doc["suffix"]["brackets"]] == ["low"] and doc["suffix"]["depths"] == [2]
    assert main(["simulate", "--workload", "synthetic-math", "--groups", "8", "--group-size", "4", "--replicas", "4",
                 "--steps", "3", "--spec", "suffix", "--spec-budgets", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["bracket"] for r in out["suffix"]["brackets"]] == ["low", "central", "high"]
    assert len(out["suffix"]["verdicts"]) == 6 and out["suffix"]["reference"] == "verl-lif"
    assert main(["simulate", "--workload", "synthetic-math", "--steps", "3", "--spec", "suffix:7"]) == 1
    assert "--spec suffix takes :low, :central, :high or :default" in capsys.readouterr().err


def test_ideal_tail_decodes_depth_plus_one_tokens_per_iteration() -> None:
    from tailsieve.model.speculative import MAX_TOKENS
    from tailsieve.simulation.suffix_range import IDEAL_TAIL

    tail = IDEAL_TAIL.curve(CURVE)
    for b in (1, 2, 8, 64):
        assert tail.tpot_s(b) == pytest.approx(CURVE.tpot_s(b) / (MAX_TOKENS + 1), rel=1e-12)


def test_tail_ceiling_is_the_best_of_the_controller_and_the_static_grid() -> None:
    from tailsieve.simulation.suffix_range import IDEAL_TAIL, static_grid, tail_ceiling

    wl = fake_workload()
    assert static_grid(CFG) == [(2, 1), (1, 1), (2, 2), (1, 2)]  # E = ⌈0.25·8⌉ = 2, m ≤ R/2 = 2
    ref = run_policy("verl-lif", wl, CURVE, CFG).mean_step_s()
    ideal = replace(CFG, spec=PoolSpec(tail=IDEAL_TAIL))
    brute = {"tailsieve": ref / run_policy("tailsieve", wl, CURVE, ideal).mean_step_s()}
    for q, m in static_grid(CFG):
        brute[f"static q={q} m={m}"] = ref / run_policy("static", wl, CURVE, replace(ideal, q=q, m=m)).mean_step_s()
    ceiling = tail_ceiling(wl, CURVE, CFG)
    best = max(brute, key=lambda k: brute[k])
    assert ceiling.speedup == pytest.approx(brute[best], rel=1e-12) and ceiling.policy == best
    assert tail_ceiling(wl, CURVE, CFG, reference_s=ref) == ceiling
    assert ceiling.speedup >= max(v for k, v in brute.items() if k.startswith("static"))
