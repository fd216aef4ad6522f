"""The vLLM-faithful replica (mechanism): paged KV capacity, preemption by recompute, chunked prefill, prefix caching.

One replica serves its requests (submitted in index order at t = 0) as vLLM v1's scheduler does, one scheduling
step per decode iteration (docs/simulator.md specifies it; the brute-force reference in tests/test_paged.py is the
executable form of the same rules). At iteration k:

1. Decode allocation. The running requests are visited in admission order; one decoding its next token must hold
   ⌈(P + g + 1)/B⌉ blocks (P prompt tokens, g generated so far, B = `block_size`), taken from the head of the free
   queue (`paged_blocks.BlockPool`: vLLM's, unhashed blocks first, then hashed ones by release time). When it is
   empty, the most recently admitted running request is preempted: its blocks go back to the queue, it goes to the
   front of the waiting queue, it keeps its g tokens, and it will prefill again the P + g tokens its surviving
   cached blocks do not cover (recompute). If it is the request being served, the visit stops.
2. Admission, only in an iteration without preemption: the head of the FCFS waiting queue is admitted while its
   blocks fit (⌈(P + g + 1)/B⌉ from the queue, less its group's prompt prefix when running requests hold it), the
   `max_num_seqs` cap allows, and (with chunked prefill) token budget is left. Without `max_num_batched_tokens` the
   admitted prompts stall the replica for `prefill_ms_per_token` each token and decode in this same iteration; with
   it they prefill in chunks of the iteration's leftover budget (M − decoding requests, FCFS), and a request decodes
   its first token in the iteration its prefill completes.
3. The iteration: b requests decode one token each, costing τ(b) + kv·(their context) + prefill·(chunk tokens).

Prefix caching: the ⌊(P − 1)/B⌋ full blocks of a prompt shared by a group's requests on one replica (`keys`) are
held once with a reference count; an admission reuses the longest prefix of its blocks still cached (the prompt's,
then a re-admitted request's own), with no prefill for them. Released blocks stay cached until an allocation
evicts them, from the queue's head.

Event to event: between two events (a finish, a preemption, a prefill completion, an admission, the cut) every
iteration has the same batch, so a run of them is one segment of the arithmetic series `ReplicaRun` stores. The
block demand of a run is counted by phase: a decoder needs a new block at iteration k iff k ≡ k₀ − c₀ (mod B).

Two engines: `_Paged` below (Python), and, with numba installed (the `fast` extra), the same loop compiled
(`model.paged_kernel`), which `run_paged` prefers; their records are bit-identical (tests/test_paged_kernel.py).
"""

from __future__ import annotations

import heapq
import importlib.util
import warnings
from collections.abc import Callable

import numpy as np
from numpy.typing import NDArray

from tailsieve.errors import ConfigError
from tailsieve.model.paged_blocks import PagedLimits, PagedTrace, demand, first_shortage
from tailsieve.model.paged_state import BIG, DONE, NO_PROGRESS_MSG, PREFILL, STALLED_MSG, PagedState, check_fits

__all__ = ["PagedLimits", "PagedTrace", "run_paged"]

IntArray = NDArray[np.int64]
USE_KERNEL = importlib.util.find_spec("numba") is not None  # the compiled loop (`fast` extra); tests run both


def _kernel() -> Callable[..., PagedTrace] | None:
    """`paged_kernel.run_kernel`, imported on the first paged run (numba takes 0.2 s to import); None, and the
    Python engine from then on, when numba is there but does not load."""
    global USE_KERNEL
    from tailsieve.model import paged_kernel

    if not paged_kernel.COMPILED:
        USE_KERNEL = False
        return None
    return paged_kernel.run_kernel


def run_paged(lens: IntArray, prompts: IntArray, keys: IntArray | None, tau: NDArray[np.float64], lim: PagedLimits,
              cut: tuple[int, NDArray[np.bool_]] | None = None) -> PagedTrace:
    """Serve `lens` (decode tokens) with `prompts` on one replica under `lim`; `keys` name each request's shared
    prompt (−1: none); `tau` is τ(0..n) in seconds. With `cut` = (k, keep), the requests not kept leave at the
    boundary of iteration k (a bulk cutoff): their finish time stays inf unless they finished before."""
    global USE_KERNEL
    run_kernel = _kernel() if USE_KERNEL else None
    if run_kernel is None:
        return _Paged(lens, prompts, keys, tau, lim, cut).run()
    check_fits(lens, prompts, lim)
    try:
        return run_kernel(lens, prompts, keys, tau, lim, cut)
    except Exception as exc:  # numba installed but unable to compile here: the Python engine, the same results
        if not type(exc).__module__.startswith("numba"):
            raise
        USE_KERNEL = False
        warnings.warn(f"the compiled paged engine is unavailable ({type(exc).__name__}); running the Python one",
                      RuntimeWarning, stacklevel=2)
        return _Paged(lens, prompts, keys, tau, lim, cut).run()


class _Paged(PagedState):
    """The event loop (one replica, one run): the scheduling step of the module docstring, `run` the loop."""

    # the scheduling step ----------------------------------------------------------------------------------------
    def allocate(self) -> bool:
        """Step 1: every decoder crossing a block boundary at this iteration gets a block; True if any preemption."""
        if not self.b:
            return False
        ph = self.k % self.bs
        need = self.phase[ph]
        if not need:
            return False
        if self.nb is None:
            self.private += need
            return False
        if need <= self.pool.total:
            self.take(need)
            return False
        return self.preempt_for(ph)

    def admit(self) -> float:
        """Step 2: FCFS admission while blocks, the seq cap and the token budget allow; the prefill stall (s)."""
        m, waiting, running = self.m, self.waiting, self.running
        g0 = self.g0
        used = self.b + self.pend_total
        stall, empty = 0, []
        while waiting and len(running) < self.cap and (m is None or used < m):
            i = waiting[-1]
            if not self.fits(i):
                break
            waiting.pop()
            fill = self.admit_one(i)
            if m is None:
                stall += fill
                self.state[i] = PREFILL
                if self.L[i] == g0[i]:  # nothing to decode: done once its prompt is in, blocks back now
                    empty.append(i)
                    self.leave(i, DONE)
                else:
                    self.start_decode(i, self.k)
            else:
                self.state[i], self.pending[i] = PREFILL, fill
                self.pend_total += fill
                self.prefilling.append(i)
                used += fill
        if empty:
            t = self.t + self.pre * stall
            for i in empty:
                self.finish[i] = t
        return self.pre * stall

    def fits(self, i: int) -> bool:
        """Whether request i's ⌈(P + g + 1)/B⌉ blocks fit: all of them from the free queue (its cached blocks are
        in it), less its prompt prefix when other running requests hold that."""
        blocks = (self.P[i] + self.g0[i] + self.bs) // self.bs
        if self.S[i] and self.K[i] in self.refs:
            blocks -= self.S[i]
        return blocks <= self.pool.total

    def admit_one(self, i: int) -> int:
        """Request i joins the running list: it reuses the longest prefix of its blocks still cached (its group's
        prompt prefix, then, re-admitted after a preemption, its own blocks), allocates the rest; the tokens it
        prefills. A hit on a first admission counts as a prefix hit, on a re-admission it shortens the recompute."""
        share, key, bs, pool, refs = self.S[i], self.K[i], self.bs, self.pool, self.refs
        blocks = (self.P[i] + self.g0[i] + bs) // bs - share
        hit = fresh = 0
        if share:
            if key in refs:
                refs[key] += 1
                hit = share
            else:  # the group's first running request here: what survives of the prompt, the rest computed again
                hit = pool.remove(key)
                refs[key] = 1
                self.resident += share
                fresh = share - hit
        own = 0
        if self.again[i]:
            if hit == share:
                own = pool.remove(-2 - i)
            else:  # the chain of block hashes breaks inside the prompt: its own blocks cannot be hit
                pool.forget(-2 - i)
        pool.take(fresh + blocks - own)
        self.private += blocks
        self.uses[i] = share > 0
        fill = self.P[i] + self.g0[i] - (hit + own) * bs
        if self.again[i]:
            self.recompute.append((self.k, fill))
        elif hit:
            self.hits.append((self.k, hit * bs))
        self.running.append(i)
        return fill

    def run(self) -> PagedTrace:
        """The event loop (module docstring). `carried`: a storm ended after the next pass's allocation (its flag)."""
        cut_k = -1 if self.cut is None else self.cut[0]
        chunked, carried = self.m is not None, None
        while True:
            if carried is None:
                if self.k == cut_k:
                    self.abort()
                    cut_k = -1
                preempted = self.allocate()
            else:
                preempted, carried = carried, None
            if not preempted and self.waiting:
                stall = self.admit()
                if stall:
                    self.t += stall
            if not self.running:
                if self.waiting:
                    raise ConfigError(STALLED_MSG)
                break
            chunk, completing = self.chunks() if chunked and self.prefilling else (0, [])
            if preempted or completing or self.prefilling or not self.waiting or self.nb is None:
                s = 1 if completing or preempted else self.span(chunk, cut_k)
                self.advance(s, chunk, completing)
            else:  # the head waits for blocks: spans and preemptions until a finish lets the generic pass admit
                carried = self.storm(cut_k)
            if not self.running and not self.waiting:
                break
        return self.trace()

    def storm(self, cut_k: int) -> bool | None:
        """The passes of `run` while the waiting head cannot be admitted, nothing prefills and nothing finishes (a
        preemption storm), with their span and advance inlined: the same segments, fewer calls. Returns at a pass
        boundary: None before its allocation, else the allocation's preemption flag (the pass goes on from there)."""
        bs, nb, phase, heap, version, tau, kv, segs = (self.bs, self.nb, self.phase, self.heap, self.version, self.tau,
                                                        self.kv, self.segs)
        assert nb is not None
        preempted = False
        while True:
            k, b, t = self.k, self.b, self.t
            if preempted:
                s = 1
            else:
                while heap and heap[0][2] != version[heap[0][1]]:
                    heapq.heappop(heap)
                s = heap[0][0] - k if heap else BIG
                if cut_k > k:
                    s = min(s, cut_k - k)
                if b and s > 1:
                    free = self.pool.total
                    if s > (free // b) * bs + 1:
                        s = min(s, first_shortage(phase, b, k, free, bs))
                if s >= 1 << 61:
                    raise ConfigError(NO_PROGRESS_MSG)
                s = max(s, 1)
            base, inc = tau[b] + kv * self.ctx, kv * b
            segs.append((k, t, s, base, inc))
            self.t = t = t + (s * base + inc * s * (s - 1) / 2.0)
            if s > 1 and b:
                self.take(demand(phase, b, k, s - 1, bs))
            self.ctx += b * s
            self.k = k = k + s
            if heap and heap[0][0] <= k and self.finish_due(k, t):
                return None
            if k == cut_k or not self.waiting:
                return None
            need = phase[k % bs] if b else 0
            pool = self.pool
            if need and need <= pool.anon:  # `allocate`'s common case
                pool.anon -= need
                pool.total -= need
                self.private += need
                preempted = False
            else:
                preempted = self.allocate()
            if preempted:
                if not self.running:
                    return True
            elif self.head_fits():
                return False

    def head_fits(self) -> bool:
        """Whether `admit` would admit the waiting head now (the first test of its loop)."""
        m = self.m
        if len(self.running) >= self.cap or (m is not None and self.b + self.pend_total >= m):
            return False
        return self.fits(self.waiting[-1])

    def abort(self) -> None:
        """The cut: the requests not kept leave at this boundary (running or waiting)."""
        assert self.cut is not None
        keep = self.cut[1]
        for i in [i for i in self.running if not keep[i]]:
            self.leave(i, DONE)
        self.waiting = [i for i in self.waiting if keep[i]]

    def chunks(self) -> tuple[int, list[int]]:
        """This iteration's prefill tokens (the budget left by the decoders, FCFS) and the requests it completes."""
        assert self.m is not None
        rem, chunk, completing, pending = max(self.m - self.b, 0), 0, [], self.pending
        for i in self.prefilling:
            if rem <= 0:
                break
            step = min(rem, pending[i])
            rem -= step
            chunk += step
            if step == pending[i]:
                completing.append(i)
        return chunk, completing

    def span(self, chunk: int, cut_k: int) -> int:
        """Iterations from here with the same batch: up to the next finish, prefill completion, block shortage or
        the cut (at least 1)."""
        heap, version, k = self.heap, self.version, self.k
        while heap and heap[0][2] != version[heap[0][1]]:
            heapq.heappop(heap)
        s = heap[0][0] - k if heap else BIG
        if chunk:  # the head's prefill does not complete in this iteration: it completes in a later single one
            s = min(s, -(-self.pending[self.prefilling[0]] // chunk) - 1)
        if cut_k > k:
            s = min(s, cut_k - k)
        b = self.b
        if b and self.nb is not None and s > 1:
            free = self.avail()
            if s > (free // b) * self.bs + 1:  # a shortage may come first (it cannot within whole periods)
                s = min(s, first_shortage(self.phase, b, k, free, self.bs))
        if s >= 1 << 61:
            raise ConfigError(NO_PROGRESS_MSG)
        return max(s, 1)

    def advance(self, s: int, chunk: int, completing: list[int]) -> None:
        """Run s iterations of the current batch (the completing prefills join it in a single one), then finish."""
        b, k, t = self.b, self.k, self.t
        cc = self.ctx
        if completing:
            cc += sum(self.P[i] + self.g0[i] for i in completing)
        base = self.tau[b + len(completing)] + self.kv * cc + self.pre * chunk
        inc = self.kv * b
        self.segs.append((k, t, s, base, inc))
        self.t = t = t + (s * base + inc * s * (s - 1) / 2.0)
        if chunk:
            self.drain(chunk * s)
        if s > 1 and b and self.nb is not None:  # blocks of the iterations inside the run
            self.take(demand(self.phase, b, k, s - 1, self.bs))
        self.ctx += b * s
        self.k = k = k + s
        for i in completing:
            self.prefilling.remove(i)
            self.start_decode(i, k - 1)
        if self.heap and self.heap[0][0] <= k:
            self.finish_due(k, t)

    def drain(self, rem: int) -> None:
        """`rem` prefill tokens done, FCFS over the prefilling requests."""
        pending = self.pending
        self.pend_total -= rem
        for i in self.prefilling:
            step = pending[i] if pending[i] < rem else rem
            pending[i] -= step
            rem -= step
            if rem <= 0:
                break

