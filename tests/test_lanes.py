"""The all-admit lane model (`policy/lanes.py`, §2.1) against an iteration-by-iteration brute force, and the
round-robin placement and prefill counts against hand-worked cases."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import make_curve
from tailsieve.policy.lanes import group_completions, lane_finish_times, lane_prefill, round_robin_lanes

CURVE = make_curve()


def _brute(lengths: list[int], lanes: list[int], kv: float = 0.0) -> list[float]:
    """Every iteration t of every lane costs τ(b) + kv·b·(t − 1), b = its requests with length ≥ t; a request
    finishes at the end of iteration L (§2.1, all admitted at t = 0)."""
    tau = CURVE.table(len(lengths) + 1)
    out = [0.0] * len(lengths)
    for lane in set(lanes):
        mine = [i for i, x in enumerate(lanes) if x == lane]
        clock = 0.0
        for t in range(1, max(lengths[i] for i in mine) + 1):
            b = sum(lengths[i] >= t for i in mine)
            clock += tau[b] + kv * b * (t - 1)
            for i in mine:
                if lengths[i] == t:
                    out[i] = clock
    return out


def test_one_lane_matches_the_sum_of_tau_times_the_length_gaps() -> None:
    tau = CURVE.table(3)
    got = lane_finish_times(np.array([30.0, 10.0, 20.0]), np.zeros(3, dtype=np.int64), 1, CURVE)
    shortest = 10 * tau[3]
    assert got[1] == pytest.approx(shortest)
    assert got[2] == pytest.approx(shortest + 10 * tau[2])
    assert got[0] == pytest.approx(shortest + 10 * tau[2] + 10 * tau[1])


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 40), st.integers(0, 3)), min_size=1, max_size=12),
       st.sampled_from([0.0, 1e-5]))
def test_many_lanes_match_the_brute_force(reqs: list[tuple[int, int]], kv: float) -> None:
    lengths = [x for x, _ in reqs]
    lanes = [lane for _, lane in reqs]
    got = lane_finish_times(np.array(lengths, dtype=np.float64), np.array(lanes, dtype=np.int64), 4, CURVE, kv)
    assert got == pytest.approx(_brute(lengths, lanes, kv), rel=1e-9)


def test_no_requests_finish_nowhere() -> None:
    assert lane_finish_times(np.zeros(0), np.zeros(0, dtype=np.int64), 2, CURVE).shape == (0,)


def test_round_robin_deals_requests_or_whole_groups() -> None:
    assert round_robin_lanes(2, 3, 4, True).tolist() == [[0, 1, 2], [3, 0, 1]]
    assert round_robin_lanes(3, 2, 2, False).tolist() == [[0, 0], [1, 1], [0, 0]]


@pytest.mark.parametrize("by_request", [True, False])
def test_a_pool_of_no_replicas_is_refused(by_request: bool) -> None:
    with pytest.raises(ValueError, match=r"^round_robin_lanes: n_lanes must be >= 1, got 0$"):
        round_robin_lanes(2, 3, 0, by_request)


def test_prefill_is_paid_once_per_group_per_replica_it_reaches() -> None:
    dealt = round_robin_lanes(2, 3, 4, True)  # group 0 on lanes 0-2, group 1 on lanes 3, 0, 1
    assert lane_prefill(dealt, 4, 0.5).tolist() == [1.0, 1.0, 0.5, 0.5]
    whole = round_robin_lanes(2, 3, 4, False)
    assert lane_prefill(whole, 4, 0.5).tolist() == [0.5, 0.5, 0.0, 0.0]
    assert lane_prefill(dealt, 4, 0.0).tolist() == [0.0] * 4



@settings(max_examples=200, deadline=None)
@given(st.integers(1, 40), st.integers(1, 12), st.integers(1, 9), st.integers(0, 2**32 - 1))
def test_prefill_counts_each_distinct_group_lane_pair(p: int, g: int, n_lanes: int, seed: int) -> None:
    """Any placement, against counting the distinct (group, lane) pairs one by one."""
    lanes = np.random.default_rng(seed).integers(0, n_lanes, (p, g))
    want = [0.0] * n_lanes
    for lane in {(i, int(x)) for i in range(p) for x in lanes[i]}:
        want[lane[1]] += 1.0
    assert lane_prefill(lanes, n_lanes, 0.25).tolist() == [w * 0.25 for w in want]

def test_group_completions_are_each_groups_last_member_in_independent_pools() -> None:
    pools = np.array([[[10.0, 40.0], [20.0, 30.0]], [[5.0, 5.0], [50.0, 1.0]]])  # K = 2 pools of P = 2, G = 2
    got = group_completions(pools, 2, CURVE, by_request=False, prefill_s=0.25)
    for k in range(2):
        fin = _brute([int(x) for x in pools[k].ravel()], [0, 0, 1, 1])
        assert got[k].tolist() == pytest.approx([max(fin[:2]) + 0.25, max(fin[2:]) + 0.25])
    assert group_completions(np.zeros((3, 0, 2)), 2, CURVE, by_request=True).shape == (3, 0)
