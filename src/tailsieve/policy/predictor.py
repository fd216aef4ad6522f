"""Makespan predictor for the controller (§3.2, C.2): response-work history + the TPOT curve → T̂_tail, T̂_bulk.

Pure and deterministic (its resampling seed is fixed). Two histories: the lengths of recently consumed groups
(an (H, G) array; in steady state a consumed batch is an unbiased sample of the group-work distribution,
App. E) and the realised lengths of groups the tail pool regenerated (what a partial-rollout candidate really
costs once regenerated, selector noise included). The predictor draws K bootstrap pools and runs the all-admit
model with round-robin dispatch:

- tail pool: q candidate groups (drawn from the candidate history) on m replicas, all to completion;
- bulk pool: N fresh groups plus the E − q non-isolated candidates on R − m replicas, cut at the (N − q)-th
  group completion; with `PredictorFacts.pinned_candidates` (the router's redraw limit is 1, so every candidate was
  cut once and its next attempt must complete) the E − q candidates cannot be cut: the cutoff is the (N − E)-th
  completion among the fresh groups or the last pinned candidate's completion, whichever is later;
- uniform (0, 0): N fresh groups on all R replicas, group-atomic round-robin, all to completion.

The pools are drawn by `pools.py` (`draw_rows`, the candidate model `candidate_pools`); before any tail group has
been observed, candidates are modelled by split-half selection within the consumed groups (`split_half_candidates`).
Everything but the history comes in one frozen value, `PredictorFacts`.
T̂(q, m) is the mean over the K pools of max(c_tail·T_tail, c_bulk·T_bulk), so the step-to-step spread of the
tail is priced in (E[max] ≥ max E); c_tail, c_bulk are the controller's measured/predicted calibrations.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from tailsieve.model.curves import TpotCurve
from tailsieve.policy.lanes import group_completions, lane_prefill, round_robin_lanes
from tailsieve.policy.mean_field import MeanFieldPools, uniform_makespan
from tailsieve.policy.pools import (
    FloatArray,
    IntArray,
    candidate_pools,
    draw_rows,
    kv_floor,
    kv_floor_of,
    split_half_candidates,
)

__all__ = ["FloatArray", "IntArray", "Predictor", "PredictorFacts", "kv_floor", "kv_floor_of", "split_half_candidates"]

RESAMPLES = 12  # K bootstrap pools at N = 64; fewer for larger N (a big pool averages within itself), at least
# MIN_RESAMPLES: the step-to-step spread (a long pinned candidate now and then) needs a few pools even at N = 512
MIN_RESAMPLES = 4
MEAN_FIELD_REQUESTS = 65_536  # per-candidate request finishes (K·(N + E)·G) above which two-pool splits use the
# mean-field forecast (`policy.mean_field`) instead of the exact all-admit lanes
_SEED = 20260827  # fixed: the controller stays a pure function of its inputs


@dataclass(frozen=True, slots=True)
class PredictorFacts:
    """What the predictor prices a step on besides the history (`Controller.facts` builds it): the step shape, the
    pools' cost model, how the router places and pins groups, and the predictor's own resampling settings."""

    groups: int  # N
    extra: int  # E
    replicas: int  # R
    curve: TpotCurve  # the bulk pool's curve (every replica's at the uniform boundary)
    tail_curve: TpotCurve | None = None  # the tail pool's (§3.4: its own speculation; None: `curve`)
    by_request: bool = True  # two-pool steps deal requests round-robin (else whole groups)
    uniform_by_request: bool = False  # the uniform boundary deals requests (else whole groups)
    pinned_candidates: bool = False  # non-isolated candidates run pinned in the bulk pool (the router's max_redraws 1)
    kv_s_per_token: float = 0.0  # KV-traffic seconds per context token per iteration (0: the curve alone)
    prefill_s: float = 0.0  # seconds to prefill one prompt on one replica (`lane_prefill`)
    kv_tokens: int = 0  # a replica's KV capacity in tokens (`kv_floor`; 0: not priced)
    prompt_tokens: float = 0.0  # the prompts' mean tokens (the KV a request holds before decoding)
    resamples: int | None = None  # K bootstrap pools (None: by N, `RESAMPLES` at N = 64)
    mean_field: bool | None = None  # the mean-field forecast on or off (None: by size, `MEAN_FIELD_REQUESTS`)


class Predictor:
    """Forecasts T̂_tail(q, m) and T̂_bulk(N − q, R − m) from a history of consumed group lengths, the regenerated
    candidates seen (`candidates`; whole steps of them, in the selector's order: `candidate_steps`) and the history's
    rows per step (`blocks`: pool k drawn within step k mod H; None: pooled)."""

    def __init__(self, history: NDArray[np.int64], facts: PredictorFacts, *,
                 candidates: NDArray[np.int64] | None = None, candidate_steps: tuple[NDArray[np.int64], ...] = (),
                 blocks: tuple[int, ...] | None = None) -> None:
        if history.ndim != 2 or history.shape[0] == 0:
            raise ValueError("predictor needs a non-empty (H, G) history")
        f = self.facts = facts
        groups, extra = f.groups, f.extra
        self.n, self.e, self.r = groups, extra, f.replicas
        self.curve = f.curve  # the bulk pool's curve (every replica's at the uniform boundary)
        self.tail_curve = f.curve if f.tail_curve is None else f.tail_curve  # the tail pool's (§3.4)
        self.by_request = f.by_request
        self.kv = f.kv_s_per_token  # KV-traffic seconds per context token per iteration (0: the curve alone)
        self.pinned = f.pinned_candidates  # non-isolated candidates run pinned in the bulk pool (max_redraws = 1)
        self.prefill_s = f.prefill_s  # seconds to prefill one prompt on one replica (`lane_prefill`)
        self.uniform_by_request = f.uniform_by_request  # the uniform boundary deals requests (else whole groups)
        self.kv_tokens, self.prompt_tokens = f.kv_tokens, f.prompt_tokens  # the KV-pressure term (`kv_floor`; 0: off)
        self._cand_sum: FloatArray | None = None  # (K, E) decode tokens per candidate group (KV term)
        self._fresh_sum: FloatArray = np.zeros(0)  # (K,) decode tokens of the fresh groups (KV term)
        rng = np.random.default_rng(_SEED)
        auto = int(np.clip(round(RESAMPLES * 64 / groups), MIN_RESAMPLES, RESAMPLES))
        k = f.resamples if f.resamples is not None else auto
        fresh = history[draw_rows(history.shape[0], blocks, k, groups + extra, rng)].astype(np.float64)
        self.fresh = fresh[:, :groups]  # (K, N, G) in arrival order
        self.cand = candidate_pools(fresh, max(extra, 1), candidates, candidate_steps, rng)  # (K, E, G)
        work = k * (groups + extra) * history.shape[1]
        # mean field only under request dispatch (group-atomic lanes need the exact model; see policy.mean_field)
        self.large = work > MEAN_FIELD_REQUESTS if f.mean_field is None else f.mean_field
        self.use_mean_field = f.by_request and self.large
        self._uniform: dict[bool, FloatArray] = {}  # T_uniform per pool, by placement (request: True)
        self._return: dict[bool, FloatArray] = {}  # the first uniform step after a two-pool one, per pool
        self._mf: MeanFieldPools | None = None
        self._tail: dict[tuple[int, int], FloatArray] = {}
        self._bulk: dict[tuple[int, int], FloatArray] = {}
        self._bulk_t: dict[tuple[int, int], FloatArray] = {}
        self._bulk_f: dict[tuple[int, int], FloatArray] = {}  # mean field: the bulk pool's F (K, U), prefill included

    def _cands(self, lo: int, hi: int) -> FloatArray:
        """Candidates lo..hi−1 of every pool (cycling when q exceeds the candidate width)."""
        out: FloatArray = self.cand[:, self._cand_idx(lo, hi)]
        return out

    def _cand_idx(self, lo: int, hi: int) -> IntArray:
        out: IntArray = np.arange(lo, hi) % self.cand.shape[1]
        return out

    @property
    def mean_field(self) -> MeanFieldPools:
        """The pools on the lengths grid (built on first use)."""
        if self._mf is None:
            self._mf = MeanFieldPools(self.fresh, self.cand)
        return self._mf

    def prefetch(self, qs: Iterable[int], m: int) -> None:
        """Forecast the bulk pool of the splits (q, m) for every q in `qs` at once (mean field only: one pass over
        the lengths grid for all of them); later `bulk_times` calls find them cached. Exact forecasts: nothing."""
        if not (self.use_mean_field and m > 0):
            return
        self._mf_bulk(sorted(q for q in set(qs) if (q, m) not in self._bulk_f), m)

    def _mf_bulk(self, qs: list[int], m: int) -> None:
        """Mean-field finish curve F (K, U) of the bulk pool on R − m replicas for every q in `qs`
        (`MeanFieldPools.bulk_finish`), prefill included: a group completes at F of its longest member."""
        if qs:
            f = self.mean_field.bulk_finish(qs, self.e, self.r - m, self.curve, self.kv)
            for j, q in enumerate(qs):
                self._bulk_f[(q, m)] = f[j] + self._mf_prefill(max(self.e - q, 0) + self.n, self.r - m)

    def _bulk_finish(self, q: int, m: int) -> FloatArray:
        """The bulk pool's mean-field F at (q, m) (`_mf_bulk`), computed on first use."""
        if (q, m) not in self._bulk_f:
            self._mf_bulk([q], m)
        return self._bulk_f[(q, m)]

    def _mf_prefill(self, p: int, n_lanes: int) -> float:
        """The mean field's prefill term: the mean lane's prefill seconds for P groups dealt by request."""
        if self.prefill_s <= 0 or p <= 0:
            return 0.0
        lanes = round_robin_lanes(p, self.fresh.shape[2], n_lanes, True)
        return float(lane_prefill(lanes, n_lanes, self.prefill_s).mean())

    def tail_times(self, q: int, m: int) -> FloatArray:
        """(K,) T_tail of q candidate groups on m replicas, run to completion: the exact per-lane sums (§2.1), which
        cost no finish times, so the mean field is never needed here (it prices the mean lane, and the tail pool
        waits for its slowest: 10% short at q = 150 on 34 replicas)."""
        if q <= 0 or m <= 0:
            return np.zeros(self.fresh.shape[0])
        key = (q, m)
        if key not in self._tail:
            tot, cnt = self._totals(0, q) if self.kv_tokens > 0 else (np.zeros(0), 0)
            self._tail[key] = self._kv(self._run_out(self._cands(0, q), m, self.tail_curve, self.by_request), tot,
                                       cnt, m, self.tail_curve)
        return self._tail[key]

    def _kv(self, times: FloatArray, total: FloatArray, count: int, n_lanes: int, curve: TpotCurve,
            share: float = 1.0) -> FloatArray:
        """`times` raised to the pool's KV-bound floor (`kv_floor_of`: its total tokens, its requests) when the KV
        capacity is known; `share`: the part of the pool's work done by its cut."""
        if self.kv_tokens <= 0 or n_lanes <= 0:
            return times
        floor = kv_floor_of(total, count, n_lanes, curve, self.kv_tokens, self.prompt_tokens)
        out: FloatArray = np.maximum(times, share * floor)
        return out

    def _totals(self, lo: int, hi: int) -> tuple[FloatArray, int]:
        """(K,) decode tokens of candidates lo..hi plus, for `hi` < 0, none; and their request count."""
        if self._cand_sum is None:
            self._cand_sum = self.cand.sum(axis=2)
            self._fresh_sum = self.fresh.sum(axis=(1, 2))
        idx = self._cand_idx(lo, hi)
        return self._cand_sum[:, idx].sum(axis=1), idx.size * self.cand.shape[2]

    def _bulk_raw(self, q: int, m: int) -> FloatArray:
        """(K, P) completion times of the bulk pool's groups in queue order: the E − q non-isolated candidates
        first (the router puts them at the front), then the N fresh groups (uniform: N groups on R replicas)."""
        key = (q, m)
        if key not in self._bulk_t and m > 0 and self.use_mean_field:
            mf = self.mean_field
            longest = np.concatenate((mf.cand_gmax[:, self._cand_idx(q, max(q, self.e))], mf.fresh_gmax), axis=1)
            self._bulk_t[key] = np.take_along_axis(self._bulk_finish(q, m), longest, axis=1)
        if key not in self._bulk_t:
            pools = self.fresh if m == 0 else np.concatenate((self._cands(q, max(q, self.e)), self.fresh), axis=1)
            by_request = self.uniform_by_request if m == 0 else self.by_request
            self._bulk_t[key] = group_completions(pools, self.r - m, self.curve, by_request, self.kv, self.prefill_s)
        return self._bulk_t[key]

    def bulk_completions(self, q: int, m: int) -> FloatArray:
        """(K, P) sorted completion times of the bulk pool's groups (uniform: N groups on R replicas)."""
        key = (q, m)
        if key not in self._bulk:
            self._bulk[key] = np.sort(self._bulk_raw(q, m), axis=1)
        return self._bulk[key]

    def bulk_times(self, q: int, m: int) -> FloatArray:
        """(K,) T_bulk (`_bulk_times`), raised to the bulk pool's KV-bound floor for the share of its work done by
        the cut (the quota over the pool's groups) when the KV capacity is known."""
        out = self._bulk_times(q, m)
        if self.kv_tokens <= 0 or m == 0:
            return out
        tot, cnt = self._totals(q, max(q, self.e))
        groups = cnt // max(self.fresh.shape[2], 1) + self.fresh.shape[1]
        return self._kv(out, tot + self._fresh_sum, cnt + self.fresh.shape[1] * self.fresh.shape[2], self.r - m,
                        self.curve, min(1.0, max(self.n - q, 0) / max(groups, 1)))

    def _bulk_times(self, q: int, m: int) -> FloatArray:
        """(K,) T_bulk: the (N − q)-th bulk completion (uniform: the last of N). With pinned candidates the
        E − q non-isolated ones must complete: the later of their last completion and the (N − E)-th fresh one
        (pessimistic: a pinned request keeps its all-admit finish, not sped up by the aborts at the cutoff)."""
        if m == 0:
            return self.uniform_times()
        quota = self.n - q if m > 0 else self.n
        if quota <= 0:
            return np.zeros(self.fresh.shape[0])
        pins = max(self.e - q, 0) if m > 0 and self.pinned else 0
        if pins == 0:  # the quota-th completion: a partition, not a sort (the same value)
            if (q, m) in self._bulk:
                return self._bulk[(q, m)][:, quota - 1]
            return np.partition(self._bulk_raw(q, m), quota - 1, axis=1)[:, quota - 1]
        rest = quota - pins
        if self.use_mean_field:  # F is non-decreasing: the last pinned candidate and the cut are F at grid indices
            f, mf = self._bulk_finish(q, m), self.mean_field
            last_pin: FloatArray = np.take_along_axis(f, mf.cand_suffix_max[:, q : q + 1], axis=1)[:, 0]
            if rest <= 0:
                return last_pin
            cut = np.take_along_axis(f, mf.fresh_sorted[:, rest - 1 : rest], axis=1)[:, 0]
            return np.maximum(cut, last_pin)
        raw = self._bulk_raw(q, m)
        last_pin = raw[:, :pins].max(axis=1)
        if rest <= 0:
            return last_pin
        cut = np.partition(raw[:, pins:], rest - 1, axis=1)[:, rest - 1]
        out: FloatArray = np.maximum(cut, last_pin)
        return out

    def uniform_times(self, by_request: bool | None = None) -> FloatArray:
        """(K,) makespan of a uniform step (0, 0): N fresh groups on all R replicas, run to completion, dealt by
        request or by whole group (default: the predictor's `uniform_by_request`), prefill per distinct prompt per
        replica included."""
        dealt = self.uniform_by_request if by_request is None else by_request
        if dealt not in self._uniform:
            k, p, g = self.fresh.shape
            self._uniform[dealt] = self._kv(self._uniform_makespan(self.fresh, dealt),
                                            self.fresh.reshape(k, -1).sum(axis=1), p * g, self.r, self.curve)
        return self._uniform[dealt]

    def _uniform_makespan(self, pools: FloatArray, by_request: bool) -> FloatArray:
        """The last completion of `pools` run to the end on all R replicas (`_run_out`)."""
        return self._run_out(pools, self.r, self.curve, by_request)

    def _run_out(self, pools: FloatArray, n_lanes: int, curve: TpotCurve, by_request: bool) -> FloatArray:
        """(K,) the last completion of `pools` run to the end on `n_lanes` replicas: per-lane sums over sorted
        lengths, no finish times (`mean_field.uniform_makespan`); dealt by request, each request is a one-member
        group dealt round-robin (request k of the pool to lane k mod L), the prefill priced on the groups' lanes."""
        k, p, g = pools.shape
        lanes = round_robin_lanes(p, g, n_lanes, by_request)
        dealt = pools.reshape(k, p * g, 1) if by_request else pools
        return uniform_makespan(dealt, n_lanes, curve, self.kv, lane_prefill(lanes, n_lanes, self.prefill_s))

    def uniform_return_times(self, by_request: bool | None = None) -> FloatArray:
        """(K,) makespan of the first uniform step after a two-pool step: the E waiting candidates rejoin the front
        of the queue and run to completion with N − E fresh groups on all R replicas (`Router.plan` at m = 0). Its
        excess over `uniform_times` is the one-time price of returning to uniform."""
        dealt = self.uniform_by_request if by_request is None else by_request
        if dealt not in self._return:
            e = min(self.e, self.n)
            pools = np.concatenate((self._cands(0, e), self.fresh[:, : self.n - e]), axis=1)
            k, p, g = pools.shape
            self._return[dealt] = self._kv(self._uniform_makespan(pools, dealt), pools.reshape(k, -1).sum(axis=1),
                                           p * g, self.r, self.curve)
        return self._return[dealt]

    def split_times(self, q: int, m: int, calib_tail: float = 1.0, calib_bulk: float = 1.0) -> FloatArray:
        """(K,) makespan of a two-pool step (m > 0) per resampled pool: max(c_tail·T_tail, c_bulk·T_bulk)."""
        out: FloatArray = np.maximum(self.tail_times(q, m) * calib_tail, self.bulk_times(q, m) * calib_bulk)
        return out

    def makespan(self, q: int, m: int, calib_tail: float = 1.0, calib_bulk: float = 1.0) -> float:
        """T̂(q, m) = E[max(c_tail·T_tail, c_bulk·T_bulk)] over the resampled pools (§3.2)."""
        if m == 0:
            return float(np.mean(self.bulk_times(0, 0))) * calib_bulk
        return float(np.mean(self.split_times(q, m, calib_tail, calib_bulk)))

    def tail_capacity(self, deadline: float, m: int, q_max: int) -> int:
        """G_tail of C.2: the largest q ≤ q_max whose tail pool on m replicas finishes by `deadline` (mean pool).
        A scan from q = 1 up to the first q that misses; on large fleets a bisection (T_tail grows with q when τ
        does: a lane only gains requests)."""
        def fits(q: int) -> bool:
            return float(np.mean(self.tail_times(q, m))) <= deadline

        if self.large:
            lo, hi = 0, q_max  # fits(lo) holds (q = 0 is free); find the last q that fits
            while lo < hi:
                mid = (lo + hi + 1) // 2
                lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
            return lo
        best = 0
        for q in range(1, q_max + 1):
            if fits(q):
                best = q
            else:
                break
        return best

    def bulk_capacity(self, deadline: float, q: int, m: int) -> int:
        """Bulk groups the pool of R − m replicas completes by `deadline` (mean over pools)."""
        comp = self.bulk_completions(q, m)
        return round(float(np.mean((comp <= deadline).sum(axis=1))))
