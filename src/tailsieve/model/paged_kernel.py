"""The paged replica's event loop compiled (the `fast` extra: numba): the scheduling step of `model.paged`, rule for
rule and segment for segment, so that every finish time, segment, span and engine count is bit-identical to the
Python engine (tests/test_paged_kernel.py runs both on the reference's cases and the pinned runs).

Plain arrays instead of lists and dicts: the running, waiting and prefilling lists are arrays with a count (order
kept), the decoders' finish heap is three arrays ordered as the tuples (finish iteration, request, version) are,
the prompt keys are renumbered densely so that the prefix references and the cache's owners are arrays, and the
free queue's segments are an array with a head (compacted when full: only empty segments go). The integer state
lives in one array `v` (indices in `paged_kernel_pool`), the clock in `f[0]`; the heap drops its stale entries when
full. `_run` returns a status: 0 done, 1 a waiting request can never be admitted, 2 no request can make progress,
3 the records are full (numba does not check bounds, so every pass first checks that its writes fit): then
`run_kernel` grows them and calls `_run` again, which goes on from the same pass. Without numba the same functions
run as plain Python (slowly, and checked by the tests so)."""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from tailsieve.model.paged_blocks import PagedLimits, PagedTrace
from tailsieve.model.paged_kernel_pool import (
    ANON,
    BIG,
    COMPILED,
    CTX,
    DONE,
    HN,
    NHIT,
    NPRE,
    NPREF,
    NREC,
    NRUN,
    NSEG,
    NSPAN,
    NV,
    NWAIT,
    PEND,
    PREFILL,
    PRIV,
    TOTAL,
    WAIT,
    B,
    FloatArray,
    IntArray,
    K,
    _demand,
    _first_shortage,
    _heap_pop,
    _pool_take,
    jit,
)
from tailsieve.model.paged_kernel_state import (
    LPREF,
    LRUN,
    LWAIT,
    NQ,
    QG0,
    QK,
    QL,
    QP,
    QPEND,
    QS,
    QSTATE,
    QVER,
    _admit_one,
    _finish_due,
    _fits,
    _leave,
    _list_append,
    _list_remove,
    _preempt_for,
    _start_decode,
)
from tailsieve.model.paged_state import initial_queue

__all__ = ["COMPILED", "NO_PROGRESS", "STALLED", "run_kernel"]

OK, STALLED, NO_PROGRESS, FULL = 0, 1, 2, 3
World = tuple[Any, ...]  # the state arrays and records (`_run`), a tuple so that numba passes them as one argument


# the loop (`model.paged._Paged.run`): w = (v, q, lst, phase, pq, of_key, of_req, refs, hp, finish, spans, prek, rec,
# hits), the state arrays and the records the state changes write
@jit
def _abort(w: World, keep: IntArray, bs: int, caching: bool) -> None:
    """The cut (`_Paged.abort`): the requests not kept leave, running or waiting."""
    v, q, lst, phase, pq, of_key, of_req, refs, _, _, spans = w[:11]
    n = v[NRUN]
    gone = np.empty(n, np.int64)
    c = 0
    for j in range(n):
        if not keep[lst[LRUN, j]]:
            gone[c] = lst[LRUN, j]
            c += 1
    for j in range(c):
        _leave(v, q, lst, phase, pq, of_key, of_req, refs, spans, bs, caching, gone[j], DONE)
    c = 0
    for j in range(v[NWAIT]):
        if keep[lst[LWAIT, j]]:
            lst[LWAIT, c] = lst[LWAIT, j]
            c += 1
    v[NWAIT] = c


@jit
def _allocate(w: World, bs: int, nb: int, caching: bool) -> bool:
    """Step 1 (`_Paged.allocate`): the decoders crossing a block boundary take a block each; whether it preempted."""
    v, q, lst, phase, pq, of_key, of_req, refs, _, _, spans, prek = w[:12]
    need = phase[v[K] % bs] if v[B] else 0
    if not need:
        return False
    if nb < 0:
        v[PRIV] += need
        return False
    if need <= v[TOTAL]:
        _pool_take(v, pq[0], pq[1], of_key, of_req, need)
        v[PRIV] += need
        return False
    return bool(_preempt_for(v, q, lst, phase, pq, of_key, of_req, refs, spans, prek, bs, caching, v[K] % bs))


@jit
def _admit(w: World, f: FloatArray, comp: IntArray, bs: int, cap: int, m: int, pre: float, caching: bool) -> None:
    """Step 2 (`_Paged.admit`): FCFS admission while blocks, the seq cap and the token budget allow; the prefill
    stall (without chunked prefill) moves the clock."""
    v, q, lst, phase, pq, of_key, of_req, refs, hp, finish, spans, _, rec, hits = w
    used = v[B] + v[PEND]
    stall = n_empty = 0
    while v[NWAIT] and v[NRUN] < cap and (m < 0 or used < m):
        i = lst[LWAIT, v[NWAIT] - 1]
        if not _fits(v, q, refs, bs, i):
            break
        v[NWAIT] -= 1
        fill = _admit_one(v, q, lst, pq, of_key, of_req, refs, rec, hits, bs, i)
        if m < 0:
            stall += fill
            q[QSTATE, i] = PREFILL
            if q[QL, i] == q[QG0, i]:  # nothing to decode: done once its prompt is in
                comp[n_empty] = i
                n_empty += 1
                _leave(v, q, lst, phase, pq, of_key, of_req, refs, spans, bs, caching, i, DONE)
            else:
                _start_decode(v, q, phase, hp, bs, i, v[K])
        else:
            q[QSTATE, i], q[QPEND, i] = PREFILL, fill
            v[PEND] += fill
            _list_append(v, lst, LPREF, i)
            used += fill
    if n_empty:
        te = f[0] + pre * stall
        for j in range(n_empty):
            finish[comp[j]] = te
    if pre * stall:
        f[0] += pre * stall


@jit
def _chunks(w: World, comp: IntArray, m: int) -> tuple[int, int]:
    """This iteration's prefill tokens (the budget the decoders leave, FCFS) and how many prefills it completes
    (`_Paged.chunks`; those requests into `comp`)."""
    v, q, lst = w[:3]
    rem, chunk, n_comp = max(m - v[B], 0), 0, 0
    for j in range(v[NPREF]):
        if rem <= 0:
            break
        i = lst[LPREF, j]
        step = min(rem, q[QPEND, i])
        rem -= step
        chunk += step
        if step == q[QPEND, i]:
            comp[n_comp] = i
            n_comp += 1
    return chunk, n_comp


@jit
def _span(w: World, chunk: int, cut_k: int, bs: int, nb: int) -> int:
    """Iterations from here with the same batch (`_Paged.span`); −1: none can make progress."""
    v, q, lst, phase = w[:4]
    hp = w[8]
    k, b = v[K], v[B]
    while v[HN] and hp[2, 0] != q[QVER, hp[1, 0]]:
        _heap_pop(v, hp[0], hp[1], hp[2])
    s = hp[0, 0] - k if v[HN] else BIG
    if chunk:
        s = min(s, -(-q[QPEND, lst[LPREF, 0]] // chunk) - 1)
    if cut_k > k:
        s = min(s, cut_k - k)
    if b and nb >= 0 and s > 1:
        free = v[TOTAL]
        if s > (free // b) * bs + 1:
            s = min(s, _first_shortage(phase, b, k, free, bs))
    if s >= 1 << 61:
        return -1
    return int(max(s, 1))


@jit
def _advance(w: World, f: FloatArray, comp: IntArray, n_comp: int, chunk: int, s: int, tau: FloatArray, kv: float,
             pre: float, bs: int, nb: int, caching: bool, segi: IntArray, segf: FloatArray) -> None:
    """s iterations of the batch, the completing prefills joining it in a single one (`_Paged.advance`), then the
    finishes."""
    v, q, lst, phase, pq, of_key, of_req, refs, hp, finish, spans = w[:11]
    k, b, t, cc = v[K], v[B], f[0], v[CTX]
    for j in range(n_comp):
        cc += q[QP, comp[j]] + q[QG0, comp[j]]
    base = tau[b + n_comp] + kv * cc + pre * chunk
    inc = kv * b
    n = v[NSEG]
    segi[0, n], segi[1, n] = k, s
    segf[0, n], segf[1, n], segf[2, n] = t, base, inc
    v[NSEG] = n + 1
    t = t + (s * base + inc * s * (s - 1) / 2.0)
    f[0] = t
    rem = chunk * s  # `_Paged.drain`: chunk·s prefill tokens done, FCFS
    v[PEND] -= rem
    for j in range(v[NPREF] if chunk else 0):
        i = lst[LPREF, j]
        step = min(q[QPEND, i], rem)
        q[QPEND, i] -= step
        rem -= step
        if rem <= 0:
            break
    if s > 1 and b and nb >= 0:
        need = _demand(phase, b, k, s - 1, bs)
        _pool_take(v, pq[0], pq[1], of_key, of_req, need)
        v[PRIV] += need
    v[CTX] += b * s
    k += s
    v[K] = k
    for j in range(n_comp):
        _list_remove(v, lst, LPREF, comp[j])
        _start_decode(v, q, phase, hp, bs, comp[j], k - 1)
    if v[HN] and hp[0, 0] <= k:
        _finish_due(v, q, lst, phase, pq, of_key, of_req, refs, spans, hp, finish, bs, caching, k, t)


@jit
def _run(w: World, f: FloatArray, tau: FloatArray, lim: IntArray, kv: float, pre: float, keep: IntArray,
         segi: IntArray, segf: FloatArray) -> int:
    """The event loop; lim = (blocks or −1, block size, max_num_seqs, max_num_batched_tokens or −1, prefix caching,
    the cut's iteration or −1). Its status (module docstring)."""
    v, n = w[0], w[1].shape[1]
    nb, bs, cap, m, caching = lim[0], lim[1], lim[2], lim[3], lim[4] != 0
    spans, prek, rec, hits = w[10:]
    comp = np.empty(n, np.int64)
    while True:
        # a pass writes one segment and at most n spans, preemptions, recomputes and hits: room for them, or return
        # here, where the whole state is in the arrays, so that the caller grows the records and calls again
        if (v[NSEG] >= segi.shape[1] or v[NSPAN] + n > spans.shape[0] or v[NPRE] + n > prek.size
                or v[NREC] + n > rec.shape[0] or v[NHIT] + n > hits.shape[0]):
            return FULL
        cut_k = lim[5]
        if v[K] == cut_k:
            _abort(w, keep, bs, caching)
            lim[5] = cut_k = -1
        preempted = _allocate(w, bs, nb, caching)
        if not preempted and v[NWAIT]:
            _admit(w, f, comp, bs, cap, m, pre, caching)
        if not v[NRUN]:
            if v[NWAIT]:
                return STALLED
            break
        chunk, n_comp = _chunks(w, comp, m) if m >= 0 and v[NPREF] else (0, 0)
        s = 1 if n_comp or preempted else _span(w, chunk, cut_k, bs, nb)
        if s < 0:
            return NO_PROGRESS
        _advance(w, f, comp, n_comp, chunk, s, tau, kv, pre, bs, nb, caching, segi, segf)
        if not v[NRUN] and not v[NWAIT]:
            break
    return OK


def run_kernel(lens: IntArray, prompts: IntArray, keys: IntArray | None, tau: FloatArray, lim: PagedLimits,
               cut: tuple[int, NDArray[np.bool_]] | None, room: IntArray | None = None) -> tuple[int, PagedTrace]:
    """Serve one replica's requests with `_run` (`model.paged.run_paged`: the same arguments, the limits already
    checked); the status and the record, as the Python engine's. `room`: the first capacities of the segment, span,
    preemption, recompute and hit records (they grow as the run needs)."""
    n = int(lens.size)
    bs = lim.block_size
    finish, waiting = initial_queue(lens, lim)
    q = np.zeros((NQ, max(n, 1)), np.int64)
    q[QL, :n], q[QP, :n], q[QK, :n] = lens, prompts, -1
    nk = 0
    if keys is not None and n:
        shared = keys >= 0
        if shared.any():  # the prompt keys renumbered 0..nk−1: the prefix references and cache owners are arrays
            uniq, dense = np.unique(keys[shared], return_inverse=True)
            q[QK, :n][shared] = dense
            nk = int(uniq.size)
        if lim.prefix_caching:
            q[QS, :n] = np.where(shared & (prompts > 0), (prompts - 1) // bs, 0)
    q[QSTATE, :n] = np.where(np.isfinite(finish), DONE, WAIT)
    lst = np.zeros((3, max(n, 1)), np.int64)
    lst[LWAIT, : waiting.size] = waiting
    v = np.zeros(NV, np.int64)
    v[ANON] = v[TOTAL] = BIG if lim.blocks is None else lim.blocks
    v[NWAIT] = waiting.size
    cap = n if lim.max_num_seqs is None else lim.max_num_seqs
    limits = np.array([-1 if lim.blocks is None else lim.blocks, bs, cap,
                       -1 if lim.max_num_batched_tokens is None else lim.max_num_batched_tokens,
                       int(lim.prefix_caching), -1 if cut is None else cut[0]], np.int64)
    keep = np.ones(max(n, 1), np.int64) if cut is None else cut[1].astype(np.int64)
    npool = (2 * n if lim.blocks is None else max(2 * n, lim.blocks)) + 16  # compaction keeps ≤ blocks + 1
    room = np.array([8 * n + 64, 3 * n + 16, 2 * n + 16, 2 * n + 16, 2 * n + 16], np.int64) if room is None else room
    spans, segi, segf = np.zeros((room[1], 3), np.int64), np.zeros((2, room[0]), np.int64), np.zeros((3, room[0]))
    prek, rec, hits = np.zeros(room[2], np.int64), np.zeros((room[3], 2), np.int64), np.zeros((room[4], 2), np.int64)
    vv, fin, f = v.copy(), finish.copy(), np.zeros(1)
    state = (vv, q, lst, np.zeros(bs, np.int64), np.zeros((2, npool), np.int64), np.full(max(nk, 1), -1, np.int64),
             np.full(max(n, 1), -1, np.int64), np.zeros(max(nk, 1), np.int64), np.zeros((3, 2 * n + 16), np.int64),
             fin)
    while True:
        status = _run((*state, spans, prek, rec, hits), f, tau, limits, lim.kv_s_per_token, lim.prefill_s_per_token,
                      keep, segi, segf)
        if status != FULL:
            break
        segi, segf = _grown(segi, 1, n), _grown(segf, 1, n)  # the records are full: grow them and go on
        spans, prek, rec, hits = (_grown(a, 0, n) for a in (spans, prek, rec, hits))
    used = vv[[NSEG, NSPAN, NPRE, NREC, NHIT]]
    ns, nsp, npr, nre, nhi = (int(x) for x in used)
    seg = (segi[0, :ns].copy(), segf[0, :ns].copy(), segi[1, :ns].copy(), segf[1, :ns].copy(), segf[2, :ns].copy())
    return status, PagedTrace(fin, spans[:nsp].copy(), seg, prek[:npr].copy(), rec[:nre].copy(), hits[:nhi].copy())


def _grown(a: NDArray[Any], axis: int, n: int) -> NDArray[Any]:
    """`a` with twice (plus n) its length along `axis`, its content kept."""
    shape = list(a.shape)
    shape[axis] = 2 * shape[axis] + n
    out = np.zeros(shape, a.dtype)
    out[tuple(slice(0, s) for s in a.shape)] = a
    return out
