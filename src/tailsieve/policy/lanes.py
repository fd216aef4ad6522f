"""The all-admit lane model (§2.1) the predictor and the observed-step models share: every request's finish time on
its lane, the round-robin placement of a pool (§3.1), the prefill a placement pays per distinct prompt per replica,
and the completion time of each group of many pools at once."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from tailsieve.model.curves import TpotCurve
from tailsieve.model.makespan import lane_order

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]

__all__ = ["group_completions", "lane_finish_times", "lane_prefill", "round_robin_lanes"]


def lane_finish_times(lengths: FloatArray, lanes: IntArray, n_lanes: int, curve: TpotCurve,
                      kv_s_per_token: float = 0.0) -> FloatArray:
    """All-admit finish time of every request (§2.1) on its lane, for many lanes at once. With a KV-traffic term
    (`ReplicaConfig.kv_ms_per_1k_tokens`) an iteration also costs kv·(tokens generated so far by the running
    requests): b requests going from x = a to c add kv·b·(a + c − 1)(c − a)/2 (prompts not counted)."""
    if lengths.size == 0:
        return np.zeros(0)
    order = lane_order(lengths, lanes, n_lanes)
    ln = lanes[order]
    ls = lengths[order]
    counts = np.bincount(ln, minlength=n_lanes)
    ends = np.cumsum(counts)
    starts = ends - counts  # each lane's first position in the sorted order
    prev = np.empty_like(ls, dtype=np.result_type(ls.dtype, 0.0))  # the next shorter length on the lane (0: none)
    prev[1:] = ls[:-1]
    prev[starts[counts > 0]] = 0.0
    b = ends[ln] - np.arange(ls.size)  # requests running while this one finishes its last stretch
    tau = curve.table(int(counts.max()))
    seg = tau[b] * (ls - prev)
    if kv_s_per_token > 0:
        seg = seg + kv_s_per_token * b * (prev + ls - 1) * (ls - prev) / 2.0
    csum = np.cumsum(seg)
    base = np.where(starts > 0, csum[np.maximum(starts - 1, 0)], 0.0)  # the cumulative sum before each lane
    out = np.empty_like(ls)
    out[order] = csum - base[ln]
    return out


def round_robin_lanes(p: int, g: int, n_lanes: int, by_request: bool) -> IntArray:
    """(P, G) lane of every request of P groups of G dealt round-robin (§3.1): request k of the pool to lane
    k mod L (by request), or group i to lane i mod L (by group), as `Router.plan` places them."""
    if n_lanes < 1:  # a pool of no replicas (m = R or m = 0 for a tail pool) is a caller's error, not a forecast
        raise ValueError(f"round_robin_lanes: n_lanes must be >= 1, got {n_lanes}")
    if by_request:
        out: IntArray = (np.arange(p * g) % n_lanes).reshape(p, g)
        return out
    return np.repeat((np.arange(p) % n_lanes)[:, None], g, axis=1)


def lane_prefill(lanes: IntArray, n_lanes: int, prefill_s: float) -> FloatArray:
    """(n_lanes,) prefill seconds each lane pays for the (P, G) placement `lanes`: one prompt prefill per group per
    replica it reaches (prefix caching shares it among a group's requests on one replica; a group dealt over k
    replicas pays it k times). Paid at admission, before decoding: it delays every finish on its lane."""
    if prefill_s <= 0 or lanes.size == 0:
        return np.zeros(n_lanes)
    rows = np.sort(lanes, axis=1)  # a group's distinct lanes: where its sorted row changes (G is small)
    first = np.ones(rows.shape, dtype=bool)
    first[:, 1:] = rows[:, 1:] != rows[:, :-1]
    out: FloatArray = np.bincount(rows[first], minlength=n_lanes).astype(np.float64) * prefill_s
    return out


def group_completions(pools: FloatArray, n_lanes: int, curve: TpotCurve, by_request: bool,
                      kv_s_per_token: float = 0.0, prefill_s: float = 0.0) -> FloatArray:
    """(K, P) completion time of each group of K independent pools of P groups, round-robin over `n_lanes` each
    (`prefill_s`: seconds per distinct prompt per lane, `lane_prefill`)."""
    k, p, g = pools.shape
    if p == 0:
        return np.zeros((k, 0))
    lane = round_robin_lanes(p, g, n_lanes, by_request)
    lanes = (lane[None, :, :] + n_lanes * np.arange(k)[:, None, None]).ravel()
    fin = lane_finish_times(pools.ravel(), lanes.astype(np.int64), n_lanes * k, curve, kv_s_per_token)
    if prefill_s > 0:
        fin = fin + np.tile(lane_prefill(lane, n_lanes, prefill_s)[lane.ravel()], k)
    out: FloatArray = fin.reshape(k, p, g).max(axis=2)
    return out
