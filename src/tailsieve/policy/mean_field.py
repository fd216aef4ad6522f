"""Mean-field pool forecast for large fleets (§3.2 at cluster scale): group completion times without per-lane sorts.

The exact predictor (`predictor.group_completions`) runs the all-admit model (§2.1) on every lane of every
resampled pool: O(P·G log) work per candidate (q, m), about 12 ms per candidate at N = 4096, G = 16, R = 512, far
over a 50 ms decision. With round-robin *request* dispatch each lane holds n = P·G / L requests drawn from the same
pool, so when n is large the number of requests running on a lane at iteration t concentrates at its mean. A request
of length ℓ then finishes at

    F(ℓ) = Σ_{t<ℓ} τ(b(t)),   b(t) = 1 + (n − 1)·S(t),

where S(t) is the share of the pool's other requests still running at t (length > t) and τ is interpolated between
integer batch sizes; the KV term adds kv·b(t)·t per iteration, as in `lane_finish_times`. F is increasing, so a
group completes at F(longest member). On the lengths grid the sum is one cumulative sum, and a candidate (q, m)
costs a bincount of the candidate groups it moves plus a few passes over the grid (about 0.3 ms at that scale).

What it misses: the lane-to-lane spread (a lane that drew several long requests finishes late). Measured on the
KodCode trace at N = 4096, G = 16, R = 512 it forecasts the bulk pool 3–8% early; it is used for the bulk pool's
cutoff only (the tail pool and the uniform boundary run to completion and are priced exactly by per-lane sums,
`Predictor._run_out`), and not for pinned candidates, whose last completion is a lane maximum
(`Controller.best_q`). Group-atomic lanes (uniform, `Dispatch.GROUP`) put G correlated requests on one lane, where
the spread dominates, so those stay exact (`Predictor.use_mean_field`).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from tailsieve.model.curves import TpotCurve

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]

GRID_POINTS = 1024  # the lengths grid: 0..max when that is at most this many tokens, else this many equal bins


def uniform_makespan(pools: FloatArray, n_lanes: int, curve: TpotCurve, kv_s_per_token: float = 0.0,
                     lane_offset_s: FloatArray | None = None) -> FloatArray:
    """(K,) all-admit makespan of K pools of (P, G) groups dealt group-atomically round-robin (group p → lane
    p mod L) and run to completion: max over lanes of Σ_j (L_(j) − L_(j+1))·[τ(j) + kv·j·(L_(j) + L_(j+1) − 1)/2]
    with each lane's lengths sorted descending (App. D; the KV term as `lane_finish_times`), plus each lane's
    `lane_offset_s` (its prefill seconds, `predictor.lane_prefill`) when given."""
    k, p, g = pools.shape
    if p == 0:
        return np.zeros(k)
    per = -(-p // n_lanes)  # groups per lane, the last lanes padded with empty (length-0) groups
    padded = np.zeros((k, per * n_lanes, g))
    padded[:, :p] = pools
    lanes = padded.reshape(k, per, n_lanes, g).transpose(0, 2, 1, 3).reshape(k, n_lanes, per * g)
    desc = _descending(lanes)
    if kv_s_per_token > 0:
        nxt = np.concatenate((desc[:, :, 1:], np.zeros((k, n_lanes, 1))), axis=2)
        j = np.arange(1, per * g + 1, dtype=np.float64)
        seg = (desc - nxt) * curve.table(per * g)[1:]
        seg = seg + kv_s_per_token * j * (desc + nxt - 1.0) * (desc - nxt) / 2.0
    else:  # (L_(j) − L_(j+1))·τ(j) in one buffer: fewer large arrays (their page faults cost more than the arithmetic)
        seg = np.empty_like(desc)
        seg[:, :, :-1] = desc[:, :, 1:]
        seg[:, :, -1] = 0.0
        np.subtract(desc, seg, out=seg)
        np.multiply(seg, curve.table(per * g)[1:], out=seg)
    per_lane = seg.sum(axis=2)
    if lane_offset_s is not None:
        per_lane = per_lane + lane_offset_s[None, :]
    out: FloatArray = per_lane.max(axis=1)
    return out


def _descending(lanes: FloatArray) -> FloatArray:
    """`-np.sort(-lanes, axis=2)` (each lane's lengths, longest first), in the memory layout that expression gives
    (the layout fixes the order of the sums over it), sorted along contiguous rows: the same floats, faster."""
    rows = lanes if lanes.flags.c_contiguous else np.ascontiguousarray(lanes)
    rows.sort(axis=2)  # in place: `lanes` is the caller's own padded copy (or a view of it)
    out = np.empty_like(lanes)
    out[...] = rows[:, :, ::-1]
    return out


class MeanFieldPools:
    """Grid-indexed copy of the predictor's resampled pools: fresh groups (K, N, G) and candidates (K, W, G)."""

    def __init__(self, fresh: FloatArray, cand: FloatArray) -> None:
        self.k = fresh.shape[0]
        top = float(max(fresh.max(initial=0.0), cand.max(initial=0.0)))
        integral = all(bool(np.all(x == np.floor(x))) for x in (fresh, cand))
        # token counts up to GRID_POINTS: the grid is 0..max itself; otherwise GRID_POINTS equal bins, a length
        # rounded up to its bin's top (at most max/GRID_POINTS tokens: 16 at a 16k cap)
        width = 1.0 if integral and top <= GRID_POINTS else max(top, 1.0) / GRID_POINTS
        n_bins = int(np.ceil(top / width - 1e-9)) + 1
        self.grid = np.arange(n_bins, dtype=np.float64) * width
        f_idx = np.minimum(np.ceil(fresh / width - 1e-9), n_bins - 1).astype(np.int64)
        c_idx = np.minimum(np.ceil(cand / width - 1e-9), n_bins - 1).astype(np.int64)
        u = self.grid.size
        self.fresh_gmax = f_idx.max(axis=2)  # (K, N) grid index of each group's longest member
        self.cand_idx = c_idx  # (K, W, G)
        self.cand_gmax = c_idx.max(axis=2)  # (K, W)
        offs = (np.arange(self.k) * u)[:, None]
        self.fresh_counts = np.bincount((f_idx.reshape(self.k, -1) + offs).ravel(),
                                        minlength=self.k * u).reshape(self.k, u)
        self._offs = offs
        w = c_idx.shape[1]
        self.width = w
        # the longest member of candidates r..W−1 (suffix), and the fresh groups' longest members in order: F is
        # non-decreasing, so a pool's last pinned completion and its k-th are F at these grid indices
        self.cand_suffix_max = (np.maximum.accumulate(self.cand_gmax[:, ::-1], axis=1)[:, ::-1] if w
                                else self.cand_gmax)
        self.fresh_sorted = np.sort(self.fresh_gmax, axis=1)
        self._prefix: dict[int, IntArray] = {0: np.zeros((self.k, u), np.int64)}
        self._running: dict[tuple[str, int, int], tuple[FloatArray, FloatArray]] = {}

    def cand_counts(self, idxs: list[IntArray]) -> IntArray:
        """(Q, K, U): for each candidate list in `idxs` (positions in the candidate list), how many of its members
        have each grid length, per pool (one bincount for all)."""
        u, k = self.grid.size, self.k
        sel = [self.cand_idx[:, idx].reshape(k, -1) + self._offs + j * k * u for j, idx in enumerate(idxs)]
        flat = np.concatenate([x.ravel() for x in sel]) if sel else np.zeros(0, np.int64)
        out: IntArray = np.bincount(flat, minlength=len(idxs) * k * u).reshape(len(idxs), k, u)
        return out

    def prefix_counts(self, q: int) -> IntArray:
        """(K, U) member length counts of candidates 0..q − 1 (cycling past the width W, as `Predictor._cand_idx`),
        cached: a new q only counts the candidates past the nearest cached one below it."""
        w = self.width
        if w == 0:
            return self._prefix[0]
        full, part = divmod(q, w)
        return full * self._at(w) + self._at(part) if full else self._at(part)

    def _at(self, r: int) -> IntArray:
        if r not in self._prefix:
            base = max(c for c in self._prefix if c < r)
            self._prefix[r] = self._prefix[base] + self.cand_counts([np.arange(base, r)])[0]
        return self._prefix[r]

    def finish(self, counts: IntArray, n_lanes: int, curve: TpotCurve, kv_s_per_token: float) -> FloatArray:
        """F(ℓ) for every grid length ℓ (last axis) of each pool of length counts (any leading shape) on `n_lanes`
        lanes (see the module docstring)."""
        return self.finish_from(*self.running(counts), n_lanes, curve, kv_s_per_token)

    @staticmethod
    def running(counts: IntArray) -> tuple[FloatArray, FloatArray]:
        """The part of F that does not depend on the lane count: each pool's requests and S(t), the share of its
        other requests still running at each grid length (a pool scored on several pool sizes computes it once)."""
        tot = counts.sum(axis=-1, keepdims=True).astype(np.float64)
        ge = np.cumsum(counts[..., ::-1], axis=-1)[..., ::-1].astype(np.float64)  # requests with length ≥ grid[j]
        share: FloatArray = np.clip((ge - 1.0) / np.maximum(tot - 1.0, 1.0), 0.0, 1.0)
        return tot, share

    def pool_running(self, keys: list[tuple[str, int]], extra: int) -> tuple[FloatArray, FloatArray]:
        """`running` of the tail pool at q (("tail", q): candidates 0..q − 1) or of the bulk pool at q (("bulk", q):
        candidates q..E − 1 and the fresh groups), stacked over `keys`; cached per key, since it does not depend on
        the lane count: an m scan that scores one q grid at every pool size computes it once."""
        for kind, q in keys:
            if (kind, q, extra) not in self._running:
                counts = (self.prefix_counts(q) if kind == "tail" else self.fresh_counts
                          + (self.prefix_counts(extra) - self.prefix_counts(q) if q < extra else 0))
                self._running[(kind, q, extra)] = self.running(counts)
        tot = np.stack([self._running[(kind, q, extra)][0] for kind, q in keys])
        share = np.stack([self._running[(kind, q, extra)][1] for kind, q in keys])
        return tot, share

    def bulk_finish(self, qs: list[int], extra: int, n_lanes: int, curve: TpotCurve,
                    kv_s_per_token: float) -> FloatArray:
        """(Q, K, U) F of the bulk pool at each q in `qs` (the candidates q..E − 1 and the fresh groups) on
        `n_lanes` lanes."""
        return self.finish_from(*self.pool_running([("bulk", q) for q in qs], extra), n_lanes, curve, kv_s_per_token)

    def finish_from(self, tot: FloatArray, share: FloatArray, n_lanes: int, curve: TpotCurve,
                    kv_s_per_token: float) -> FloatArray:
        """`finish` from `running`'s requests and running share."""
        per_lane = tot / n_lanes
        b = 1.0 + np.maximum(per_lane - 1.0, 0.0) * share
        tab = curve.table(int(np.ceil(b.max())) + 1)
        lo = np.floor(b).astype(np.int64)
        frac = b - lo
        tau = tab[lo] * (1.0 - frac) + tab[lo + 1] * frac
        prev = np.concatenate(([0.0], self.grid[:-1]))
        step = self.grid - prev
        seg = tau * step
        if kv_s_per_token > 0:
            seg = seg + kv_s_per_token * b * (prev + self.grid - 1.0) * step / 2.0
        out: FloatArray = np.cumsum(seg, axis=-1)
        return out

    def completions(self, cand_idx: IntArray, with_fresh: bool, n_lanes: int, curve: TpotCurve,
                    kv_s_per_token: float) -> FloatArray:
        """(K, P) completion times of the candidate groups `cand_idx` (then the fresh groups when `with_fresh`) in
        queue order, all in one pool on `n_lanes` lanes with request dispatch."""
        return self.completions_many([cand_idx], with_fresh, n_lanes, curve, kv_s_per_token)[0]

    def completions_many(self, cand_idxs: list[IntArray], with_fresh: bool, n_lanes: int, curve: TpotCurve,
                         kv_s_per_token: float) -> list[FloatArray]:
        """`completions` for several candidate lists at once (one pass over the grid for all of them)."""
        if not cand_idxs:
            return []
        counts = self.cand_counts(cand_idxs)
        if with_fresh:
            counts = counts + self.fresh_counts[None]
        f = self.finish(counts, n_lanes, curve, kv_s_per_token)
        out: list[FloatArray] = []
        for j, idx in enumerate(cand_idxs):
            gmax = self.cand_gmax[:, idx]
            if with_fresh:
                gmax = np.concatenate((gmax, self.fresh_gmax), axis=1)
            out.append(np.take_along_axis(f[j], gmax, axis=1) if gmax.shape[1] else np.zeros((self.k, 0)))
        return out
