"""Exact best top-(q, m) in hindsight without evaluating every configuration (App. A.2, §2.2, §2.4).

`topq-best` picks, among the uniform split (0, 0) and every top-(q, m) split with q in 1..N and m in 1..R−1,
the one with the smallest exact step makespan T_step = max_r T_r (App. D), ties to (0, 0), then fewer tail
replicas m, then fewer groups q. Evaluating all N·(R−1) splits exactly costs R·N²·G; this module gets the same
answer by branch and bound:

1. A lower bound on T_step for every split, from two replicas whose contents are found cheaply: the tail replica
   holding the longest group and the bulk replica holding the longest bulk group. With the §2.1 makespan written
   as T = Σ_i u_i τ(i) (u_i = time with i requests active, Σ u_i = L_1, Σ i·u_i = Σ L), any replica satisfies
   T ≥ L_1·τ̆(ΣL / L_1), τ̆ the lower convex envelope of τ on 1..n (`replica_bound`). A tail replica with a
   single group is known exactly; with a non-decreasing τ every replica also costs at least its longest group.
2. Exact makespans (the same `lane_makespans` arithmetic as the full evaluation, so bit-identical) of the splits
   in increasing bound order, until the bound exceeds the best exact makespan found.

The bounds only prune, so the answer equals the full evaluation's; `tests/test_topq_search.py` checks that
against the brute-force reference on random batches.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from numpy.typing import NDArray

from tailsieve.model.curves import TpotCurve
from tailsieve.model.makespan import lane_makespans

IntArray = NDArray[np.int64]
FloatArray = NDArray[np.float64]

_MARGIN = 1e-9  # relative slack on the bounds: floating-point rounding never prunes a split that ties the best
_CHUNK_ELEMS = 1 << 21  # gathered elements per bound chunk (memory stays O(N·R + this))


@dataclass(frozen=True, slots=True)
class Split:
    """A top-(q, m) configuration and its exact step makespan; (0, 0) is the uniform split."""

    q: int
    m: int
    makespan_s: float


@lru_cache(maxsize=64)
def _envelope(curve: TpotCurve, n: int) -> tuple[FloatArray, FloatArray]:
    """Vertices (b, τ(b)) of the lower convex envelope of τ on b = 1..n (monotone-chain scan)."""
    tau = curve.table(max(n, 1))
    xs: list[int] = []
    ys: list[float] = []
    for b in range(1, n + 1):
        y = float(tau[b])
        while len(xs) >= 2 and (ys[-1] - ys[-2]) * (b - xs[-2]) >= (y - ys[-2]) * (xs[-1] - xs[-2]):
            xs.pop()
            ys.pop()
        xs.append(b)
        ys.append(y)
    return np.asarray(xs, dtype=np.float64), np.asarray(ys, dtype=np.float64)


def replica_bound(longest: FloatArray, total: FloatArray, curve: TpotCurve, n: int) -> FloatArray:
    """Lower bound L_1·τ̆(ΣL / L_1) on a replica's makespan from its longest request and its token total (§2.1).

    T = Σ_i u_i τ(i) with Σ_i u_i = L_1 and Σ_i i·u_i = ΣL; τ̆ (convex, ≤ τ on 1..n) and Jensen give the bound.
    `n` bounds the replica's request count. Empty replicas (L_1 = 0) bound to 0.
    """
    xs, ys = _envelope(curve, int(n))
    safe = np.maximum(longest, 1.0)
    out = np.where(longest > 0, longest * np.interp(total / safe, xs, ys), 0.0)
    return np.asarray(out, dtype=np.float64)


def class_stats(
    seq_s: FloatArray, seq_l: FloatArray, pos: IntArray, size: IntArray, mods: IntArray
) -> tuple[FloatArray, FloatArray]:
    """Token total and longest request of the round-robin replica holding sequence position `pos[i]`.

    Row i of `seq_s` / `seq_l` is a pool's groups in batch order (token totals / longest members), `size[i]` of them;
    for every modulus k in `mods` the replica is positions ≡ pos[i] (mod k). Returns two (rows, len(mods)) arrays.
    Work: Σ_i size[i]·Σ_k 1/k gathered elements.
    """
    rows, width = seq_s.shape
    start = pos[:, None] % mods[None, :]
    count = (size[:, None] - start + mods[None, :] - 1) // mods[None, :]
    count = np.maximum(count, 0).ravel()
    first = np.cumsum(count) - count
    pair = np.repeat(np.arange(count.size), count)
    step = np.arange(pair.size) - first[pair]
    flat = (pair // mods.size) * width + start.ravel()[pair] + np.tile(mods, rows)[pair] * step
    total = np.zeros(count.size)
    longest = np.zeros(count.size)
    nz = count > 0
    if pair.size:
        total[nz] = np.add.reduceat(seq_s.ravel()[flat], first[nz])
        longest[nz] = np.maximum.reduceat(seq_l.ravel()[flat], first[nz])
    return total.reshape(rows, mods.size), longest.reshape(rows, mods.size)


def pool_sequences(in_pool: NDArray[np.bool_], sums: FloatArray, longest: FloatArray) -> tuple[FloatArray, FloatArray, IntArray]:
    """Each row's pool in batch order: token totals, longest members (zero-padded) and each group's position."""
    pos = np.cumsum(in_pool, axis=1) - 1
    rows, cols = np.nonzero(in_pool)
    seq_s = np.zeros(in_pool.shape)
    seq_l = np.zeros(in_pool.shape)
    seq_s[rows, pos[rows, cols]] = sums[cols]
    seq_l[rows, pos[rows, cols]] = longest[cols]
    return seq_s, seq_l, pos


@dataclass(frozen=True, slots=True)
class GroupStats:
    """Per-group quantities the bounds use, indexed by tail rank (rank 0 = the longest member, `group_tail_rank`)."""

    by_rank: IntArray  # group index at each rank
    rank: IntArray  # rank of each group
    sums: FloatArray  # token total per group (batch order)
    longest: FloatArray  # longest member per group (batch order)
    alone: FloatArray  # exact makespan of each group alone on a replica (batch order)
    prefix_alone: FloatArray  # prefix_alone[q − 1] = max over ranks < q of `alone`


def group_stats(lengths: IntArray, rank: IntArray, curve: TpotCurve) -> GroupStats:
    """Precompute `GroupStats` for an N × G batch (O(N·G log(N·G)))."""
    n, g = lengths.shape
    by_rank = np.argsort(rank, kind="stable")
    alone = lane_makespans(lengths.ravel(), np.repeat(np.arange(n), g), n, curve)
    return GroupStats(by_rank, rank, lengths.sum(axis=1).astype(np.float64),
                      lengths.max(axis=1).astype(np.float64), alone, np.maximum.accumulate(alone[by_rank]))


def bound_chunk(st: GroupStats, qs: IntArray, replicas: int, curve: TpotCurve, n_env: int) -> FloatArray:
    """Lower bounds on T_step for q in `qs` (rows) and m = 1..R−1 (columns), from two replicas per split.

    Tail: the replica holding the rank-0 group (exact `prefix_alone` while q ≤ m: one group per tail replica).
    Bulk: the replica holding group rank q, the longest bulk group. Both through `replica_bound` (§2.1, u-form).
    """
    n = st.rank.size
    ms = np.arange(1, replicas, dtype=np.int64)
    monotone = curve.is_monotone
    in_tail = st.rank[None, :] < qs[:, None]
    exact_tail = st.prefix_alone[qs - 1]
    seq_s, seq_l, pos = pool_sequences(in_tail, st.sums, st.longest)
    ts, tl = class_stats(seq_s, seq_l, pos[:, st.by_rank[0]], qs, ms)
    tail = replica_bound(tl, ts, curve, n_env)
    if monotone:
        tail = np.maximum(tail, exact_tail[:, None])
    tail = np.where(ms[None, :] >= qs[:, None], exact_tail[:, None], tail)
    bulk = np.zeros_like(tail)
    live = qs < n
    if live.any():
        lq = qs[live]
        seq_s, seq_l, pos = pool_sequences(~in_tail[live], st.sums, st.longest)
        crit = st.by_rank[lq]
        bs, bl = class_stats(seq_s, seq_l, pos[np.arange(lq.size), crit], n - lq, replicas - ms)
        bulk[live] = replica_bound(bl, bs, curve, n_env)
        if monotone:
            bulk[live] = np.maximum(bulk[live], st.alone[crit][:, None])
    return np.asarray(np.maximum(tail, bulk), dtype=np.float64)


def bound_grid(st: GroupStats, replicas: int, curve: TpotCurve, group_size: int) -> FloatArray:
    """`bound_chunk` over every q = 1..N, in chunks that keep the gathered arrays near `_CHUNK_ELEMS`; (N, R−1)."""
    n = st.rank.size
    per_row = max(1, int(n * (np.log(replicas) + 6)))
    rows = max(1, _CHUNK_ELEMS // per_row)
    qs = np.arange(1, n + 1, dtype=np.int64)
    return np.concatenate([bound_chunk(st, qs[i:i + rows], replicas, curve, n * group_size)
                           for i in range(0, n, rows)])


Lanes = Callable[[int, int], IntArray]  # (q, m) → replica of each group


def search(lengths: IntArray, rank: IntArray, replicas: int, curve: TpotCurve, lanes: Lanes) -> Split:
    """The best split: exact makespans in increasing bound order until the bound passes the best (module doc)."""
    n, g = lengths.shape
    flat = lengths.ravel()

    def exact(q: int, m: int) -> float:
        return float(lane_makespans(flat, np.repeat(lanes(q, m), g), replicas, curve).max())

    best = Split(0, 0, exact(0, 0))
    bounds = bound_grid(group_stats(lengths, rank, curve), replicas, curve, g)
    live = np.flatnonzero(bounds.ravel() * (1.0 - _MARGIN) <= best.makespan_s)
    order = live[np.argsort(bounds.ravel()[live], kind="stable")]
    for k in order:
        if bounds.flat[k] * (1.0 - _MARGIN) > best.makespan_s:
            break
        q, m = int(k // (replicas - 1)) + 1, int(k % (replicas - 1)) + 1
        t = exact(q, m)
        if (t, m, q) < (best.makespan_s, best.m, best.q):
            best = Split(q, m, t)
    return best
