"""The compiled paged replica's parts below the loop (`model.paged_kernel`): the integer state's layout, the free
block queue (`paged_blocks.BlockPool` as arrays), the decoders' finish heap and the block demand of a run of
iterations. Without numba (the `fast` extra) the functions are plain Python."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

IntArray = NDArray[np.int64]
FloatArray = NDArray[np.float64]

NONE = -1  # a free-queue segment nobody can hit (the Python pool's `None` owner)
# v: the integer state
K, B, CTX, PRIV, RES, PEND, ANON, TOTAL, SH, ST, NRUN, NWAIT, NPREF, HN, NSEG, NSPAN, NPRE, NREC, NHIT = range(19)
NV = 19


def _identity(fn: Callable[..., Any]) -> Callable[..., Any]:
    return fn


KERNEL_SOURCES = ("paged_kernel*.py", "paged_state.py")  # the files whose code or constants the kernel compiles


def drop_stale_cache(folder: Path) -> bool:
    """numba checks a cached function against its own file only (numba#1833): a caller cached before a callee's file
    changed keeps the old callee, and a global imported from another file keeps its old value. So when any of the
    `KERNEL_SOURCES` in `folder` changed since the digest stored beside numba's in-tree cache, every cached kernel
    function there goes; whether any went. A folder that cannot be written (an installed package: numba caches in
    its user folder, and files there do not change) is left alone."""
    files = sorted({p for pattern in KERNEL_SOURCES for p in folder.glob(pattern)})
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in files)).hexdigest()
    cache = folder / "__pycache__"
    mark = cache / "paged_kernel.digest"
    try:
        if mark.read_text() == digest:
            return False
    except OSError:
        pass
    try:
        stale = list(cache.glob("paged_kernel*.nb[ci]"))
        for f in stale:
            f.unlink()
        cache.mkdir(exist_ok=True)
        tmp = mark.with_name(f"{mark.name}.{os.getpid()}.tmp")
        tmp.write_text(digest)
        os.replace(tmp, mark)
    except OSError:
        return False
    return bool(stale)


try:  # the `fast` extra; without it the functions below are plain Python
    from numba import njit as _njit

    drop_stale_cache(Path(__file__).parent)
    jit: Callable[[Callable[..., Any]], Callable[..., Any]] = _njit(cache=True, nogil=True)
    jit_inline: Callable[[Callable[..., Any]], Callable[..., Any]] = _njit(cache=True, nogil=True, inline="always")
    COMPILED = True
except Exception:  # pragma: no cover - no numba (the bare venv), or one that cannot load
    jit = jit_inline = _identity
    COMPILED = False


# the free queue (`paged_blocks.BlockPool`) -------------------------------------------------------------------------
@jit
def _of_get(of_key: IntArray, of_req: IntArray, owner: int) -> int:
    return int(of_key[owner] if owner >= 0 else of_req[-2 - owner])


@jit
def _of_set(of_key: IntArray, of_req: IntArray, owner: int, idx: int) -> None:
    if owner >= 0:
        of_key[owner] = idx
    else:
        of_req[-2 - owner] = idx


@jit
def _pool_take(v: IntArray, own: IntArray, cnt: IntArray, of_key: IntArray, of_req: IntArray, blocks: int) -> None:
    v[TOTAL] -= blocks
    if blocks <= v[ANON]:
        v[ANON] -= blocks
        return
    blocks -= v[ANON]
    v[ANON] = 0
    h = v[SH]
    while blocks > 0:
        c = cnt[h]
        if c <= blocks:
            blocks -= c
            if own[h] != NONE:
                _of_set(of_key, of_req, own[h], -1)
            h += 1
        else:
            cnt[h] = c - blocks
            blocks = 0
    v[SH] = h


@jit
def _pool_push(v: IntArray, own: IntArray, cnt: IntArray, of_key: IntArray, of_req: IntArray, owner: int,
               blocks: int) -> None:
    if blocks <= 0:
        return
    v[TOTAL] += blocks
    st = v[ST]
    if owner == NONE and st > v[SH] and own[st - 1] == NONE:
        cnt[st - 1] += blocks
        return
    if st == own.size:  # compact: drop the empty segments but the last (a `None` push may still join it)
        j = 0
        for h in range(v[SH], st):
            if cnt[h] > 0 or h == st - 1:
                own[j], cnt[j] = own[h], cnt[h]
                if own[j] != NONE:
                    _of_set(of_key, of_req, own[j], j)
                j += 1
        v[SH], st = 0, j
    own[st], cnt[st] = owner, blocks
    v[ST] = st + 1
    if owner != NONE:
        _of_set(of_key, of_req, owner, st)


@jit
def _pool_remove(v: IntArray, own: IntArray, cnt: IntArray, of_key: IntArray, of_req: IntArray, owner: int) -> int:
    idx = _of_get(of_key, of_req, owner)
    if idx < 0:
        return 0
    _of_set(of_key, of_req, owner, -1)
    c = cnt[idx]
    own[idx], cnt[idx] = NONE, 0
    v[TOTAL] -= c
    return int(c)


@jit
def _pool_forget(own: IntArray, of_key: IntArray, of_req: IntArray, owner: int) -> None:
    idx = _of_get(of_key, of_req, owner)
    if idx >= 0:
        _of_set(of_key, of_req, owner, -1)
        own[idx] = NONE


# the decoders' finish heap: (finish iteration, request, version), the smallest tuple first ---------------------------
@jit
def _less(hk: IntArray, hi: IntArray, hv: IntArray, a: int, b: int) -> bool:
    if hk[a] != hk[b]:
        return bool(hk[a] < hk[b])
    if hi[a] != hi[b]:
        return bool(hi[a] < hi[b])
    return bool(hv[a] < hv[b])


@jit
def _swap(hk: IntArray, hi: IntArray, hv: IntArray, a: int, b: int) -> None:
    hk[a], hk[b] = hk[b], hk[a]
    hi[a], hi[b] = hi[b], hi[a]
    hv[a], hv[b] = hv[b], hv[a]


@jit
def _sift_down(hk: IntArray, hi: IntArray, hv: IntArray, n: int, j: int) -> None:
    while True:
        c = 2 * j + 1
        if c >= n:
            return
        if c + 1 < n and _less(hk, hi, hv, c + 1, c):
            c += 1
        if not _less(hk, hi, hv, c, j):
            return
        _swap(hk, hi, hv, c, j)
        j = c


@jit
def _heap_pop(v: IntArray, hk: IntArray, hi: IntArray, hv: IntArray) -> None:
    n = v[HN] - 1
    v[HN] = n
    if n:
        hk[0], hi[0], hv[0] = hk[n], hi[n], hv[n]
        _sift_down(hk, hi, hv, n, 0)


@jit
def _heap_push(v: IntArray, hk: IntArray, hi: IntArray, hv: IntArray, version: IntArray, key: int, i: int,
               ver: int) -> None:
    n = v[HN]
    if n == hk.size:  # full: the stale entries go (a stale entry is never a finish; the order of the rest stays)
        m = 0
        for j in range(n):
            if hv[j] == version[hi[j]]:
                hk[m], hi[m], hv[m] = hk[j], hi[j], hv[j]
                m += 1
        n = m
        for j in range(n // 2 - 1, -1, -1):
            _sift_down(hk, hi, hv, n, j)
    hk[n], hi[n], hv[n] = key, i, ver
    j = n
    while j:
        p = (j - 1) // 2
        if not _less(hk, hi, hv, j, p):
            break
        _swap(hk, hi, hv, j, p)
        j = p
    v[HN] = n + 1

# blocks a run of iterations needs (`paged_blocks.demand`, `first_shortage`) ----------------------------------------
@jit
def _demand(phase: IntArray, b: int, k: int, j: int, bs: int) -> int:
    full, part = divmod(j, bs)
    total = full * b
    start = (k + 1) % bs
    for d in range(part):
        total += phase[(start + d) % bs]
    return total


@jit
def _first_shortage(phase: IntArray, b: int, k: int, free: int, bs: int) -> int:
    full = free // b
    j = full * bs
    start = (k + j + 1) % bs
    left = free - full * b
    need = count = 0
    for d in range(bs):
        need += phase[(start + d) % bs]
        if need > left:
            break
        count += 1
    return j + count + 1
