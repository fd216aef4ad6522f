"""`bench/bench_suffix_range.py --shapes` (issue 52): a sweep row is the single-shape bench's figures at that shape, its
length ratios are the brute-force means over the consumed responses, the honest ceiling is the best option at length
ratio >= 0.95, and bad shapes are one-line errors."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from bench_suffix_range import run, setup
from suffix_shapes import DEFAULT_SHAPES, LENGTH_FLOOR, Shape, parse_shapes, shape_row, sweep_main, verdict
from tailsieve.errors import ConfigError
from tailsieve.loop import SKIP_STEPS
from tailsieve.model.spec_records import Bracket
from tailsieve.model.speculative import PoolSpec
from tailsieve.model.suffix_model import pool_spec
from tailsieve.simulation.runs import run_policy
from tailsieve.simulation.suffix_range import IDEAL_TAIL, arm_sources, static_grid

SHAPE, STEPS, WORKLOAD = Shape(4, 16, 4, 0.25), 5, "synthetic-math"


def _mean_length(batches: list[np.ndarray]) -> float:
    lengths = [int(x) for b in batches[SKIP_STEPS:] for x in np.ravel(b)]
    return sum(lengths) / len(lengths)


@pytest.fixture(scope="module")
def row() -> dict:  # type: ignore[type-arg]
    return shape_row(WORKLOAD, STEPS, SHAPE)


def test_parse_shapes() -> None:
    assert parse_shapes("default") == DEFAULT_SHAPES and len(DEFAULT_SHAPES) == 8
    assert {(s.replicas, s.groups, s.group_size) for s in DEFAULT_SHAPES} == {(r, 8 * r, 8) for r in (4, 8, 16, 32)}
    assert parse_shapes("4:16:4:0.25, 8:64:8:0.1") == (SHAPE, Shape(8, 64, 8, 0.1))
    assert SHAPE.flags == ["--replicas", "4", "--groups", "16", "--group-size", "4", "--rho", "0.25"]
    for bad in ("4:16:4", "4:16:4:x", "4:16:4:0.1:9"):
        with pytest.raises(ConfigError, match=r"^--shapes takes 'default' or R:N:G:RHO\[,\.\.\.\], got"):
            parse_shapes(bad)


def test_sweep_row_is_the_single_shape_bench_at_that_shape(row: dict) -> None:  # type: ignore[type-arg]
    single = run(WORKLOAD, STEPS, SHAPE.flags)
    assert row["ceiling"]["speedup"] == single["ceiling"]["speedup"]
    assert row["ceiling"]["policy"] == single["ceiling"]["policy"]
    by_bracket = {b["bracket"]: b for b in single["brackets"]}
    for name in ("low", "central"):
        mine, theirs = row["brackets"][name], by_bracket[name]
        assert mine["speedup"] == theirs["tail_only"]["speedup"] and mine["depth"] == theirs["tail_only"]["depth"]
        assert mine["vs_uniform_suffix"] == theirs["tail_only_vs_uniform_suffix"]
        assert row["tailsieve_no_spec"] == theirs["tailsieve_no_spec"]
    assert row["verl_lif_step_s"] == single["reference_s"]


def test_length_ratios_are_brute_force_means_and_the_honest_ceiling_respects_the_floor(row: dict) -> None:  # type: ignore[type-arg]
    inputs, curve, config = setup(WORKLOAD, STEPS, SHAPE.flags)
    ref = run_policy("verl-lif", inputs, curve, config)
    ideal = replace(config, spec=PoolSpec(tail=IDEAL_TAIL))
    options = {"tailsieve": run_policy("tailsieve", inputs, curve, ideal)}
    for q, m in static_grid(config):
        options[f"static q={q} m={m}"] = run_policy("static", inputs, curve, replace(ideal, q=q, m=m))
    ref_len, ref_s = _mean_length(ref.batch_lengths), ref.mean_step_s()
    ratio = {k: _mean_length(r.batch_lengths) / ref_len for k, r in options.items()}
    speed = {k: ref_s / r.mean_step_s() for k, r in options.items()}
    assert min(ratio.values()) < 1.0  # the routing shortens responses somewhere: the ratios are not all trivially 1
    c = row["ceiling"]
    assert c["length_ratio"] == pytest.approx(ratio[c["policy"]], rel=1e-12)
    assert c["speedup"] == pytest.approx(max(speed.values()), rel=1e-12)
    honest = {k: v for k, v in speed.items() if ratio[k] >= LENGTH_FLOOR}
    h = row["honest_ceiling"]
    if honest:
        assert h["speedup"] == pytest.approx(max(honest.values()), rel=1e-12) and ratio[h["policy"]] >= LENGTH_FLOOR
    else:
        assert h is None
    for bracket in (Bracket.LOW, Bracket.CENTRAL):
        arm = row["brackets"][bracket.value]
        spec = pool_spec(arm_sources(config)["tail"][0], bracket, arm["depth"])
        tail = run_policy("tailsieve", inputs, curve, replace(config, spec=PoolSpec(tail=spec)))
        assert arm["length_ratio"] == pytest.approx(_mean_length(tail.batch_lengths) / ref_len, rel=1e-12)
        assert arm["speedup"] == pytest.approx(ref_s / tail.mean_step_s(), rel=1e-12)


def test_verdict_marks_a_length_biased_pass() -> None:
    fast_short = {"speedup": 1.6, "length_ratio": 0.9}
    assert verdict(fast_short, {"speedup": 1.51, "length_ratio": 0.97}) == "honest pass"
    assert verdict(fast_short, {"speedup": 1.2, "length_ratio": 0.99}) == "length-biased pass"
    assert verdict(fast_short, None) == "length-biased pass"
    assert verdict({"speedup": 1.4, "length_ratio": 1.0}, None) == "missed"


def test_sweep_main_rejects_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    assert sweep_main("4:16", "math", 3, None) == 2
    assert capsys.readouterr().err == "error: --shapes takes 'default' or R:N:G:RHO[,...], got '4:16'\n"
    assert sweep_main("default", "math,chess", 3, None) == 2
    assert capsys.readouterr().err == "error: --workloads takes math, video, agents, got chess\n"
    assert sweep_main("4:32:8:0.1,0:32:8:0.1", "math", 3, None) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "replicas" in err and err.count("\n") == 1
