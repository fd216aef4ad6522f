"""Exact best top-(q, m) in hindsight without evaluating every configuration (App. A.2, §2.2, §2.4).

`topq-best` picks, among the uniform split (0, 0) and every top-(q, m) split with q in 1..N and m in 1..R−1, the one
with the smallest exact step makespan T_step = max_r T_r (App. D), ties to (0, 0), then fewer tail replicas m, then
fewer groups q. Exact within that family, it is a known-length top-q heuristic, not a bound on routing: no
over-provisioning, no cuts, no redraws. Evaluating all N·(R−1) splits exactly costs R·N²·G; this module gets the
same answer by branch and bound. With the §2.1 makespan written as T = Σ_i u_i τ(i) (u_i = time with i requests
active, so Σ u_i = L_1 and Σ i·u_i = ΣL), any replica satisfies L_1·τ̆(ΣL / L_1) ≤ T ≤ L_1·τ̂(ΣL / L_1), τ̆ / τ̂ the
lower convex / upper concave envelope of τ on 1..n (`replica_bound`, `replica_upper`). Four tiers, each on the
survivors of the previous one:

1. `pool_grid`: every split, from pool totals only (O(N·R)); a tail with q ≤ m is exact (one group per replica).
2. `class_grid`: the round-robin replicas holding each pool's `_CRITICAL` longest groups, gathered from the pool in
   batch order (O(N·log R) elements per q).
3. `replica_stats`: every replica's longest request and token total (O(N) per split).
4. `exact_max`: exact T_step in increasing bound order until the bound passes the best found, evaluating only the
   replicas whose upper bound reaches the largest lower bound, with `lane_makespans` (bit-identical floats).

A split is dropped only when its bound exceeds the best exact makespan by more than `_MARGIN`, so ties are always
evaluated and broken as in the exhaustive scan; `tests/test_topq_search.py` keeps that scan as the reference.
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
_BATCH = 128  # candidates per all-replica bound batch
_CRITICAL = 3  # replicas per pool whose round-robin class the class bounds gather (those of the longest groups)


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


@lru_cache(maxsize=64)
def _upper_envelope(curve: TpotCurve, n: int) -> tuple[FloatArray, FloatArray]:
    """Vertices of the upper concave envelope of τ on b = 1..n (monotone-chain scan)."""
    tau = curve.table(max(n, 1))
    xs: list[int] = []
    ys: list[float] = []
    for b in range(1, n + 1):
        y = float(tau[b])
        while len(xs) >= 2 and (ys[-1] - ys[-2]) * (b - xs[-2]) <= (y - ys[-2]) * (xs[-1] - xs[-2]):
            xs.pop()
            ys.pop()
        xs.append(b)
        ys.append(y)
    return np.asarray(xs, dtype=np.float64), np.asarray(ys, dtype=np.float64)


def replica_upper(longest: FloatArray, total: FloatArray, curve: TpotCurve, n: int) -> FloatArray:
    """Upper bound L_1·τ̂(ΣL / L_1) on a replica's makespan, τ̂ the upper concave envelope (`replica_bound`'s dual)."""
    xs, ys = _upper_envelope(curve, int(n))
    safe = np.maximum(longest, 1.0)
    return np.asarray(np.where(longest > 0, longest * np.interp(total / safe, xs, ys), 0.0), dtype=np.float64)


def replica_bound(longest: FloatArray, total: FloatArray, curve: TpotCurve, n: int) -> FloatArray:
    """Lower bound L_1·τ̆(ΣL / L_1) on a replica's makespan from its longest request and its token total (§2.1).

    T = Σ_i u_i τ(i) with Σ_i u_i = L_1 and Σ_i i·u_i = ΣL; τ̆ (convex, ≤ τ on 1..n) and Jensen give the bound.
    `n` bounds the replica's request count. Empty replicas (L_1 = 0) bound to 0.
    """
    xs, ys = _envelope(curve, int(n))
    safe = np.maximum(longest, 1.0)
    out = np.where(longest > 0, longest * np.interp(total / safe, xs, ys), 0.0)
    return np.asarray(out, dtype=np.float64)


@dataclass(frozen=True, slots=True)
class Pools:
    """One pool per row, concatenated: row i's groups in batch order are `sums/longest[offset[i]:offset[i] + size[i]]`,
    `before[i, g]` pool groups precede group g (inclusive)."""

    sums: FloatArray
    longest: FloatArray
    offset: IntArray
    size: IntArray
    before: NDArray[np.int32]


def pools(in_pool: NDArray[np.bool_], sums: FloatArray, longest: FloatArray) -> Pools:
    """`Pools` of the groups where `in_pool` (rows × N) holds."""
    size = in_pool.sum(axis=1)
    return Pools(np.broadcast_to(sums, in_pool.shape)[in_pool], np.broadcast_to(longest, in_pool.shape)[in_pool],
                 np.cumsum(size) - size, size, np.cumsum(in_pool, axis=1, dtype=np.int32))


def class_stats(
    p: Pools, rows: IntArray, crit: IntArray, mods: IntArray, live: NDArray[np.bool_]
) -> tuple[FloatArray, FloatArray]:
    """Token total and longest request of the round-robin replica holding group `crit[i]` in pool row `rows[i]`.

    For every modulus k in `mods` that replica is the pool positions ≡ position of crit[i] (mod k); pairs with `live`
    false are skipped (zeros). Returns two (len(rows), len(mods)) arrays; work Σ_i size·Σ_k 1/k gathered elements.
    """
    pos = p.before[rows, crit].astype(np.int64) - 1
    size = p.size[rows]
    start = pos[:, None] % mods[None, :]
    count = np.where(live, (size[:, None] - start + mods[None, :] - 1) // mods[None, :], 0).ravel()
    first = np.cumsum(count) - count
    nz = count > 0
    total = np.zeros(count.size)
    longest = np.zeros(count.size)
    if nz.any():
        step = np.tile(mods, rows.size)[nz]
        head = (p.offset[rows][:, None] + start).ravel()[nz]
        tail = head + step * (count[nz] - 1)
        inc = np.repeat(step, count[nz])
        inc[first[nz]] = head - np.concatenate(([0], tail[:-1]))  # jump to the next replica's first position
        flat = np.cumsum(inc)
        total[nz] = np.add.reduceat(p.sums[flat], first[nz])
        longest[nz] = np.maximum.reduceat(p.longest[flat], first[nz])
    return total.reshape(rows.size, mods.size), longest.reshape(rows.size, mods.size)


@dataclass(frozen=True, slots=True)
class GroupStats:
    """Per-group quantities the bounds use; rank 0 is the group with the longest member (`group_tail_rank`)."""

    by_rank: IntArray  # group index at each rank
    rank: IntArray  # rank of each group
    sums: FloatArray  # token total per group (batch order)
    longest: FloatArray  # longest member per group (batch order)
    alone: FloatArray  # exact makespan of each group alone on a replica (batch order)
    prefix_alone: FloatArray  # prefix_alone[q − 1] = max over ranks < q of `alone`
    n_env: int  # requests in the batch: the envelope's range


def group_stats(lengths: IntArray, rank: IntArray, curve: TpotCurve) -> GroupStats:
    """Precompute `GroupStats` for an N × G batch (O(N·G log(N·G)))."""
    n, g = lengths.shape
    by_rank = np.argsort(rank, kind="stable")
    alone = lane_makespans(lengths.ravel(), np.repeat(np.arange(n), g), n, curve)
    return GroupStats(by_rank, rank, lengths.sum(axis=1).astype(np.float64), lengths.max(axis=1).astype(np.float64),
                      alone, np.maximum.accumulate(alone[by_rank]), n * g)


def class_grid(st: GroupStats, qs: IntArray, live: NDArray[np.bool_], replicas: int, curve: TpotCurve,
               cap: float) -> FloatArray:
    """Lower bounds on T_step for q in `qs` (rows) and m = 1..R−1 (columns) where `live` (inf elsewhere).

    Per pool, the round-robin replicas holding its `_CRITICAL` longest groups (ranks 0, 1, … in the tail; q, q + 1, …
    in the bulk) through `replica_bound` (§2.1, u-form); a tail with q ≤ m is exact (`prefix_alone`, one group per
    replica). Pairs whose bound already exceeds `cap` (the best exact makespan) skip the remaining gathers.
    """
    n = st.rank.size
    ms = np.arange(1, replicas, dtype=np.int64)
    in_tail = st.rank[None, :] < qs[:, None]
    exact_tail = np.broadcast_to(st.prefix_alone[qs - 1][:, None], live.shape)
    multi = ms[None, :] < qs[:, None]
    out = np.where(live, np.where(multi, exact_tail if curve.is_monotone else 0.0, exact_tail), np.inf)
    bp = pools(~in_tail, st.sums, st.longest)
    tp = pools(in_tail, st.sums, st.longest) if (live & multi).any() else None
    for j in range(_CRITICAL):
        rows = np.flatnonzero(qs + j < n)
        if rows.size:
            crit = st.by_rank[qs[rows] + j]
            _raise(out, rows, class_stats(bp, rows, crit, replicas - ms, _open(out, rows, cap)), curve, st.n_env)
            if curve.is_monotone:
                out[rows] = np.maximum(out[rows], st.alone[crit][:, None])
        if tp is not None and j < int(qs.min()):
            rows = np.arange(qs.size)
            crit = np.full(qs.size, st.by_rank[j])
            _raise(out, rows, class_stats(tp, rows, crit, ms, _open(out, rows, cap) & multi), curve, st.n_env)
    return out


def _open(out: FloatArray, rows: IntArray, cap: float) -> NDArray[np.bool_]:
    """Pairs of these rows whose bound does not yet exceed `cap`."""
    return np.asarray(out[rows] * (1.0 - _MARGIN) <= cap)


def _raise(out: FloatArray, rows: IntArray, stats: tuple[FloatArray, FloatArray], curve: TpotCurve, n_env: int) -> None:
    """Raise `out[rows]` to the replica bound of the gathered (token total, longest) class statistics."""
    total, longest = stats
    out[rows] = np.maximum(out[rows], replica_bound(longest, total, curve, n_env))


def split_lanes(rank: IntArray, qs: IntArray, ms: IntArray, replicas: int) -> IntArray:
    """Replica of each group (columns) for each split (q, m) (rows), as `topq_lanes` places them (m ≥ 1)."""
    is_tail = rank[None, :] < qs[:, None]
    before = np.cumsum(is_tail, axis=1, dtype=np.int32)  # tail groups up to and including each group
    out = (np.arange(rank.size, dtype=np.int32)[None, :] - before) % (replicas - ms[:, None]).astype(np.int32)
    rows, cols = np.nonzero(is_tail)
    m = ms[rows].astype(np.int32)
    out[rows, cols] = replicas - m + (before[rows, cols] - 1) % m
    return np.asarray(out, dtype=np.int64)


def replica_stats(st: GroupStats, qs: IntArray, ms: IntArray, replicas: int) -> tuple[IntArray, FloatArray, FloatArray]:
    """Each split's group lanes, and every replica's longest request and token total, (B, N), (B, R), (B, R)."""
    lanes = split_lanes(st.rank, qs, ms, replicas)
    flat = (lanes + (np.arange(qs.size) * replicas)[:, None]).ravel()
    total = np.asarray(np.bincount(flat, weights=np.tile(st.sums, qs.size), minlength=qs.size * replicas),
                       dtype=np.float64)
    longest = np.zeros(qs.size * replicas)
    np.maximum.at(longest, flat, np.tile(st.longest, qs.size))
    return lanes, longest.reshape(qs.size, replicas), total.reshape(qs.size, replicas)


def exact_max(flat: IntArray, group_lanes: IntArray, longest: FloatArray, total: FloatArray, replicas: int,
              curve: TpotCurve, n_env: int) -> float:
    """T_step of one split, bit-identical to `lane_makespans(...).max()`, evaluating only the replicas that can be
    the slowest: those whose upper bound reaches the largest lower bound (`replica_upper`, `replica_bound`)."""
    low = replica_bound(longest, total, curve, n_env)
    high = replica_upper(longest, total, curve, n_env)
    keep = high * (1.0 + _MARGIN) >= float(low.max()) * (1.0 - _MARGIN)
    compact = np.cumsum(keep) - 1
    groups = keep[group_lanes]
    g = flat.size // group_lanes.size
    sub = np.repeat(groups, g)
    spans = lane_makespans(flat[sub], np.repeat(compact[group_lanes[groups]], g), int(keep.sum()), curve)
    return float(spans.max())


def pool_grid(st: GroupStats, replicas: int, curve: TpotCurve) -> FloatArray:
    """Cheap lower bounds on T_step for every split, (N, R−1), from pool totals only (O(N·R)).

    Averaging `replica_bound` over a pool's k replicas (it is jointly convex in (L_1, ΣL), positively homogeneous
    and, when every envelope line has a non-negative intercept, non-decreasing in L_1) bounds the pool's slowest
    replica by bound(ΣL_1, ΣL)/k, with ΣL_1 at least the pool's longest request plus the shortest group maximum
    for every other occupied replica. Tail splits with q ≤ m are exact (`prefix_alone`).
    """
    n = st.rank.size
    q = np.arange(1, n + 1, dtype=np.float64)[:, None]
    m = np.arange(1, replicas, dtype=np.float64)[None, :]
    ell = st.longest[st.by_rank]  # non-increasing
    s_tail = np.cumsum(st.sums[st.by_rank])[:, None]
    s_bulk = float(st.sums.sum()) - s_tail
    n_env = st.n_env
    xs, ys = _envelope(curve, n_env)
    slopes = np.diff(ys) / np.maximum(np.diff(xs), 1.0)
    exact = st.prefix_alone[:, None]
    tail = np.broadcast_to(exact, (n, replicas - 1)).copy()
    bulk = np.zeros((n, replicas - 1))
    if curve.is_monotone:
        bulk[:-1] = st.alone[st.by_rank[1:]][:, None]
    if np.all(ys[:-1] - slopes * xs[:-1] >= 0):
        last = ell[:, None]
        ell_tail = np.cumsum(ell)[:, None]
        l_tail = np.maximum(ell[0] + (np.minimum(q, m) - 1) * last, ell_tail / np.ceil(q / m))
        tail_avg = replica_bound(l_tail, np.broadcast_to(s_tail, l_tail.shape), curve, n_env) / m
        tail = np.where(m >= q, tail, np.maximum(tail, tail_avg) if curve.is_monotone else tail_avg)
        k = replicas - m
        nb = n - q
        l_bulk = np.append(ell[1:], 0.0)[:, None] + np.maximum(np.minimum(nb, k) - 1, 0) * ell[-1]
        l_bulk = np.maximum(l_bulk, (float(ell.sum()) - ell_tail) / np.maximum(np.ceil(nb / k), 1.0))
        bulk_avg = replica_bound(l_bulk, np.broadcast_to(s_bulk, l_bulk.shape), curve, n_env) / k
        bulk = np.maximum(bulk, bulk_avg)
    elif not curve.is_monotone:
        tail = np.where(m >= q, tail, 0.0)
    return np.asarray(np.maximum(tail, bulk), dtype=np.float64)


Lanes = Callable[[int, int], IntArray]  # (q, m) → replica of each group


def search(lengths: IntArray, rank: IntArray, replicas: int, curve: TpotCurve, lanes: Lanes) -> Split:
    """The best split (module doc): pool bounds, then replica-class bounds, then all-replica bounds, then exact."""
    n, g = lengths.shape
    flat = lengths.ravel()

    def exact(q: int, m: int) -> float:
        return float(lane_makespans(flat, np.repeat(lanes(q, m), g), replicas, curve).max())

    best = Split(0, 0, exact(0, 0))
    st = group_stats(lengths, rank, curve)
    coarse = pool_grid(st, replicas, curve)
    fine = np.full(coarse.shape, np.inf)
    rows = max(1, _CHUNK_ELEMS // max(1, int(n * (np.log(replicas) + 6))))
    for i in range(0, n, rows):
        qs = np.arange(i + 1, min(i + rows, n) + 1, dtype=np.int64)
        live = coarse[i:i + qs.size] * (1.0 - _MARGIN) <= best.makespan_s
        if live.any():
            fine[i:i + qs.size] = class_grid(st, qs, live, replicas, curve, best.makespan_s)
    cand = np.flatnonzero(fine.ravel() * (1.0 - _MARGIN) <= best.makespan_s)
    cand = cand[np.argsort(fine.ravel()[cand], kind="stable")]
    for i in range(0, cand.size, _BATCH):
        if fine.flat[cand[i]] * (1.0 - _MARGIN) > best.makespan_s:
            break
        best = _settle(st, cand[i:i + _BATCH], fine, best, replicas, curve, flat)
    return best


def _settle(st: GroupStats, cand: IntArray, fine: FloatArray, best: Split, replicas: int, curve: TpotCurve,
            flat: IntArray) -> Split:
    """Exact makespans of the candidates (flat grid indices) whose all-replica bound does not exceed the best."""
    cand = cand[fine.flat[cand] * (1.0 - _MARGIN) <= best.makespan_s]
    if cand.size == 0:
        return best
    qs = cand // (replicas - 1) + 1
    ms = cand % (replicas - 1) + 1
    lanes, longest, total = replica_stats(st, qs, ms, replicas)
    tight = replica_bound(longest, total, curve, st.n_env).max(axis=1)
    for j in np.argsort(tight, kind="stable"):
        if tight[j] * (1.0 - _MARGIN) > best.makespan_s:
            break
        q, m = int(qs[j]), int(ms[j])
        t = exact_max(flat, lanes[j], longest[j], total[j], replicas, curve, st.n_env)
        if (t, m, q) < (best.makespan_s, best.m, best.q):
            best = Split(q, m, t)
    return best
