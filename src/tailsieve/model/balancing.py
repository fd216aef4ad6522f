"""Pairwise improvement of a bin assignment (the Uniform and Seer Oracles of App. A.2, after LPT).

`improve` repeatedly moves or swaps one item out of the heaviest bin a (load l_a) into a lighter bin b (load l_b):
a pair (x from a, y from b or nothing) with d = w_x − w_y > 0 leaves max(l_a − d, l_b + d) as the pair's larger load,
and the round takes the pair minimising it (first lighter bin, then first x, then first y in index order, as the
exhaustive scan does). Per bin that minimum sits at the weights nearest w_y = w_x − (l_a − l_b)/2, so a round
searches one sorted (bin, weight) array instead of scanning every bin: O(|a|·R·log n + n) per round instead of
O(R·n + Σ_b |a|·|b|).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

from tailsieve.errors import ConfigError

IntArray = NDArray[np.int64]

MAX_IMPROVE_ROUNDS = 100_000
_PROBE = 8  # lightest bins searched first for a value that prunes the others


def _pair_max(wx: IntArray, wy: IntArray, la: int, lb: IntArray) -> IntArray:
    """Larger of the two loads after moving x out of bin a and y (weight 0: nothing) in, or l_a if d ≤ 0."""
    d = wx - wy
    return np.asarray(np.where(d > 0, np.maximum(la - d, lb + d), la), dtype=np.int64)


def pair_values(w: IntArray, xs: IntArray, bins: IntArray, loads: IntArray, keys: IntArray, span: int,
                la: int) -> IntArray:
    """Best pair maximum per (x in `xs`, bin in `bins`): the bin's weights nearest w_x − (l_a − l_b)/2, (X, B)."""
    lb = loads[bins][None, :]
    wx = w[xs][:, None]
    lo_seg = np.searchsorted(keys, bins * span, side="left")
    hi_seg = np.searchsorted(keys, (bins + 1) * span, side="left")
    target = np.clip(wx - (la - lb + 1) // 2, -1, span - 1)  # ⌊w_x − (l_a − l_b)/2⌋
    pos = np.searchsorted(keys, bins[None, :] * span + target, side="right")
    below = keys[np.maximum(pos - 1, 0)] - bins * span
    above = keys[np.minimum(pos, keys.size - 1)] - bins * span
    return np.asarray(np.minimum(np.where(pos - 1 >= lo_seg, _pair_max(wx, below, la, lb), la),
                                 np.where(pos < hi_seg, _pair_max(wx, above, la, lb), la)), dtype=np.int64)


def best_move(w: IntArray, out: IntArray, loads: IntArray, keys: IntArray, span: int) -> tuple[int, int, int] | None:
    """The round's move (x, y or −1, destination bin), or None when no pair lowers the heaviest bin.

    The lightest bins give a value v₁ first; a pair maximum is at least (l_a + l_b)/2 and l_a − w_x, so only bins
    and items that can still reach min(v₁, l_a − 1) are searched, which keeps every tie of the exhaustive scan.
    """
    a = int(np.argmax(loads))
    la = int(loads[a])
    in_a = np.flatnonzero(out == a)
    elig = np.flatnonzero(loads < la)
    if in_a.size == 0 or elig.size == 0:
        return None
    light = np.sort(elig[np.argsort(loads[elig], kind="stable")[:_PROBE]])
    cap = min(int(pair_values(w, in_a, light, loads, keys, span, la).min()), la - 1)
    bins = elig[la + loads[elig] <= 2 * cap]
    xs = in_a[la - w[in_a] <= cap]
    if bins.size == 0 or xs.size == 0:
        return None
    val = pair_values(w, xs, bins, loads, keys, span, la)
    v = int(val.min())
    if v >= la:
        return None
    col = int(np.flatnonzero((val == v).any(axis=0))[0])
    x = int(xs[np.flatnonzero(val[:, col] == v)[0]])
    b = int(bins[col])
    in_b = np.flatnonzero(out == b)
    cand = _pair_max(w[x], np.concatenate(([0], w[in_b])), la, loads[b])
    k = int(np.flatnonzero(cand == v)[0])
    return x, (-1 if k == 0 else int(in_b[k - 1])), b


def _rekey(keys: IntArray, span: int, src: int, dst: int, weight: int) -> IntArray:
    """Move one item of `weight` from bin `src` to bin `dst` in the sorted (bin, weight) keys."""
    keys = np.delete(keys, int(np.searchsorted(keys, src * span + weight)))
    new = dst * span + weight
    return np.insert(keys, int(np.searchsorted(keys, new)), new)


def improve(weights: ArrayLike, bin_of: ArrayLike, bins: int) -> IntArray:
    """Pairwise improvement: move or swap items out of the heaviest bin while that bin's pair maximum drops.

    Each accepted move lowers the heaviest bin and leaves its partner below the old maximum, so the maximum load
    never rises and the sum of squared loads strictly falls (termination). Same moves as the exhaustive scan
    (`tests/test_balancing.py` keeps it as the reference).
    """
    w = np.asarray(weights, dtype=np.int64)
    out = np.array(bin_of, dtype=np.int64)
    loads = np.bincount(out, weights=w, minlength=bins).astype(np.int64)
    span = int(w.max(initial=0)) + 1
    if bins * span >= 2**62:
        raise ConfigError(f"weights up to {span - 1} on {bins} bins overflow the balancing keys")
    keys = np.sort(np.concatenate([out * span + w, np.arange(bins, dtype=np.int64) * span]))  # + a weightless item
    for _ in range(MAX_IMPROVE_ROUNDS):
        move = best_move(w, out, loads, keys, span)
        if move is None:
            break
        x, y, dest = move
        a = int(out[x])
        keys = _rekey(keys, span, a, dest, int(w[x]))
        delta = int(w[x])
        if y >= 0:
            keys = _rekey(keys, span, dest, a, int(w[y]))
            delta -= int(w[y])
            out[y] = a
        out[x] = dest
        loads[a] -= delta
        loads[dest] += delta
    return out
