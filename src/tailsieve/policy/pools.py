"""The predictor's bootstrap pools (§3.2, App. E): which history rows a pool draws (`draw_rows`, by history step), the
candidate model (`candidate_pools`: rank r from a step seen regenerated, else the regenerated groups seen, else the
split-half prior `split_half_candidates`), and the KV-bound floor of a pool (`kv_floor`). Pure functions of their
inputs and the generator passed in; `predictor.Predictor` composes them."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from tailsieve.model.curves import TpotCurve

__all__ = ["FloatArray", "IntArray", "candidate_pools", "draw_rows", "kv_floor", "kv_floor_of", "split_half_candidates"]

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]


def kv_floor(pools: FloatArray, n_lanes: int, curve: TpotCurve, kv_tokens: int, prompt_tokens: float) -> FloatArray:
    """(K,) seconds a pool of requests (`pools`: (K, P, G) decode lengths) needs on `n_lanes` replicas when each holds
    `kv_tokens` of KV: at most b = kv_tokens / (prompt + mean length / 2) requests decode at once (a request's mean
    context over its life), so the pool's Σ L tokens take at least Σ L / n_lanes · τ(b)/b (throughput-bound; b is
    at most the requests per replica, where the floor is the all-admit engine's own). The KV-pressure term of a
    split: a tail pool of m replicas holding the longest requests, a bulk pool that may overflow (issue 48)."""
    k, p, g = pools.shape
    return kv_floor_of(pools.reshape(k, -1).sum(axis=1), p * g, n_lanes, curve, kv_tokens, prompt_tokens)


def kv_floor_of(total: FloatArray, count: int, n_lanes: int, curve: TpotCurve, kv_tokens: int,
                prompt_tokens: float) -> FloatArray:
    """`kv_floor` from each pool's total decode tokens and its request count."""
    if count == 0:
        return np.zeros_like(total)
    ctx = prompt_tokens + total / count / 2.0 + 1.0
    b = np.clip(kv_tokens / ctx, 1.0, max(count / n_lanes, 1.0))
    tau = curve.table(int(np.ceil(b.max())) + 1)
    lo = np.floor(b).astype(np.int64)
    t_b = tau[lo] + (b - lo) * (tau[np.minimum(lo + 1, tau.size - 1)] - tau[lo])  # τ interpolated at b
    out: FloatArray = total / n_lanes * t_b / b
    return out


def split_half_candidates(pools: FloatArray, width: int) -> FloatArray:
    """Candidates before any tail was observed: select on one half of each group, regenerate with the other.

    A group's members are independent generations of one prompt, so ranking a pool by the longest member of the
    first half and taking the second half (tiled to G) as the regenerated lengths models the selector's noise
    and the regression to the mean of a fresh regeneration. With G = 1 the selection is on the group itself.
    """
    g = pools.shape[2]
    if g < 2:
        score, regen = pools.max(axis=2), pools
    else:
        h = g // 2
        score = pools[:, :, :h].max(axis=2)
        second = pools[:, :, h:]
        regen = np.concatenate([second] * (g // second.shape[2] + 1), axis=2)[:, :, :g]
    rank = np.argsort(-score, axis=1, kind="stable")[:, :width]
    out: FloatArray = np.take_along_axis(regen, rank[:, :, None], axis=1)
    return out


def candidate_pools(fresh: FloatArray, width: int, candidates: NDArray[np.int64] | None,
                candidate_steps: tuple[NDArray[np.int64], ...], rng: np.random.Generator) -> FloatArray:
    """(K, E, G) candidate pools, likeliest tail first: rank r of a pool from rank r of a random whole step seen
    regenerated (two such steps at least); else draws from the regenerated groups seen (mixed with the split-half
    prior while there are few), sorted by their longest member."""
    k, g = fresh.shape[0], fresh.shape[2]
    full = [c for c in candidate_steps if c.shape[0] >= width]
    if len(full) >= 2:  # whole steps' candidates seen regenerated, in the selector's order: bootstrap by rank
        rows = np.stack([c[:width] for c in full]).astype(np.float64)  # (S, E, G)
        pick = rng.integers(0, rows.shape[0], size=(k, width))
        by_rank: FloatArray = rows[pick, np.arange(width)[None, :]]  # rank r of pool k from a random step's rank r
        return by_rank
    prior = split_half_candidates(fresh, width)
    obs = np.zeros((0, g), np.float64) if candidates is None else candidates.astype(np.float64)
    seen = obs.shape[0]
    if seen >= 2 * width:  # enough regenerated tail groups observed: use them alone
        cand = obs[rng.integers(0, seen, size=(k, width))]
    elif seen > 0:  # few observations: mix them with the split-half prior
        both = np.concatenate((np.broadcast_to(obs, (k, *obs.shape)), prior), axis=1)
        pick = rng.integers(0, both.shape[1], size=(k, width))
        cand = np.take_along_axis(both, pick[:, :, None], axis=1)
    else:
        cand = prior
    rank = np.argsort(-cand.max(axis=2), axis=1, kind="stable")
    out: FloatArray = np.take_along_axis(cand, rank[:, :, None], axis=1)
    return out


def draw_rows(rows: int, blocks: tuple[int, ...] | None, k: int, width: int,
               rng: np.random.Generator) -> IntArray:
    """(K', width) history rows of the bootstrap pools. Pooled (`blocks` None): any rows, with replacement. By step
    (`blocks`: the history's rows per step, in order): pool k holds step k mod H's own groups, K' = K rounded up to
    whole rounds of the H steps, in a random order and without replacement up to the step's size (a step of N groups
    gives a pool of N fresh groups that is that step's realized work), the rows past it drawn with replacement.
    With replacement throughout, a pool missed a step's one capped group a third of the time (1 − 1/e), and a
    uniform step forecast from such pools ran 20% short on synthetic-math; pooled draws mix the steps' prompts."""
    if not blocks or sum(blocks) != rows or min(blocks) <= 0:
        out: IntArray = rng.integers(0, rows, size=(k, width))
        return out
    h = len(blocks)
    k = -(-k // h) * h
    start = np.concatenate(([0], np.cumsum(blocks)[:-1]))
    drawn = np.empty((k, width), np.int64)
    for i in range(k):
        size = blocks[i % h]
        order = rng.permutation(size)
        if width > size:
            order = np.concatenate((order, rng.integers(0, size, width - size)))
        drawn[i] = start[i % h] + order[:width]
    return drawn
