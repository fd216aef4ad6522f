"""Built-in speculation profiles (model/spec_calibration.py): the low, central and high profiles against every
published point (containment, precision, optimality; one generated case per point, bracket or cell), the read
numbers, and the concurrency terms of the cost model written out by hand."""

from __future__ import annotations

import math
import statistics
from dataclasses import replace

import numpy as np
import pytest

from tailsieve.errors import ConfigError
from tailsieve.model.curve_names import load_curve
from tailsieve.model.spec_calibration import (
    CENTRAL_PRECISION,
    PROFILE_METHODS,
    CalibrationRow,
    alpha_for,
    calibration_rows,
    crossing,
    point_alpha,
    point_depth,
    profile,
    speedup,
)
from tailsieve.model.spec_records import Bracket, Family, Use, measurements
from tailsieve.model.speculative import EXACT_BATCH, SpecConfig, SpecMethod

H100, MOE = load_curve("h100-llama3-8b"), load_curve("a100x4-mixtral-8x7b")
ROWS = calibration_rows()
BRACKETED = [r for r in ROWS if r.point.bracketed]
CENTRAL = [r for r in ROWS if r.point.use is Use.CENTRAL]
CELLS = [(m, f) for m in PROFILE_METHODS for f in Family]


@pytest.mark.parametrize("row", BRACKETED, ids=lambda r: r.point.id)
def test_brackets_contain_every_published_speedup_at_its_concurrency(row: CalibrationRow) -> None:
    p, tol = row.point, row.point.tolerance + 1e-9
    assert row.low is not None and row.high is not None and row.central is not None
    assert row.low <= p.value + tol and row.high >= p.value - tol, (p.id, row.low, p.value, row.high)
    assert row.contained


@pytest.mark.parametrize("row", CENTRAL, ids=lambda r: r.point.id)
def test_central_reproduces_its_fit_points_within_its_stated_precision(row: CalibrationRow) -> None:
    assert row.central is not None
    assert abs(row.central / row.point.value - 1.0) <= CENTRAL_PRECISION, (row.point.id, row.central)


@pytest.mark.parametrize(("method", "family", "bracket"),
                         [(m, f, b) for m, f in CELLS for b in (Bracket.LOW, Bracket.HIGH)])
def test_each_bracket_touches_a_point_that_binds_it(method: SpecMethod, family: Family, bracket: Bracket) -> None:
    """A bracket is fitted to the record, not drawn loosely around it: at least one point lies on it."""
    rows = [r for r in BRACKETED if (r.point.method, r.point.family) == (method, family)]
    ends = [r.low if bracket is Bracket.LOW else r.high for r in rows]
    gaps = [abs(e - r.point.value) for e, r in zip(ends, rows, strict=True) if e is not None]
    assert min(gaps) <= max(r.point.tolerance for r in rows) + 1e-6


@pytest.mark.parametrize(("method", "family"), CELLS)
def test_central_is_the_least_squares_optimum_of_its_points(method: SpecMethod, family: Family) -> None:
    prof = profile(method, family, Bracket.CENTRAL)
    pts = [r.point for r in CENTRAL if (r.point.method, r.point.family) == (method, family)]

    def loss(spec: SpecConfig) -> float:
        """The fitted objective: squared relative error of the iteration cost ā/S (= S_published/S_model − 1)."""
        return sum((m.value / speedup(spec.with_tokens(point_depth(m)), prof.curve, m.concurrency or 1) - 1) ** 2
                   for m in pts)

    best = loss(prof.spec)
    for key, hi in (("verify_cost", 1.0), ("token_cost", 100.0), ("token_cost_slope", 100.0)):
        for step in (-1e-3, 1e-3):
            v = getattr(prof.spec, key) + step
            if 0.0 <= v <= hi:
                assert loss(replace(prof.spec, **{key: v})) >= best - 1e-12, (key, step)


@pytest.mark.parametrize(("method", "family"), CELLS)
def test_acceptance_brackets_are_the_records_minimum_median_and_maximum(method: SpecMethod, family: Family) -> None:
    alphas = sorted(point_alpha(m) for m in measurements() if m.method is method and m.use is Use.ACCEPTANCE)
    got = [profile(method, family, b).spec.alpha for b in Bracket]
    assert got == [alphas[0], statistics.median(alphas), alphas[-1]]
    assert all(profile(method, family, b).spec.acceptance_slope == 0.0 for b in Bracket)


def test_published_values_are_the_read_numbers() -> None:
    m = {x.id: x for x in measurements()}
    for pid, num, den in (("zlab4b-mtp-c1", 458, 274), ("zlab4b-mtp-c32", 6873, 5836), ("zlab4b-dflash-c1", 959, 274),
                          ("zlab4b-dflash-c16", 8563, 3663), ("zlab35b-mtp-c8", 2165, 1283),
                          ("zlab35b-dflash-c1", 681, 246), ("skyrl-rollout", 310.1, 152.4), ("ornith9b", 207.5, 44.8),
                          ("ornith35b", 470.2, 202.5), ("runtimewire-dflash", 874.6, 202.9),
                          ("gpustack-rate1", 1.85, 1.50), ("sglang29244-moe", 93, 146),
                          ("sglang19952-c32", 2115.39, 1860.84)):
        assert m[pid].value == pytest.approx(num / den, abs=1e-4), pid
    for x in m.values():
        assert x.source and x.hardware and x.engine and x.model and x.task and x.note, x.id
        assert x.tolerance > 0 and (x.concurrency is not None or not x.bracketed)


def test_the_issue_43_mismatch_is_gone() -> None:
    """Before: the MoE DFlash profile lost at every concurrency and MTP lost from b = 8 on, so Table 2's MoE result
    could not happen. The central profiles now win at low concurrency on their reference curves."""
    assert speedup(profile(SpecMethod.DFLASH, Family.MOE, Bracket.CENTRAL).spec, MOE, 1) > 2.5
    assert speedup(profile(SpecMethod.MTP, Family.DENSE, Bracket.CENTRAL).spec, H100, 8) > 1.4
    assert speedup(profile(SpecMethod.MTP, Family.MOE, Bracket.CENTRAL).spec, MOE, 8) > 1.6
    low = profile(SpecMethod.MTP, Family.DENSE, Bracket.LOW).spec  # the old pessimistic end stays as the low bracket
    assert speedup(low, H100, 8) == pytest.approx(0.92, abs=1e-9) and speedup(low, H100, 64) == pytest.approx(0.68)


def test_mtp_low_speedup_is_the_closed_form_at_every_batch() -> None:
    """v = 0: S(b) = ā / (1 + d·c + d·(u0 + u1·log2 b)), independent of the curve, up to EXACT_BATCH."""
    spec = profile(SpecMethod.MTP, Family.DENSE, Bracket.LOW).spec
    assert spec.verify == 0.0
    b = np.arange(1, EXACT_BATCH + 1)
    want = spec.expected_tokens() / (1 + 3 * 0.1 + 3 * (spec.token_cost + spec.token_cost_slope * np.log2(b)))
    got = H100.table(EXACT_BATCH)[1:] / spec.curve(H100).table(EXACT_BATCH)[1:]
    np.testing.assert_allclose(got, want, rtol=1e-11)
    cross = crossing(spec, H100)
    assert cross is not None and 4.0 < cross < 5.0


def test_alpha_for_inverts_the_expected_tokens() -> None:
    for target, d in ((2.095, 3), (2.8, 15), (2.0, 15), (1.0, 4), (5.0, 4)):
        a = alpha_for(target, d)
        assert 1 + sum(a**k for k in range(1, d + 1)) == pytest.approx(target, abs=1e-12)
    with pytest.raises(ConfigError, match=r"^expected tokens 6 outside 1..5 for depth 4$"):
        alpha_for(6.0, 4)


def test_acceptance_slope_makes_expected_tokens_depend_on_b() -> None:
    spec = SpecConfig(SpecMethod.MTP, tokens=4, acceptance=0.8, decay=0.9, acceptance_slope=-0.05)
    for b in (1, 2, 8, 100, 1 << 20):
        a = min(max(0.8 - 0.05 * math.log2(b), 0.0), 1.0)
        want = 1 + sum(math.prod(a * 0.9**j for j in range(k)) for k in range(1, 5))
        assert spec.expected_tokens(b) == pytest.approx(want, abs=1e-12)
    tau = H100.table(64 * 5)
    tspec = spec.curve(H100).table(64)
    for b in (1, 3, 17, 64):  # τ_spec(b)·ā(b) is the iteration cost at that b
        it = tau[5 * b] + 0.1 * 4 * tau[b]
        assert tspec[b] * spec.expected_tokens(b) == pytest.approx(it, rel=1e-11)


def test_token_cost_terms_enter_the_iteration_cost() -> None:
    spec = SpecConfig(SpecMethod.DFLASH, tokens=3, acceptance=0.7, decay=1.0, draft_cost=0.2, verify_cost=0.5,
                      draft_share=0.5, token_cost=0.03, token_cost_slope=0.02)
    tau = MOE.table(EXACT_BATCH * 4)
    tspec = spec.curve(MOE).table(EXACT_BATCH)
    for b in (1, 2, 7, 40, 333, EXACT_BATCH):
        x = b * 2.5
        tau_x = float(np.interp(x, np.arange(tau.size), tau))
        verify = tau[b] + 0.5 * (tau_x - tau[b]) + 0.5 * 3 * (0.03 + 0.02 * math.log2(b)) * tau[b]
        assert tspec[b] * spec.expected_tokens(b) == pytest.approx(verify * 1.2, rel=1e-11)


@pytest.mark.parametrize(("kw", "message"), [
    ({"token_cost": -0.1}, "speculative token_cost must be in [0, 100], got -0.1"),
    ({"token_cost_slope": math.nan}, "speculative token_cost_slope must be in [0, 100], got nan"),
    ({"acceptance_slope": 1.5}, "speculative acceptance_slope must be in [-1, 1], got 1.5"),
    ({"acceptance_slope": True}, "speculative acceptance_slope must be in [-1, 1], got True"),
])
def test_concurrency_terms_are_validated(kw: dict[str, float], message: str) -> None:
    with pytest.raises(ConfigError) as exc:
        SpecConfig(SpecMethod.MTP, **kw)  # type: ignore[arg-type]
    assert str(exc.value) == message
