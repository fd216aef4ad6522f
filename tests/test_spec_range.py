"""The published range in use (issue 43): `NAME[:BRACKET][:TOKENS]` parsing, a user's own fit first, the exact small
solvers behind the profiles, the verdict conclusions, `curves --spec`, and `simulate --spec`'s range on one stream."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tailsieve.cli import main
from tailsieve.cli.curves_spec import lines
from tailsieve.errors import ConfigError
from tailsieve.model.curve_names import load_curve
from tailsieve.model.spec_calibration import PROFILE_METHODS, profile
from tailsieve.model.spec_fit import context_for
from tailsieve.model.spec_keys import SpecContext
from tailsieve.model.spec_parse import parse_spec, spec_range
from tailsieve.model.spec_records import Bracket, Family, Metric, family_of, measurements
from tailsieve.model.spec_solve import box_lp, box_lstsq
from tailsieve.model.speculative import SpecConfig, SpecMethod
from tailsieve.simulation.spec_range import Arm, RangeRow, conclusions, verdict_lines

NAMES = [(m, f, b) for m in PROFILE_METHODS for f in Family for b in Bracket]
SMALL = ["--groups", "8", "--group-size", "4", "--replicas", "4", "--steps", "4"]


@pytest.mark.parametrize(("method", "family", "bracket"), NAMES)
def test_every_name_form_resolves_to_its_profile(method: SpecMethod, family: Family, bracket: Bracket) -> None:
    want = profile(method, family, bracket).spec
    ctx = SpecContext(family)
    full = f"{method.value}-{family.value}:{bracket.value}"
    assert parse_spec(full, "x") == want
    assert parse_spec(f"{method.value}:{bracket.value}", "x", ctx) == want  # the family from the curve
    assert parse_spec(f"{full}:2", "x") == want.with_tokens(2)
    assert parse_spec(f"{method.value}-{family.value}:{bracket.value}:7,acceptance=0.5", "x") == replace(
        want, tokens=7, acceptance=0.5)
    if bracket is Bracket.CENTRAL:
        assert parse_spec(method.value, "x", ctx) == want == parse_spec(f"{method.value}-{family.value}", "x")


def test_default_is_the_plain_method_and_other_methods_keep_their_defaults() -> None:
    assert parse_spec("mtp:default", "x") == SpecConfig(SpecMethod.MTP)
    assert parse_spec("dflash:default:4", "x") == SpecConfig(SpecMethod.DFLASH, 4)
    assert parse_spec("eagle3", "x") == SpecConfig(SpecMethod.EAGLE3)
    assert parse_spec("ngram:default:2", "x") == SpecConfig(SpecMethod.NGRAM, 2)


@pytest.mark.parametrize(("text", "message"), [
    ("eagle3:low", "--tail-spec: no published range for 'eagle3' (calibrated: mtp, dflash, -dense, -moe)"),
    ("mtp-gpu:high", "--tail-spec: no published range for 'mtp-gpu' (calibrated: mtp, dflash, -dense, -moe)"),
    ("mtp:low:high", "--tail-spec: expected NAME[:BRACKET][:TOKENS], got 'mtp:low:high'"),
    ("mtp:2:3", "--tail-spec: expected NAME[:BRACKET][:TOKENS], got 'mtp:2:3'"),
    ("mtp:lo", "--tail-spec: tokens must be an integer, got 'lo' in 'mtp:lo'"),
    ("mtp:high:99", "--tail-spec: speculative tokens must be an integer in 0..32, got 99"),
])
def test_bad_names_are_one_line_errors(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as exc:
        parse_spec(text, "--tail-spec")
    assert str(exc.value) == message


def test_a_users_fit_takes_the_central_place_and_the_range_stays_beside_it(tmp_path: Path) -> None:
    fit = SpecConfig(SpecMethod.MTP, 2, acceptance=0.7, decay=1.0, draft_cost=0.1, verify_cost=0.0, token_cost=0.2)
    curve = load_curve("h100-llama3-8b")
    path = tmp_path / "model.json"
    block = {k: v for k, v in fit.to_json().items() if k not in ("drafter", "expected_tokens")}
    path.write_text(json.dumps({"batch": list(curve.batch), "tpot_ms": list(curve.tpot_ms),
                                "speculative": {"concurrency_fit": block}}), encoding="utf-8")
    ctx = context_for(str(path), curve)
    assert ctx.fitted is not None and ctx.family is Family.DENSE
    assert parse_spec("mtp", "x", ctx) == ctx.fitted  # bare name: the user's numbers first
    assert parse_spec("mtp:central", "x", ctx) == ctx.fitted
    assert parse_spec("mtp-dense", "x", ctx) == profile(SpecMethod.MTP, Family.DENSE, Bracket.CENTRAL).spec
    assert parse_spec("mtp:low", "x", ctx) == profile(SpecMethod.MTP, Family.DENSE, Bracket.LOW).spec
    assert parse_spec("dflash", "x", ctx) == profile(SpecMethod.DFLASH, Family.DENSE, Bracket.CENTRAL).spec
    assert [label for label, _ in spec_range("mtp", ctx)] == ["your fit", "low", "central", "high"]
    assert [label for label, _ in spec_range("mtp", SpecContext())] == ["low", "central", "high"]
    assert spec_range("mtp,acceptance=0.5") == spec_range("eagle3") == spec_range("mtp:default") == ()
    assert context_for("h100-llama3-8b", curve) == SpecContext()


def test_family_follows_the_curve() -> None:
    assert family_of(load_curve("a100x4-mixtral-8x7b")) is Family.MOE
    assert family_of(load_curve("h100x4-mixtral-8x7b")) is Family.MOE
    assert family_of(load_curve("h100-llama3-8b")) is Family.DENSE
    moe = SpecContext(Family.MOE)
    assert parse_spec("dflash", "x", moe) == profile(SpecMethod.DFLASH, Family.MOE, Bracket.CENTRAL).spec


@pytest.mark.parametrize("seed", range(12))
def test_box_solvers_beat_every_sampled_feasible_point(seed: int) -> None:
    """Vertex and active-set enumeration against 4000 random points of the box: none is better."""
    rng = np.random.default_rng(seed)
    lo, hi = np.zeros(3), np.asarray([1.0, 2.0, 3.0])
    a, r = rng.normal(size=(5, 3)), rng.normal(size=5)
    x = box_lstsq(a, r, lo, hi)
    assert np.all(x >= lo) and np.all(x <= hi)
    samples = rng.uniform(lo, hi, size=(4000, 3))
    assert np.sum((a @ x - r) ** 2) <= np.min(np.sum((samples @ a.T - r) ** 2, axis=1)) + 1e-12
    g, h, c = rng.normal(size=(4, 3)), rng.normal(size=4) - 1.0, rng.normal(size=3)
    y = box_lp(c, g, h, lo, hi)
    feasible = samples[np.all(samples @ g.T >= h, axis=1)]
    if y is None:
        assert feasible.size == 0
    else:
        assert np.all(g @ y >= h - 1e-9) and (feasible.size == 0 or c @ y <= np.min(feasible @ c) + 1e-12)


def test_lp_reports_infeasible() -> None:
    assert box_lp(np.ones(3), np.asarray([[1.0, 1.0, 1.0]]), np.asarray([10.0]), np.zeros(3), np.ones(3)) is None


def _row(label: str, *, uni: tuple[str, float], dd: tuple[str, float], tail: float, split: float,
         placed: bool = True) -> RangeRow:
    return RangeRow(label, 1.1, Arm(*uni), Arm(*dd), Arm("0/3", tail), Arm("2/4", split), placed)


@pytest.mark.parametrize(("flags", "kind"), list(itertools.product(
    itertools.product((False, True), repeat=3), ("uniform", "split"))))
def test_conclusions_hold_only_when_every_profile_agrees(flags: tuple[bool, ...], kind: str) -> None:
    rows = []
    for i, f in enumerate(flags):
        if kind == "uniform":  # conclusion 0: uniform's best depth > 0
            rows.append(_row(f"p{i}", uni=("2" if f else "0", 1.2), dd=("1", 1.3), tail=1.0, split=1.3))
        else:  # conclusion 4: the split beats d/d by > 1% with a tail pool
            rows.append(_row(f"p{i}", uni=("1", 1.2), dd=("1", 1.3), tail=1.0, split=1.4 if f else 1.3))
    c = conclusions(rows)[0 if kind == "uniform" else 4]
    assert c.values == flags and c.holds == (len(set(flags)) == 1)
    line = verdict_lines(rows)[0 if kind == "uniform" else 4]
    assert line.startswith("holds" if c.holds else "flips")
    if not c.holds:
        assert all(f"p{i} {'yes' if f else 'no'}" in line for i, f in enumerate(flags))


def test_a_split_without_a_tail_pool_is_no_route_credit() -> None:
    row = _row("x", uni=("1", 1.2), dd=("1", 1.3), tail=1.0, split=1.5, placed=False)
    assert conclusions([row])[4].values == (False,)


def test_curves_spec_shows_every_profile_beside_every_speedup_point(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["curves", "--spec"]) == 0
    out = capsys.readouterr().out
    assert max(len(x) for x in out.splitlines()) <= 120
    assert out.splitlines()[:-2] == lines()[1:]
    for name in ("mtp-dense:low", "mtp-dense ", "dflash-moe:high"):
        assert name in out
    for m in measurements():
        if m.metric is Metric.SPEEDUP:
            assert f"  {m.id} [" in out
    assert main(["curves", "--spec", "--json"]) == 0
    doc: dict[str, Any] = json.loads(capsys.readouterr().out)
    assert len(doc["profiles"]) == 12 and {p["name"] for p in doc["profiles"]} >= {"mtp-moe", "dflash-dense:low"}


def test_simulate_spec_prints_the_range_and_shares_the_unspeculated_runs(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", *SMALL, "--spec", "mtp", "--spec-budgets", "0,1", "--policy", "static", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    labels = [p["label"] for p in doc["range"]["profiles"]]
    assert labels == ["low", "central", "high"]
    assert len({p["tailsieve_no_spec"] for p in doc["range"]["profiles"]}) == 1  # the shared budget-0 row
    central = doc["range"]["profiles"][1]
    assert central["uniform"]["speedup"] == max(b["uniform_speedup"] for b in doc["budgets"])
    assert len(doc["range"]["conclusions"]) == 5 and len(doc["range"]["verdicts"]) == 5
    # the low run alone gives the same numbers as inside the range
    assert main(["simulate", *SMALL, "--spec", "mtp:low", "--spec-budgets", "0,1", "--policy", "static",
                 "--json"]) == 0
    low = json.loads(capsys.readouterr().out)
    assert low["range"]["profiles"][0] == doc["range"]["profiles"][0]
    assert main(["simulate", *SMALL, "--spec", "eagle3", "--spec-budgets", "0,1", "--policy", "static"]) == 0
    assert "Across the published range" not in capsys.readouterr().out
