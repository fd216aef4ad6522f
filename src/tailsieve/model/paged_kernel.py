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

from tailsieve.errors import ConfigError
from tailsieve.model.paged_blocks import PagedLimits, PagedTrace
from tailsieve.model.paged_kernel_pool import (
    ANON,
    COMPILED,
    CTX,
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
    PRIV,
    TOTAL,
    B,
    FloatArray,
    IntArray,
    K,
    _demand,
    _first_shortage,
    _heap_pop,
    _pool_take,
    jit,
    jit_inline,
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
from tailsieve.model.paged_state import BIG, DONE, NO_PROGRESS_MSG, PREFILL, STALLED_MSG

__all__ = ["COMPILED", "run_kernel"]

OK, STALLED, NO_PROGRESS, FULL = 0, 1, 2, 3
World = tuple[Any, ...]  # the state arrays and records (`_run`), a tuple so that numba passes them as one argument


# the loop (`model.paged._Paged.run`): w = (v, q, lst, phase, pq, of_key, of_req, refs, hp, finish, spans, prek, rec,
# hits), the state arrays and the records the state changes write
@jit_inline
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


@jit_inline
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


@jit_inline
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


@jit_inline
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


@jit_inline
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


@jit_inline
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
               cut: tuple[int, NDArray[np.bool_]] | None, room: IntArray | None = None) -> PagedTrace:
    """Serve one replica's requests with `_run` (`model.paged.run_paged`: the same arguments, the limits already
    checked); the record, as the Python engine's, or its `ConfigError` when the replica stalls. `room`: the first
    capacities of the segment, span, preemption, recompute and hit records (they grow as the run needs)."""
    n = int(lens.size)
    cap = n if lim.max_num_seqs is None else lim.max_num_seqs
    limits = np.array([-1 if lim.blocks is None else lim.blocks, lim.block_size, cap,
                       -1 if lim.max_num_batched_tokens is None else lim.max_num_batched_tokens,
                       int(lim.prefix_caching), -1 if cut is None else cut[0]], np.int64)
    keep = np.ones(max(n, 1), np.int64) if cut is None else cut[1].astype(np.int64)
    if room is None:  # enough for most KV-bound runs (a few preemptions per request): growing costs a copy
        room = np.array([16 * n + 256, 8 * n + 64, 8 * n + 64, 8 * n + 64, 2 * n + 16], np.int64)
    keys = np.full(n, -1, np.int64) if keys is None else keys.astype(np.int64)
    if n and keys.max() >= 4 * n + 64:  # the kernel numbers the keys with a table as long as the largest
        keys = np.where(keys >= 0, np.unique(keys, return_inverse=True)[1], -1)
    status, fin, spans, seg_i, seg_f, prek, rec, hits = _serve(
        lens.astype(np.int64), prompts.astype(np.int64), keys, tau, limits, lim.kv_s_per_token,
        lim.prefill_s_per_token, keep, room)
    if status == STALLED:
        raise ConfigError(STALLED_MSG)
    if status == NO_PROGRESS:
        raise ConfigError(NO_PROGRESS_MSG)
    seg = (seg_i[0], seg_f[0], seg_i[1], seg_f[1], seg_f[2])
    return PagedTrace(fin, spans, seg, prek, rec, hits)


@jit
def _state(lens: IntArray, prompts: IntArray, keys: IntArray, lim: IntArray) -> World:
    """The state arrays of a run before its first pass (`PagedState.__init__`): the prompt keys renumbered 0..nk−1 in
    order of appearance (the prefix references and the cache's owners are arrays), the FCFS queue (with chunked
    prefill an empty response is done at 0), the free queue full."""
    n, bs = lens.size, lim[1]
    q = np.zeros((NQ, max(n, 1)), np.int64)
    q[QL, :n], q[QP, :n] = lens, prompts
    dense = np.full(keys.max() + 1 if n else 1, -1, np.int64)  # `run_kernel` keeps the keys below a few n
    nk = 0
    for i in range(n):
        q[QK, i] = -1
        if keys[i] >= 0:
            if dense[keys[i]] < 0:
                dense[keys[i]] = nk
                nk += 1
            q[QK, i] = dense[keys[i]]
            if lim[4] and prompts[i] > 0:
                q[QS, i] = (prompts[i] - 1) // bs
    finish = np.full(max(n, 1), np.inf)[:n]
    lst = np.zeros((3, max(n, 1)), np.int64)
    v = np.zeros(NV, np.int64)
    for i in range(n - 1, -1, -1):
        if lim[3] >= 0 and lens[i] == 0:
            finish[i], q[QSTATE, i] = 0.0, DONE
        else:
            lst[LWAIT, v[NWAIT]] = i
            v[NWAIT] += 1
    v[ANON] = v[TOTAL] = BIG if lim[0] < 0 else lim[0]
    nk = max(nk, 1)
    npool = (2 * n if lim[0] < 0 else max(2 * n, lim[0])) + 16  # compaction keeps ≤ blocks + 1 segments
    return (v, q, lst, np.zeros(bs, np.int64), np.zeros((2, npool), np.int64), np.full(nk, -1, np.int64),
            np.full(max(n, 1), -1, np.int64), np.zeros(nk, np.int64), np.zeros((3, 2 * n + 16), np.int64), finish)


@jit
def _serve(lens: IntArray, prompts: IntArray, keys: IntArray, tau: FloatArray, lim: IntArray, kv: float, pre: float,
           keep: IntArray, room: IntArray) -> tuple[Any, ...]:
    """`_run` from the first pass to the end, the records grown whenever they are full; the status and the records
    trimmed (finish, spans, segments' integer and float columns, preemptions, recomputes, hits)."""
    n = lens.size
    state = _state(lens, prompts, keys, lim)
    spans, segi, segf = np.empty((room[1], 3), np.int64), np.empty((2, room[0]), np.int64), np.empty((3, room[0]))
    prek, rec, hits = np.empty(room[2], np.int64), np.empty((room[3], 2), np.int64), np.empty((room[4], 2), np.int64)
    f = np.zeros(1)
    while True:
        status = _run((*state, spans, prek, rec, hits), f, tau, lim, kv, pre, keep, segi, segf)
        if status != FULL:
            break
        segi, segf = _grown_cols(segi, n), _grown_cols(segf, n)
        spans, rec, hits = _grown_rows(spans, n), _grown_rows(rec, n), _grown_rows(hits, n)
        prek = _grown_rows(prek.reshape(-1, 1), n)[:, 0].copy()
    v = state[0]
    ns = v[NSEG]
    return (status, state[9], spans[: v[NSPAN]].copy(), segi[:, :ns].copy(), segf[:, :ns].copy(),
            prek[: v[NPRE]].copy(), rec[: v[NREC]].copy(), hits[: v[NHIT]].copy())


@jit
def _grown_rows(a: NDArray[Any], n: int) -> NDArray[Any]:
    """`a` (rows × columns) with twice its rows plus n, its content kept."""
    out = np.empty((2 * a.shape[0] + n, a.shape[1]), a.dtype)
    out[: a.shape[0]] = a
    return out


@jit
def _grown_cols(a: NDArray[Any], n: int) -> NDArray[Any]:
    """`a` (rows × columns) with twice its columns plus n, its content kept."""
    out = np.empty((a.shape[0], 2 * a.shape[1] + n), a.dtype)
    out[:, : a.shape[1]] = a
    return out
