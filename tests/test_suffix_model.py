"""The suffix-decoding model (issue 52): brackets from the published points, co-location by dispatch, a pool's mixture
matched exactly, the CPU drafting term, and the four-arm comparison's invariants on a small run."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tailsieve.errors import ConfigError
from tailsieve.model.curve_names import load_curve
from tailsieve.model.spec_records import Bracket
from tailsieve.model.speculative import SpecConfig, SpecMethod, iteration_s
from tailsieve.model.suffix_model import (
    DraftSource,
    PoolSources,
    colocated_share,
    pool_spec,
    source_draft,
    suffix_points,
)


def test_brackets_contain_every_bracket_point_and_are_ordered() -> None:
    for src in DraftSource:
        lo, mid, hi = (source_draft(src, b) for b in (Bracket.LOW, Bracket.CENTRAL, Bracket.HIGH))
        assert lo.expected_tokens(8) <= mid.expected_tokens(8) <= hi.expected_tokens(8)
    for p in suffix_points():
        if p.use != "bracket":
            continue
        src = DraftSource.EPOCHS if p.draft_source is DraftSource.EPOCHS else p.draft_source
        field = {"acceptance": "acceptance", "accept_share": "acceptance", "draft_share": "draft_share"}[p.metric]
        lo, hi = (getattr(source_draft(src, b), field) for b in (Bracket.LOW, Bracket.HIGH))
        assert lo - p.tolerance <= p.value <= hi + p.tolerance, p.id
    assert source_draft(DraftSource.CUT, Bracket.CENTRAL).acceptance == pytest.approx(0.6)  # median of 0.5, 0.7


@pytest.mark.parametrize(("g", "r", "by_request", "share"), [
    (8, 8, True, 0.0), (8, 7, True, 0.25), (8, 4, True, 1.0), (8, 3, True, 1.0), (8, 5, True, 0.75),
    (8, 8, False, 1.0), (8, 1, True, 1.0), (1, 1, True, 0.0)])
def test_colocated_share_against_brute_force(g: int, r: int, by_request: bool, share: float) -> None:
    assert colocated_share(g, r, by_request) == pytest.approx(share)
    if by_request and g > 1:
        rep = [(7 + j) % r for j in range(g)]  # round-robin from any offset
        brute = sum(rep.count(x) >= 2 for x in rep) / g
        assert brute == pytest.approx(share)


def test_pool_mixture_matches_expected_and_verified_tokens_exactly() -> None:
    pool = PoolSources.of([DraftSource.SIBLINGS], 0.25)
    for b in Bracket:
        for d in (1, 4, 8):
            s = pool_spec(pool, b, d)
            sib, prm = source_draft(DraftSource.SIBLINGS, b), source_draft(DraftSource.PROMPT, b)
            best = max(sib, prm, key=lambda x: x.expected_tokens(d))
            want = 0.25 * best.expected_tokens(d) + 0.75 * prm.expected_tokens(d)
            assert s.expected_tokens() == pytest.approx(want, rel=1e-9)
            assert s.share == pytest.approx(0.25 * best.draft_share + 0.75 * prm.draft_share)
    assert pool_spec(pool, Bracket.CENTRAL, 0).enabled is False
    with pytest.raises(ConfigError, match="suffix depth"):
        pool_spec(pool, Bracket.CENTRAL, 99)


def test_cut_work_beats_prompt_only_and_cpu_term_is_b_times_t() -> None:
    curve = load_curve("h100-llama3-8b")
    cut, fresh = (pool_spec(PoolSources.of(s), Bracket.CENTRAL, 4) for s in ([DraftSource.CUT], []))
    assert cut.expected_tokens() > fresh.expected_tokens()
    assert curve.tpot_s(1) / cut.curve(curve).tpot_s(1) > 1.5  # low concurrency: the cut work pays
    tau, b = curve.table(64 * 5), np.arange(1, 65)
    base = SpecConfig(SpecMethod.SUFFIX, 4, acceptance=0.6, draft_cost=0.05)
    with_cpu = SpecConfig(SpecMethod.SUFFIX, 4, acceptance=0.6, draft_cost=0.05, draft_cpu_s=5e-5)
    assert np.allclose(iteration_s(tau, b, with_cpu) - iteration_s(tau, b, base), 5e-5 * b, rtol=0, atol=1e-15)
    with pytest.raises(ConfigError, match="draft_cpu_s"):
        SpecConfig(SpecMethod.SUFFIX, 4, draft_cpu_s=-1.0)
    assert math.isfinite(cut.to_json()["draft_cpu_s"])
