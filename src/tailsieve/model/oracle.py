"""Two-lane offline oracle and top-k tail isolation with known lengths (§2.1, §2.2, App. A.4).

Requests are taken longest first; putting the i-th longest on a lane that already holds c requests adds
L_i (τ(c+1) − τ(c)) to that lane (§2.1). A partial assignment is the state (c, A, B): c requests on lane B, lane
times A (lane A holds the longest request: symmetry break) and B. The exact oracle is a Bellman DP over these
states that keeps, per c, only the Pareto front of (A, B) and drops every state whose lower bound on the final
max(A, B) is not below the best known makespan UB (best top-k, improved by a beam pass). The bound is Lagrangian:
max(A_f, B_f) ≥ λ A + (1 − λ) B + G_λ(i, c) for λ on a grid in [0, 1], where G_λ is the exact minimum of
λ F_A + (1 − λ) F_B over the future costs (a backward DP over (i, c)); it stays valid where τ dips. Hard groups
are split by the final lane-B count, which tightens G. Finally lanes are relabelled so that lane 1 holds fewer
requests. See docs/oracle.md.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from tailsieve.errors import TailSieveError
from tailsieve.model.curves import TpotCurve
from tailsieve.model.makespan import as_lengths, lane_makespans, marginal_tpot

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]
LaneArray = NDArray[np.int8]
BoolArray = NDArray[np.bool_]

PRUNE_RTOL = 1e-12  # search only for makespans below UB·(1 − PRUNE_RTOL): exact to this relative margin
DEFAULT_BEAM = 2048  # states per step in the heuristic pass that tightens UB
DEFAULT_MAX_STATES = 20_000_000  # total states kept (all passes) before the oracle gives up
_ONE_PASS_STATES = 50_000  # beyond this, the exact search is split by final lane count instead
_LAMBDAS = 25  # grid size of the Lagrangian bound
_BATCH = 4  # G tables built together when splitting by count
_BOUND_BYTES = 512 * 2**20  # memory cap of one batch of G tables (fewer λ for very large n)
_DIRECT_CORRELATE_MAX = 16384  # above this n, the bulk-lane sums use an FFT


class OracleBudgetError(TailSieveError):
    """The exact oracle hit its state or time budget; `lower` ≤ optimum ≤ `upper` (seconds) at that point."""

    def __init__(self, message: str, lower: float, upper: float) -> None:
        super().__init__(message)
        self.lower = lower
        self.upper = upper


@dataclass(frozen=True, slots=True)
class TopKCurve:
    """Top-k isolation for every k = 0..n: tail lane = k longest, bulk lane = the rest (Fig. 2b)."""

    tail_s: FloatArray
    bulk_s: FloatArray
    makespan_s: FloatArray


@dataclass(frozen=True, slots=True)
class BestTopK:
    """The k minimising max(T_tail(k), T_bulk(k)) (smallest such k), with both lane times (§2.2)."""

    k: int
    makespan: float
    tail_s: float
    bulk_s: float


@dataclass(frozen=True, slots=True, eq=False)
class OracleResult:
    """Exact two-lane optimum: `lane[i]` ∈ {0, 1} in input order; lane 1 holds fewer requests (App. A.4)."""

    makespan: float
    lane: LaneArray
    states: int
    topk: float
    best_k: int


def _sorted_desc(lengths: ArrayLike) -> tuple[IntArray, FloatArray]:
    arr = as_lengths(lengths)
    order = np.argsort(-arr, kind="stable")
    return order.astype(np.int64), arr[order]


def _bulk_sums(desc: FloatArray, d: FloatArray) -> FloatArray:
    """T_bulk(k) = Σ_{i≥1} dτ(i) L_{k+i} for k = 0..n: a correlation of the lengths with dτ."""
    n = desc.size
    if n <= _DIRECT_CORRELATE_MAX:
        return np.correlate(np.concatenate((desc, np.zeros(n))), d, "valid")
    size = 1 << (2 * n).bit_length()
    full = np.fft.irfft(np.fft.rfft(desc, size) * np.fft.rfft(d[::-1], size), size)
    return np.asarray(full[n - 1 : 2 * n], dtype=np.float64)


def topk_curve(lengths: ArrayLike, curve: TpotCurve) -> TopKCurve:
    """Tail/bulk lane times of top-k isolation for all k in one pass (§2.2; T = Σ_j L_j dτ(j) per lane)."""
    _, desc = _sorted_desc(lengths)
    n = desc.size
    d = marginal_tpot(curve, n)[1:]
    tail = np.concatenate(([0.0], np.cumsum(desc * d)))
    bulk = _bulk_sums(desc, d) if n else np.zeros(1)
    bulk[-1] = 0.0
    return TopKCurve(tail_s=tail, bulk_s=bulk, makespan_s=np.maximum(tail, bulk))


def topk_makespans(lengths: ArrayLike, curve: TpotCurve) -> FloatArray:
    """max(T_tail(k), T_bulk(k)) for k = 0..n (§2.2, Fig. 2b)."""
    return topk_curve(lengths, curve).makespan_s


def best_topk(lengths: ArrayLike, curve: TpotCurve) -> BestTopK:
    """The best isolation size k of the top-k policy (§2.2)."""
    tk = topk_curve(lengths, curve)
    k = int(np.argmin(tk.makespan_s))
    return BestTopK(k=k, makespan=float(tk.makespan_s[k]), tail_s=float(tk.tail_s[k]), bulk_s=float(tk.bulk_s[k]))


def topk_lanes(lengths: ArrayLike, k: int) -> LaneArray:
    """Lane 1 for the k longest requests (ties: earlier input first), lane 0 for the rest; input order."""
    order, _ = _sorted_desc(lengths)
    lane = np.zeros(order.size, dtype=np.int8)
    lane[order[: max(0, k)]] = 1
    return lane


def alternate_lanes(n: int) -> LaneArray:
    """Uniform routing baseline: request i goes to lane i % 2."""
    return (np.arange(n) % 2).astype(np.int8)


def _lambda_grid(n: int) -> FloatArray:
    fit = _BOUND_BYTES // max(1, 8 * _BATCH * (n + 1) * (n + 2) // 2)
    return np.linspace(0.0, 1.0, int(min(_LAMBDAS, max(2, fit))))


def _future_bounds(desc: FloatArray, d: FloatArray, lam: FloatArray, finals: BoolArray) -> list[FloatArray]:
    """G[i][m, c, ·] = min of λ F_A + (1 − λ) F_B over placements of requests i..n−1, given c of the first i on
    lane B and a final lane-B count allowed by `finals[m]` (+inf when none is reachable)."""
    n = desc.size
    g: list[FloatArray] = [np.zeros(0)] * (n + 1)
    g[n] = np.repeat(np.where(finals, 0.0, np.inf)[:, :, None], lam.size, axis=2)
    for i in range(n - 1, -1, -1):
        c = np.arange(i + 1)
        on_a = (desc[i] * d[i - c + 1])[:, None] * lam + g[i + 1][:, :-1]
        on_b = (desc[i] * d[c + 1])[:, None] * (1.0 - lam) + g[i + 1][:, 1:]
        g[i] = np.minimum(on_a, on_b)
    return g


def _root_bound(desc: FloatArray, d: FloatArray, lam: FloatArray, g: list[FloatArray]) -> FloatArray:
    """Lower bound on the optimum per mask: the state with only the longest request placed (on lane A)."""
    return np.asarray((desc[0] * d[1] * lam + g[1][:, 0, :]).max(axis=1), dtype=np.float64)


class _Exhausted(Exception):
    def __init__(self, lower: float, hard: bool) -> None:
        super().__init__()
        self.lower, self.hard = lower, hard


@dataclass(frozen=True, slots=True)
class OracleProgress:
    """Where one exact solve stands, after each request placed: search `search` (1, 2, …: the beam pass, the
    one-pass search, then one per final lane count tried) has placed `step` of its `requests`, and `states` DP
    states are kept so far over all searches. How many searches a solve needs is not known in advance."""

    search: int
    step: int
    requests: int
    states: int


@dataclass(slots=True)
class _Budget:
    max_states: int | None
    deadline: float | None
    on_step: Callable[[OracleProgress], None] | None = None
    states: int = 0
    searches: int = 0

    def placed(self, step: int, requests: int) -> None:
        """Report a placed request to `on_step`, if any."""
        if self.on_step is not None:
            self.on_step(OracleProgress(self.searches, step, requests, self.states))


@dataclass(frozen=True, slots=True)
class _Pass:
    value: float  # best final max(A, B) found (inf when every state was pruned)
    lanes: LaneArray | None  # its lanes in descending-length order (1 = lane B)
    truncated: bool  # the beam dropped states: value is only an upper bound


def _search(
    desc: FloatArray, d: FloatArray, lam: FloatArray, g: list[FloatArray], ub: float, budget: _Budget,
    width: int | None = None, cap: int | None = None,
) -> _Pass:
    """One forward pass of the Pareto DP over G-table `g`; `width` keeps only the best states per step (beam)."""
    n = desc.size
    limit = ub * (1.0 - PRUNE_RTOL)  # only strictly better solutions are searched for
    c = np.zeros(1, dtype=np.int64)
    a = np.array([desc[0] * d[1]])
    b = np.zeros(1)
    parents: list[NDArray[np.int32]] = [np.zeros(1, dtype=np.int32)]
    on_b_kept: list[BoolArray] = [np.zeros(1, dtype=bool)]
    kept, truncated, dropped = 1, False, math.inf  # dropped: least bound the beam threw away (for the gap)
    budget.states += 1
    budget.searches += 1
    budget.placed(1, n)
    wa, wb = lam, 1.0 - lam
    for i in range(1, n):
        li, gi = desc[i], g[i + 1]
        ca, aa, ba = c, a + li * d[i - c + 1], b  # request i joins lane A (which holds i − c requests)
        cb, ab, bb = c + 1, a, b + li * d[c + 1]  # request i joins lane B
        bound_a = (aa[:, None] * wa + ba[:, None] * wb + gi[ca]).max(axis=1)
        bound_b = (ab[:, None] * wa + bb[:, None] * wb + gi[cb]).max(axis=1)
        ka = np.flatnonzero(bound_a < limit)
        kb = np.flatnonzero(bound_b < limit)
        if ka.size + kb.size == 0:
            return _Pass(math.inf, None, truncated)
        cc = np.concatenate((ca[ka], cb[kb]))
        an = np.concatenate((aa[ka], ab[kb]))
        bn = np.concatenate((ba[ka], bb[kb]))
        bound = np.concatenate((bound_a[ka], bound_b[kb]))
        par = np.concatenate((ka, kb))
        on_b = np.concatenate((np.zeros(ka.size, dtype=bool), np.ones(kb.size, dtype=bool)))
        # Sort by (c, A): both runs are already sorted that way, so the stable sort (timsort) only merges them.
        big = math.ldexp(1.0, math.frexp(float(an.max()) + 1.0)[1])
        order = np.argsort(cc * big + an, kind="stable")
        cc, an, bn, bound, par, on_b = cc[order], an[order], bn[order], bound[order], par[order], on_b[order]
        keep = _pareto_keep(cc, an, bn, on_b)
        if width is not None and keep.size > width:
            part = np.argpartition(bound[keep], width)
            dropped = min(dropped, float(bound[keep[part[width:]]].min()))
            keep = np.sort(keep[part[:width]])
            truncated = True
        c, a, b = cc[keep], an[keep], bn[keep]
        parents.append(par[keep].astype(np.int32))
        on_b_kept.append(on_b[keep])
        kept += int(keep.size)
        budget.states += int(keep.size)
        budget.placed(i + 1, n)
        hard = budget.max_states is not None and budget.states > budget.max_states
        hard = hard or (budget.deadline is not None and time.perf_counter() > budget.deadline)
        if hard or (cap is not None and kept > cap):
            raise _Exhausted(min(float(bound[keep].min()), dropped), hard)
    final = np.maximum(a, b)
    j = int(np.argmin(final))
    return _Pass(float(final[j]), _backtrack(parents, on_b_kept, j), truncated)


def _pareto_keep(cc: NDArray[np.int64], an: FloatArray, bn: FloatArray, on_b: BoolArray) -> NDArray[np.intp]:
    """Indices of the states (sorted by (c, A)) that survive the Pareto filter. Along each run B does not increase,
    so the entry most likely to dominate another is the latest earlier entry of the other run with the same c.
    The test compares true values: drops are sound."""
    idx = np.arange(cc.size)
    last_b = np.maximum.accumulate(np.where(on_b, idx, -1))
    last_a = np.maximum.accumulate(np.where(on_b, -1, idx))
    other = np.where(on_b, np.roll(last_a, 1), np.roll(last_b, 1))
    other[0] = -1
    o = np.maximum(other, 0)
    return np.flatnonzero((other < 0) | (cc[o] != cc) | (an[o] > an) | (bn[o] > bn))


def _backtrack(parents: list[NDArray[np.int32]], on_b_kept: list[BoolArray], j: int) -> LaneArray:
    """Lanes of final state j, in descending-length order, following the parent pointers back to request 0."""
    n = len(parents)
    lanes = np.zeros(n, dtype=np.int8)
    for i in range(n - 1, 0, -1):
        lanes[i] = on_b_kept[i][j]
        j = int(parents[i][j])
    return lanes


def _by_count(
    desc: FloatArray, d: FloatArray, lam: FloatArray, incumbent: tuple[float, LaneArray], budget: _Budget,
    found: list[LaneArray],
) -> float:
    """Exact search split by the final lane-B count f (fixing it tightens G): f near the incumbent's first,
    then rings outwards while the bound of the untried counts on either side stays within UB."""
    n = desc.size
    ub, lanes = incumbent
    f0 = int((lanes != lanes[0]).sum())
    lo_open, hi_open = True, True  # counts below / above the tried ones may still beat UB
    f = np.arange(n + 1)
    for r in range(n):
        singles = [f0] if r == 0 else [f0 - r] * lo_open + [f0 + r] * hi_open
        masks = [f == x for x in singles]
        masks += [f < f0 - r] * lo_open + [(f > f0 + r) & (f < n)] * hi_open  # empty mask: bound +inf
        g = _future_bounds(desc, d, lam, np.stack(masks))
        root = _root_bound(desc, d, lam, g)
        for m, _ in enumerate(singles):
            if root[m] >= ub * (1.0 - PRUNE_RTOL):
                continue
            pending = float(min(root[m:].min(), ub))
            try:
                res = _search(desc, d, lam, [x[m] for x in g], ub, budget)
            except _Exhausted as exc:
                raise _Exhausted(min(exc.lower, pending), exc.hard) from None
            if res.lanes is not None and res.value < ub:
                ub = res.value
                found.append(res.lanes)
        limit, k = ub * (1.0 - PRUNE_RTOL), len(singles)
        if lo_open:
            lo_open, k = bool(root[k] < limit), k + 1
        if hi_open:
            hi_open = bool(root[k] < limit)
        if not (lo_open or hi_open):
            break
    return ub


def _optimise(
    desc: FloatArray, d: FloatArray, ub: float, beam: int | None, budget: _Budget, found: list[LaneArray]
) -> float:
    """Tighten UB with the beam, then solve exactly: in one pass when that stays small, else split by count."""
    n = desc.size
    lam = _lambda_grid(n)
    g = [x[0] for x in _future_bounds(desc, d, lam, np.ones((1, n + 1), dtype=bool))]
    best = found[0]
    if beam is not None:
        res = _search(desc, d, lam, g, ub, budget, width=beam)
        if res.lanes is not None and res.value < ub:
            ub, best = res.value, res.lanes
            found.append(best)
        if not res.truncated:
            return ub
    try:
        res = _search(desc, d, lam, g, ub, budget, cap=_ONE_PASS_STATES)
    except _Exhausted as exc:
        if exc.hard:
            raise
        return _by_count(desc, d, lam, (ub, best), budget, found)
    if res.lanes is not None and res.value < ub:
        ub = res.value
        found.append(res.lanes)
    return ub


def _relabel(lanes_desc: LaneArray) -> LaneArray:
    """Lane 1 holds fewer requests; on equal counts lane 1 holds the longest request (first in input order)."""
    ones = int(lanes_desc.sum())
    zeros = lanes_desc.size - ones
    if ones < zeros or (ones == zeros and lanes_desc.size and lanes_desc[0] == 1):
        return lanes_desc
    return (1 - lanes_desc).astype(np.int8)


def two_lane_oracle(
    lengths: ArrayLike, curve: TpotCurve, *, beam: int | None = DEFAULT_BEAM,
    max_states: int | None = DEFAULT_MAX_STATES, max_seconds: float | None = None,
    on_step: Callable[[OracleProgress], None] | None = None,
) -> OracleResult:
    """Exact min over all 2^n assignments of max(T_1, T_2) (§2.1, App. A.4), by Pareto DP with bound pruning.

    `beam` sets the width of the heuristic pass that tightens the top-k upper bound first (None skips it);
    `max_states` / `max_seconds` bound the whole search, which otherwise raises `OracleBudgetError`. `on_step`,
    when given, is called after each request a search places (`OracleProgress`), e.g. to draw a progress bar.
    """
    start = time.perf_counter()
    arr = as_lengths(lengths)
    order, desc = _sorted_desc(arr)
    n = desc.size
    if n == 0:
        return OracleResult(makespan=0.0, lane=np.zeros(0, dtype=np.int8), states=0, topk=0.0, best_k=0)
    top = best_topk(arr, curve)
    found: list[LaneArray] = [(np.arange(n) < top.k).astype(np.int8)]
    budget = _Budget(max_states, None if max_seconds is None else start + max_seconds, on_step)
    lower = None
    try:
        _optimise(desc, marginal_tpot(curve, n), top.makespan, beam, budget, found)
    except _Exhausted as exc:
        lower = exc.lower
    values: list[float] = []
    lanes: list[LaneArray] = []
    for cand in found:  # re-evaluate with the reference formula so that makespan ≤ topk holds exactly
        lane = np.empty(n, dtype=np.int8)
        lane[order] = _relabel(cand)
        values.append(float(lane_makespans(arr, lane, 2, curve).max()))
        lanes.append(lane)
    best = int(np.argmin(values))  # first minimum: the top-k lanes win exact ties
    if lower is not None:
        upper = values[best]
        why = "time budget" if budget.deadline is not None and time.perf_counter() > budget.deadline else (
            f"state budget {max_states:,}")
        raise OracleBudgetError(
            f"exact oracle stopped ({why} exhausted after {budget.states:,} states); the optimum of these {n} "
            f"requests lies in [{min(lower, upper):.6g}, {upper:.6g}] s; use fewer requests or a larger budget",
            min(lower, upper), upper)
    return OracleResult(makespan=values[best], lane=lanes[best], states=budget.states, topk=values[0], best_k=top.k)
