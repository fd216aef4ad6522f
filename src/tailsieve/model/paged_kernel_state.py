"""The compiled paged replica's state changes (`paged_state.PagedState` as arrays, for `model.paged_kernel`): the
per-request rows, the running, waiting and prefilling lists, admission, decode start, leaving, preemption and
finishing. Without numba (the `fast` extra) the functions are plain Python."""

from __future__ import annotations

from tailsieve.model.paged_kernel_pool import (
    ANON,
    CTX,
    HN,
    NHIT,
    NONE,
    NPRE,
    NPREF,
    NREC,
    NRUN,
    NSPAN,
    NWAIT,
    PEND,
    PRIV,
    RES,
    TOTAL,
    B,
    FloatArray,
    IntArray,
    K,
    _heap_pop,
    _heap_push,
    _pool_forget,
    _pool_push,
    _pool_remove,
    _pool_take,
    jit,
)
from tailsieve.model.paged_state import DECODE, DONE, PREFILL, WAIT

# the state changes (`paged_state.PagedState`) ---------------------------------------------------------------------
# q: the per-request integers, one row each
QL, QP, QK, QS, QG0, QSTATE, QKS, QC0, QPEND, QUSES, QAGAIN, QVER, QPH = range(13)
NQ = 13
# lst: the running, waiting (a stack: its head last) and prefilling lists, their counts in v
LRUN, LWAIT, LPREF = 0, 1, 2
CNT = (NRUN, NWAIT, NPREF)


@jit
def _list_remove(v: IntArray, lst: IntArray, which: int, i: int) -> bool:
    """Remove request i from list `which`, keeping the order; whether it was there."""
    c = CNT[which]
    n = v[c]
    row = lst[which]
    for j in range(n - 1, -1, -1):  # from the end: a preemption's victim is the last
        if row[j] == i:
            for h in range(j, n - 1):
                row[h] = row[h + 1]
            v[c] = n - 1
            return True
    return False


@jit
def _list_append(v: IntArray, lst: IntArray, which: int, i: int) -> None:
    c = CNT[which]
    lst[which, v[c]] = i
    v[c] += 1


@jit
def _start_decode(v: IntArray, q: IntArray, phase: IntArray, hp: IntArray, bs: int, i: int, ks: int) -> None:
    q[QSTATE, i] = DECODE
    c0 = q[QP, i] + q[QG0, i]
    q[QKS, i], q[QC0, i] = ks, c0
    v[B] += 1
    v[CTX] += c0 + (v[K] - ks)
    ph = (ks - c0) % bs
    phase[ph] += 1
    q[QPH, i] = ph
    _heap_push(v, hp[0], hp[1], hp[2], q[QVER], ks + q[QL, i] - q[QG0, i], i, q[QVER, i])


@jit
def _held(v: IntArray, q: IntArray, bs: int, i: int) -> int:
    st = q[QSTATE, i]
    if st == DECODE:
        done = v[K] - q[QKS, i]
        total = -(-(q[QC0, i] + (done if done > 1 else 1)) // bs)
    elif st == PREFILL:
        total = -(-(q[QP, i] + q[QG0, i] + 1) // bs)
    else:
        return 0
    return int(total - (q[QS, i] if q[QUSES, i] else 0))


@jit
def _leave(v: IntArray, q: IntArray, lst: IntArray, phase: IntArray, pq: IntArray, of_key: IntArray,
           of_req: IntArray, refs: IntArray, spans: IntArray, bs: int, caching: bool, i: int, new_state: int) -> None:
    st = q[QSTATE, i]
    share = q[QS, i] if q[QUSES, i] else 0
    ks = c0 = done = 0
    if st == DECODE:
        ks, c0 = q[QKS, i], q[QC0, i]
        done = v[K] - ks
        blocks = (c0 + (done if done > 1 else 1) + bs - 1) // bs - share
        computed = c0 + done - 1
    else:
        blocks = _held(v, q, bs, i)
        computed = q[QP, i] + q[QG0, i] - q[QPEND, i]
    v[PRIV] -= blocks
    own, cnt = pq[0], pq[1]
    if caching:
        hashed = min(max(computed // bs - share, 0), blocks)
        v[ANON] += blocks - hashed
        v[TOTAL] += blocks - hashed
        _pool_push(v, own, cnt, of_key, of_req, -2 - i if new_state == WAIT else NONE, hashed)
    else:
        v[ANON] += blocks
        v[TOTAL] += blocks
    if share:
        key = q[QK, i]
        refs[key] -= 1
        if not refs[key]:
            v[RES] -= share
            _pool_push(v, own, cnt, of_key, of_req, key, share)
        q[QUSES, i] = 0
    if st == DECODE:
        v[B] -= 1
        v[CTX] -= c0 + done
        phase[(ks - c0) % bs] -= 1
        n = v[NSPAN]
        spans[n, 0], spans[n, 1], spans[n, 2] = i, ks, v[K]
        v[NSPAN] = n + 1
        q[QG0, i] += done
        q[QVER, i] += 1
    elif st == PREFILL and _list_remove(v, lst, LPREF, i):
        v[PEND] -= q[QPEND, i]
        q[QPEND, i] = 0
    _list_remove(v, lst, LRUN, i)
    q[QSTATE, i] = new_state


@jit
def _preempt_newest(v: IntArray, q: IntArray, lst: IntArray, phase: IntArray, pq: IntArray, of_key: IntArray,
                    of_req: IntArray, refs: IntArray, spans: IntArray, prek: IntArray, bs: int, caching: bool) -> int:
    victim = lst[LRUN, v[NRUN] - 1]
    _leave(v, q, lst, phase, pq, of_key, of_req, refs, spans, bs, caching, victim, WAIT)
    _list_append(v, lst, LWAIT, victim)
    q[QAGAIN, victim] = 1
    prek[v[NPRE]] = v[K]
    v[NPRE] += 1
    return int(victim)


@jit
def _preempt_for(v: IntArray, q: IntArray, lst: IntArray, phase: IntArray, pq: IntArray, of_key: IntArray,
                 of_req: IntArray, refs: IntArray, spans: IntArray, prek: IntArray, bs: int, caching: bool,
                 ph: int) -> bool:
    """`PagedState.preempt_for`: while more decoders of phase `ph` wait for a block than are free, the free ones are
    taken and the newest running request leaves (one fewer waiting if it is one of them)."""
    left, avail = phase[ph], v[TOTAL]
    while left > avail:
        if avail:
            _pool_take(v, pq[0], pq[1], of_key, of_req, avail)
            v[PRIV] += avail
            left -= avail
        victim = lst[LRUN, v[NRUN] - 1]
        if q[QSTATE, victim] == DECODE and q[QPH, victim] == ph:
            left -= 1
        _preempt_newest(v, q, lst, phase, pq, of_key, of_req, refs, spans, prek, bs, caching)
        avail = v[TOTAL]
    if left:
        _pool_take(v, pq[0], pq[1], of_key, of_req, left)
        v[PRIV] += left
    return True


@jit
def _finish_due(v: IntArray, q: IntArray, lst: IntArray, phase: IntArray, pq: IntArray, of_key: IntArray,
                of_req: IntArray, refs: IntArray, spans: IntArray, hp: IntArray, finish: FloatArray, bs: int,
                caching: bool, k: int, t: float) -> int:
    done = 0
    while v[HN] and hp[0, 0] <= k:
        i, ver = hp[1, 0], hp[2, 0]
        _heap_pop(v, hp[0], hp[1], hp[2])
        if ver == q[QVER, i] and q[QSTATE, i] == DECODE:
            finish[i] = t
            _leave(v, q, lst, phase, pq, of_key, of_req, refs, spans, bs, caching, i, DONE)
            done += 1
    return done


@jit
def _fits(v: IntArray, q: IntArray, refs: IntArray, bs: int, i: int) -> bool:
    blocks = (q[QP, i] + q[QG0, i] + bs) // bs
    if q[QS, i] and refs[q[QK, i]] > 0:
        blocks -= q[QS, i]
    return bool(blocks <= v[TOTAL])


@jit
def _admit_one(v: IntArray, q: IntArray, lst: IntArray, pq: IntArray, of_key: IntArray, of_req: IntArray,
               refs: IntArray, rec: IntArray, hits: IntArray, bs: int, i: int) -> int:
    share, key = q[QS, i], q[QK, i]
    blocks = (q[QP, i] + q[QG0, i] + bs) // bs - share
    hit = fresh = 0
    own, cnt = pq[0], pq[1]
    if share:
        if refs[key] > 0:
            refs[key] += 1
            hit = share
        else:
            hit = _pool_remove(v, own, cnt, of_key, of_req, key)
            refs[key] = 1
            v[RES] += share
            fresh = share - hit
    mine = 0
    if q[QAGAIN, i]:
        if hit == share:
            mine = _pool_remove(v, own, cnt, of_key, of_req, -2 - i)
        else:
            _pool_forget(own, of_key, of_req, -2 - i)
    _pool_take(v, own, cnt, of_key, of_req, fresh + blocks - mine)
    v[PRIV] += blocks
    q[QUSES, i] = 1 if share > 0 else 0
    fill = q[QP, i] + q[QG0, i] - (hit + mine) * bs
    if q[QAGAIN, i]:
        n = v[NREC]
        rec[n, 0], rec[n, 1] = v[K], fill
        v[NREC] = n + 1
    elif hit:
        n = v[NHIT]
        hits[n, 0], hits[n, 1] = v[K], hit * bs
        v[NHIT] = n + 1
    _list_append(v, lst, LRUN, i)
    return int(fill)
