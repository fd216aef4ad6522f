"""Known-length baselines (App. A.2) and top-(q, m) isolation: completeness, exact numbers, optimality in hindsight."""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import curves, make_curve
from tailsieve.errors import ConfigError
from tailsieve.model.baselines import (
    POLICIES,
    GroupBatch,
    Policy,
    StreamRLOracle,
    TopQ,
    TopQBest,
    UniformOracle,
    balance,
    get_policy,
    improve,
    lpt,
    verify_assignment,
)
from tailsieve.model.curve_names import load_curve
from tailsieve.model.curves import TpotCurve

HAND = make_curve(batch=(1, 2, 3), tpot_ms=(1000.0, 1500.0, 2000.0))  # τ = 1, 1.5, 2, 2.5, … s


def all_policies() -> list[Policy]:
    return [cls() for name, cls in POLICIES.items() if name != "topq"] + [TopQ(q=1, m=1)]


@st.composite
def batches(draw: st.DrawFn, max_groups: int = 6, max_size: int = 4) -> GroupBatch:
    n = draw(st.integers(1, max_groups))
    g = draw(st.integers(1, max_size))
    cells = draw(st.lists(st.integers(0, 40), min_size=n * g, max_size=n * g))
    return GroupBatch(np.asarray(cells).reshape(n, g))


# ---------------------------------------------------------------- hand-computed case
# groups [10, 2], [1, 1], [4, 4], [3, 1] on R = 2; on one replica T = Σ_j L_j (τ(j) − τ(j−1)) = L_1 + 0.5 Σ_{j>1} L_j
TINY = GroupBatch(np.array([[10, 2], [1, 1], [4, 4], [3, 1]]), group_ids=("a", "b", "c", "d"))


def test_hand_uniform() -> None:
    a = get_policy("uniform").assign(TINY, 2, HAND)
    assert a.replica.tolist() == [[0, 0], [1, 1], [0, 0], [1, 1]]
    assert a.replica_makespans_s.tolist() == pytest.approx([15.0, 4.5])  # 10+.5(4+4+2), 3+.5(1+1+1)
    assert a.makespan_s == pytest.approx(15.0)


def test_hand_topq_and_best() -> None:
    a = TopQ(q=1, m=1).assign(TINY, 2, HAND)
    assert a.replica[:, 0].tolist() == [1, 0, 0, 0]  # the tail replica is the last one
    assert a.replica_makespans_s.tolist() == pytest.approx([9.0, 11.0])  # 4+.5(4+3+1+1+1) ; 10+.5·2
    b = TopQBest().assign(TINY, 2, HAND)
    assert (b.info["q"], b.info["m"]) == (1, 1)
    assert b.makespan_s == pytest.approx(11.0)


def test_hand_oracles() -> None:
    u = UniformOracle().assign(TINY, 2, HAND)  # totals 12, 2, 8, 4 → LPT {a, b} = 14 | {c, d} = 12, no improving move
    assert u.replica[:, 0].tolist() == [0, 0, 1, 1]
    assert u.makespan_s == pytest.approx(12.0)
    assert (u.info["max_load_tokens"], u.info["lpt_max_load_tokens"]) == (14, 14)
    s = get_policy("seer-oracle").assign(TINY, 2, HAND)  # LPT over requests: {10, 2, 1} | {4, 4, 3, 1, 1}
    assert s.replica.tolist() == [[0, 0], [1, 0], [1, 1], [1, 1]]
    assert s.replica_makespans_s.tolist() == pytest.approx([11.5, 8.5])
    r = StreamRLOracle().assign(TINY, 2, HAND)  # ceil(0.2·8) = 2 longest (10 and the first 4) on replica 1
    assert (r.info["dedicated"], r.info["isolated_requests"]) == (1, 2)
    assert r.replica.tolist() == [[1, 0], [0, 0], [1, 0], [0, 0]]
    assert r.replica_makespans_s.tolist() == pytest.approx([8.0, 12.0])


def test_improvement_beats_lpt_on_classic_case() -> None:
    w = np.array([3, 3, 2, 2, 2])
    assert np.bincount(lpt(w, 2), weights=w).tolist() == [7, 5]
    assert np.bincount(balance(w, 2), weights=w).tolist() == [6, 6]
    u = UniformOracle().assign(GroupBatch(w[:, None]), 2, HAND)
    assert (u.info["max_load_tokens"], u.info["lpt_max_load_tokens"]) == (6, 7)


# ---------------------------------------------------------------- properties
@settings(max_examples=80, deadline=None)
@given(batches(), st.integers(2, 4), curves())
def test_every_policy_is_complete_and_exact(batch: GroupBatch, replicas: int, curve: TpotCurve) -> None:
    for p in all_policies():
        a = p.assign(batch, replicas, curve)
        verify_assignment(batch, a, curve, group_atomic=p.group_atomic)
        assert a.n_replicas == replicas
        assert a.policy == p.name
        assert a.makespan_s == pytest.approx(a.replica_makespans_s.max())


@settings(max_examples=80, deadline=None)
@given(batches(), st.integers(2, 4), curves())
def test_topq_best_equals_brute_force(batch: GroupBatch, replicas: int, curve: TpotCurve) -> None:
    configs = [(0, 0)] + [(q, m) for m in range(1, replicas) for q in range(1, batch.n_groups + 1)]
    brute = min(TopQ(q=q, m=m).assign(batch, replicas, curve).makespan_s for q, m in configs)
    best = TopQBest().assign(batch, replicas, curve)
    assert best.makespan_s == pytest.approx(brute, rel=1e-12, abs=1e-12)
    again = TopQ(q=int(best.info["q"]), m=int(best.info["m"])).assign(batch, replicas, curve)
    assert np.array_equal(again.replica, best.replica)


@settings(max_examples=80, deadline=None)
@given(batches(), st.integers(1, 5), curves())
def test_oracles_at_least_as_balanced_as_lpt(batch: GroupBatch, replicas: int, curve: TpotCurve) -> None:
    for name, w in (("uniform-oracle", batch.lengths.sum(axis=1)), ("seer-oracle", batch.lengths.ravel())):
        a = get_policy(name).assign(batch, replicas, curve)
        assert a.info["max_load_tokens"] <= a.info["lpt_max_load_tokens"]
        assert a.info["lpt_max_load_tokens"] == np.bincount(lpt(w, replicas), weights=w, minlength=replicas).max()


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 100), min_size=1, max_size=30), st.integers(1, 6))
def test_improve_never_raises_the_maximum(weights: list[int], bins: int) -> None:
    w = np.asarray(weights)
    start = lpt(w, bins)
    out = improve(w, start, bins)
    assert out.shape == w.shape and out.min() >= 0 and out.max() < bins
    lb = np.bincount(start, weights=w, minlength=bins)
    la = np.bincount(out, weights=w, minlength=bins)
    assert la.max() <= lb.max()
    assert la.sum() == w.sum()


@settings(max_examples=60, deadline=None)
@given(batches(), st.integers(2, 4), curves())
def test_topq_zero_is_uniform_and_streamrl_best_count(batch: GroupBatch, replicas: int, curve: TpotCurve) -> None:
    uni = get_policy("uniform").assign(batch, replicas, curve)
    assert np.array_equal(TopQ().assign(batch, replicas, curve).replica, uni.replica)
    best = StreamRLOracle().assign(batch, replicas, curve)
    each = [StreamRLOracle(dedicated=d).assign(batch, replicas, curve).makespan_s for d in range(1, replicas)]
    assert best.makespan_s == pytest.approx(min(each), rel=1e-12, abs=1e-12)
    assert best.info["dedicated"] == int(np.argmin(each)) + 1


def test_paper_setting_is_fast() -> None:
    rng = np.random.default_rng(7)
    batch = GroupBatch(rng.lognormal(7.5, 0.9, size=(64, 8)).astype(np.int64))
    curve = load_curve("h100-llama3-8b")
    start = time.perf_counter()
    for p in all_policies():
        p.assign(batch, 8, curve)
    assert time.perf_counter() - start < 1.0


# ---------------------------------------------------------------- validation
def test_topq_validation_names_the_value() -> None:
    with pytest.raises(ConfigError, match=r"q and m must both be 0 \(uniform\) or both positive, got q=3, m=0"):
        TopQ(q=3, m=0)
    with pytest.raises(ConfigError, match="got q=0, m=2"):
        TopQ(q=0, m=2)
    with pytest.raises(ConfigError, match="q must be a non-negative integer, got q=-1"):
        TopQ(q=-1, m=1)
    with pytest.raises(ConfigError, match=r"q must lie in 0..4 \(the number of groups\), got q=5"):
        TopQ(q=5, m=1).assign(TINY, 2, HAND)
    with pytest.raises(ConfigError, match=r"m must lie in 0..1 \(R=2 replicas\), got m=2"):
        TopQ(q=1, m=2).assign(TINY, 2, HAND)


def test_replica_and_registry_errors() -> None:
    with pytest.raises(ConfigError, match="policy topq-best needs at least 2 replicas"):
        TopQBest().assign(TINY, 1, HAND)
    with pytest.raises(ConfigError, match="policy streamrl-oracle needs at least 2 replicas"):
        StreamRLOracle().assign(TINY, 1, HAND)
    with pytest.raises(ConfigError, match="policy uniform needs at least 1 replicas"):
        get_policy("uniform").assign(TINY, 0, HAND)
    with pytest.raises(ConfigError, match=r"dedicated must lie in 1..1 \(R=2 replicas\), got 2"):
        StreamRLOracle(dedicated=2).assign(TINY, 2, HAND)
    with pytest.raises(ConfigError, match="fraction must lie strictly between 0 and 1, got 1.5"):
        StreamRLOracle(fraction=1.5)
    valid = "uniform, uniform-oracle, streamrl-oracle, seer-oracle, topq, topq-best"
    with pytest.raises(ConfigError, match=rf"^unknown policy 'rr' \(valid: {valid}\)$"):
        get_policy("rr")
    assert list(POLICIES) == ["uniform", "uniform-oracle", "streamrl-oracle", "seer-oracle", "topq", "topq-best"]
    assert get_policy("uniform").assign(TINY, 1, HAND).makespan_s == pytest.approx(
        10 + 0.5 * (4 + 4 + 3 + 2 + 1 + 1 + 1)
    )


def test_group_batch_validation() -> None:
    with pytest.raises(ConfigError, match="non-empty N × G array, got shape"):
        GroupBatch(np.array([1, 2, 3]))
    with pytest.raises(ConfigError, match="non-negative, got -2"):
        GroupBatch(np.array([[1, -2]]))
    with pytest.raises(ConfigError, match="whole numbers"):
        GroupBatch(np.array([[1.5, 2]]))
    with pytest.raises(ConfigError, match="3 group ids for 4 groups"):
        GroupBatch(TINY.lengths, group_ids=("a", "b", "c"))
    with pytest.raises(ConfigError, match="same size"):
        GroupBatch.from_groups([[1, 2], [3]])
    b = GroupBatch.from_groups([[1, 2], [3, 4], [5, 6]], ["x", "y", "z"])
    assert (b.n_groups, b.group_size, b.n_requests) == (3, 2, 6)
    assert not b.lengths.flags.writeable


def test_verify_assignment_catches_split_group() -> None:
    a = get_policy("seer-oracle").assign(TINY, 2, HAND)
    with pytest.raises(ValueError, match="split across replicas"):
        verify_assignment(TINY, a, HAND, group_atomic=True)
