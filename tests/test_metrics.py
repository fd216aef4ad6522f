"""Metrics: exact KS against brute force, App. E length bias, wasted-token share, §2.3 capture rates."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray

from conftest import make_curve
from tailsieve.analysis.metrics import ks_distance, length_bias, summarize, wasted_share
from tailsieve.errors import ConfigError
from tailsieve.loop import PolicyRun, StepRecord
from tailsieve.policy.router import RouterConfig
from tailsieve.simulation.capture import capture_rates
from tailsieve.simulation.runs import SimConfig, run_policies
from tailsieve.workloads import ReplayMode, Workload
from test_sim import fake_workload

CURVE = make_curve()


def brute_ks(a: list[int], b: list[int]) -> float:
    """sup_x |F_a(x) − F_b(x)| over every sample point and midpoint (plain Python)."""
    pts = sorted(set(a) | set(b))
    xs = pts + [(u + v) / 2 for u, v in pairwise(pts)] + [pts[0] - 1, pts[-1] + 1]
    return max(abs(sum(v <= x for v in a) / len(a) - sum(v <= x for v in b) / len(b)) for x in xs)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 30), min_size=1, max_size=40), st.lists(st.integers(0, 30), min_size=1, max_size=40))
def test_ks_matches_brute_force(a: list[int], b: list[int]) -> None:
    assert ks_distance(a, b) == pytest.approx(brute_ks(a, b), abs=1e-12)
    assert ks_distance(a, b) == pytest.approx(ks_distance(b, a))


def test_ks_edge_cases() -> None:
    assert ks_distance([1, 2, 3], [3, 2, 1]) == 0.0
    assert ks_distance([1, 1], [2, 2]) == 1.0
    with pytest.raises(ValueError):
        ks_distance([], [1])


def run_of(name: str, batches: list[list[list[int]]], wasted: list[int]) -> PolicyRun:
    arrs = tuple(np.array(b, dtype=np.int64) for b in batches)
    steps = tuple(StepRecord(step=i, makespan_s=1.0 + i, tail_s=0.0, bulk_s=1.0 + i, q=0, m=0, candidates=0,
                             wasted_tokens=w, batch_mean_length=float(a.mean()))
                  for i, (a, w) in enumerate(zip(arrs, wasted, strict=True)))
    return PolicyRun(name, steps, arrs, ())


def test_length_bias_and_wasted_share_by_hand() -> None:
    uni = run_of("uniform", [[[9, 9]], [[1, 2]], [[3, 4]], [[5, 6]]], [0, 0, 0, 0])
    pol = run_of("x", [[[1, 1]], [[1, 1]], [[6, 8]], [[10, 12]]], [100, 50, 4, 0])
    bias = length_bias(pol, uni)  # window: steps 2 and 3
    assert bias.mean_ratio == pytest.approx((6 + 8 + 10 + 12) / (3 + 4 + 5 + 6))
    assert bias.ks == pytest.approx(brute_ks([6, 8, 10, 12], [3, 4, 5, 6]))
    assert (bias.responses, bias.reference_responses) == (4, 4)
    assert wasted_share(pol) == pytest.approx(4 / (4 + 36))
    assert wasted_share(pol, skip=0) == pytest.approx(154 / (154 + 40))
    assert length_bias(uni, uni).mean_ratio == 1.0 and length_bias(uni, uni).ks == 0.0
    short = run_of("s", [[[2, 2]]], [3])  # fewer steps than the window: everything counts
    assert wasted_share(short) == pytest.approx(3 / 7)


def test_summaries_against_uniform_on_the_same_stream() -> None:
    runs = run_policies(["uniform-oracle", "static"], fake_workload(), CURVE,
                        SimConfig(router=RouterConfig(groups=16, group_size=4, replicas=4, rho=0.25), steps=6, q=2,
                                  m=1))
    s = summarize(runs)
    ub, ob = s["uniform"].bias, s["uniform-oracle"].bias
    assert ub is not None and ob is not None
    assert s["uniform"].speedup == 1.0 and ub.ks == 0.0 and s["uniform"].wasted_share == 0.0
    assert ob.mean_ratio == 1.0  # oracles consume uniform's batches
    assert s["static"].speedup == pytest.approx(runs["uniform"].mean_step_s() / runs["static"].mean_step_s())
    assert (s["static"].final_q, s["static"].final_m) == (2, 1) and s["static"].wasted_share > 0
    alone = summarize({"static": runs["static"]})["static"]  # no uniform run: nothing to compare against
    assert alone.speedup is None and alone.bias is None and alone.mean_step_s == s["static"].mean_step_s


@dataclass(frozen=True, slots=True)
class Flip:
    """Prompt i has length base[i] on even generations and base[P−1−i] on odd ones (ranking reversed)."""

    n: int
    flip: bool

    def lengths(self, prompt_id: str, generation: int, step: int, group_size: int) -> NDArray[np.int64]:
        i = int(prompt_id[1:])
        j = self.n - 1 - i if self.flip and generation % 2 else i
        return np.full(group_size, 100 + 37 * j, dtype=np.int64)


def flip_workload(n: int, flip: bool) -> Workload:
    return Workload("flip", tuple(f"p{i}" for i in range(n)), None, ReplayMode.RESAMPLE, 0, Flip(n, flip))


def test_capture_rates_by_construction() -> None:
    rc = RouterConfig(groups=16, group_size=2, replicas=1)  # one replica: groups finish in order of length
    stable = capture_rates(flip_workload(20, False), CURVE, rc, rhos=(0.25,), steps=4, tail_fraction=0.2)
    (c,) = stable
    assert (c.rho, c.candidates, c.tail_groups, c.steps) == (0.25, 4, 4, 4)
    assert c.next_generation == c.same_generation == c.longest_group == 1.0
    flipped = capture_rates(flip_workload(20, True), CURVE, rc, rhos=(0.25,), steps=4, tail_fraction=0.2)
    assert flipped[0].same_generation == 1.0  # the cut generation's tail is always unfinished
    assert flipped[0].next_generation == 0.0 and flipped[0].longest_group == 0.0  # the next one is reversed


def test_capture_recall_is_bounded_by_candidates_and_defaults() -> None:
    rc = RouterConfig(groups=32, group_size=4, replicas=4)
    rates = capture_rates(fake_workload(80), CURVE, rc, steps=3)
    assert [r.rho for r in rates] == [0.05, 0.10, 0.25]
    assert [r.candidates for r in rates] == [2, 4, 8]
    for r in rates:
        assert 0.0 <= r.next_generation <= 1.0 and 0.0 <= r.same_generation <= 1.0
        assert r.tail_groups <= r.candidates
    small_e = capture_rates(fake_workload(80), CURVE, rc, rhos=(0.05,), steps=3, tail_fraction=0.5)[0]
    assert small_e.same_generation <= small_e.candidates / small_e.tail_groups
    with pytest.raises(ConfigError):
        capture_rates(fake_workload(), CURVE, rc, steps=0)
    with pytest.raises(ConfigError):
        capture_rates(fake_workload(), CURVE, rc, tail_fraction=0.0)
