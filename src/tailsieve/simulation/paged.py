"""The vLLM-faithful replica (mechanism): paged KV capacity, preemption by recompute, chunked prefill, prefix caching.

One replica serves its requests (submitted in index order at t = 0) as vLLM v1's scheduler does, one scheduling
step per decode iteration (docs/simulator.md specifies it; the brute-force reference in tests/test_paged.py is the
executable form of the same rules). At iteration k:

1. Decode allocation. The running requests are visited in admission order; one decoding its next token must hold
   ⌈(P + g + 1)/B⌉ blocks (P prompt tokens, g generated so far, B = `block_size`). When a block is needed and none
   is free (after evicting unreferenced cached prefixes, least recently released first), the most recently admitted
   running request is preempted: its blocks are freed, it goes to the front of the waiting queue, it keeps its g
   tokens, and it will prefill P + g tokens again (recompute). If it is the request being served, the visit stops.
2. Admission, only in an iteration without preemption: the head of the FCFS waiting queue is admitted while its
   blocks fit (⌈(P + g + 1)/B⌉, less the shared prefix blocks on a prefix-cache hit), the `max_num_seqs` cap
   allows, and (with chunked prefill) token budget is left. Without `max_num_batched_tokens` the admitted prompts
   stall the replica for `prefill_ms_per_token` each token and decode in this same iteration; with it they prefill
   in chunks of the iteration's leftover budget (M − decoding requests, FCFS), and a request decodes its first token
   in the iteration its prefill completes.
3. The iteration: b requests decode one token each, costing τ(b) + kv·(their context) + prefill·(chunk tokens).

Prefix caching: the ⌊(P − 1)/B⌋ full blocks of a prompt shared by a group's requests on one replica (`keys`) are
held once with a reference count; a request admitted while they are resident reuses them (a hit: no prefill, no
blocks for them). Released prefixes stay cached until allocation evicts them (whole prefixes, LRU).

Event to event: between two events (a finish, a preemption, a prefill completion, an admission, the cut) every
iteration has the same batch, so a run of them is one segment of the arithmetic series `ReplicaRun` stores. The
block demand of a run is counted by phase: a decoder needs a new block at iteration k iff k ≡ k₀ − c₀ (mod B).
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from tailsieve.errors import ConfigError

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]

_WAIT, _PREFILL, _DECODE, _DONE = 0, 1, 2, 3


@dataclass(frozen=True, slots=True)
class PagedLimits:
    """The engine limits of one paged replica (`ReplicaConfig` builds it): capacity in blocks (None: unbounded)."""

    blocks: int | None
    block_size: int
    max_num_seqs: int | None
    max_num_batched_tokens: int | None
    prefix_caching: bool
    kv_s_per_token: float
    prefill_s_per_token: float


@dataclass(frozen=True, slots=True, eq=False)
class PagedTrace:
    """What a paged run reports beyond its segments: decode spans and the engine events with their iterations."""

    finish_s: FloatArray
    spans: IntArray  # (n_spans, 3): request, first decode iteration, end iteration (exclusive)
    seg: tuple[IntArray, FloatArray, IntArray, FloatArray, FloatArray]  # k0, t0, n, base, inc
    preempt_k: IntArray  # iteration of every preemption
    recompute: IntArray  # (n, 2): iteration of a re-admission, tokens it prefilled again
    hits: IntArray  # (n, 2): iteration of a prefix hit, prompt tokens it did not prefill


class _Cache:
    """Prefix entries: key → [blocks, references]; the unreferenced ones wait in `lru` (release order), evictable."""

    def __init__(self) -> None:
        self.entries: dict[int, list[int]] = {}
        self.lru: OrderedDict[int, int] = OrderedDict()  # key → blocks, least recently released first
        self.evictable = 0

    def acquire(self, key: int) -> None:
        e = self.entries[key]
        if e[1] == 0:
            self.evictable -= e[0]
            del self.lru[key]
        e[1] += 1

    def release(self, key: int) -> None:
        e = self.entries[key]
        e[1] -= 1
        if e[1] == 0:
            self.evictable += e[0]
            self.lru[key] = e[0]

    def evict(self, need: int) -> int:
        """Evict unreferenced prefixes (least recently released first) until `need` blocks are freed: blocks freed."""
        freed = 0
        while freed < need and self.lru:
            key, blocks = self.lru.popitem(last=False)
            freed += blocks
            self.evictable -= blocks
            del self.entries[key]
        return freed


def run_paged(lens: IntArray, prompts: IntArray, keys: IntArray | None, tau: FloatArray, lim: PagedLimits,
              cut: tuple[int, NDArray[np.bool_]] | None = None) -> PagedTrace:
    """Serve `lens` (decode tokens) with `prompts` on one replica under `lim`; `keys` name each request's shared
    prompt (−1: none); `tau` is τ(0..n) in seconds. With `cut` = (k, keep), the requests not kept leave at the
    boundary of iteration k (a bulk cutoff): their finish time stays inf unless they finished before."""
    return _Paged(lens, prompts, keys, tau, lim, cut).run()


class _Paged:
    """The event loop's state (one replica, one run); `run` is the loop. Decoders are kept lazily: request i decoding
    since iteration ks[i] with context c0[i] then has g0[i] + (k − ks[i]) tokens at iteration k."""

    def __init__(self, lens: IntArray, prompts: IntArray, keys: IntArray | None, tau: FloatArray, lim: PagedLimits,
                 cut: tuple[int, NDArray[np.bool_]] | None) -> None:
        n = int(lens.size)
        self.bs, self.nb, self.tau, self.lim = lim.block_size, lim.blocks, tau, lim
        self.cap = n if lim.max_num_seqs is None else lim.max_num_seqs
        if self.nb is not None and n:
            need = int((-(-(prompts + np.maximum(lens, 1)) // self.bs)).max())
            if need > self.nb:
                raise ConfigError(f"kv_tokens {self.nb * self.bs} cannot hold one request of {need * self.bs} tokens "
                                  f"(prompt + response in blocks of {self.bs}); raise kv_tokens")
        self.L = [int(x) for x in lens]
        self.P = [int(x) for x in prompts]
        share = [0] * n
        if lim.prefix_caching and keys is not None:
            share = [((p - 1) // self.bs if (key >= 0 and p > 0) else 0) for p, key in zip(self.P, keys.tolist(),
                                                                                           strict=True)]
        self.K = [-1] * n if keys is None else [int(x) for x in keys]
        self.S = share
        self.g0 = [0] * n
        self.state = [_WAIT] * n
        self.ks = [0] * n
        self.c0 = [0] * n
        self.pending = [0] * n
        self.pend_total = 0  # Σ pending
        self.uses = [False] * n
        self.version = [0] * n
        self.again = [False] * n  # preempted before: its next prefill is a recompute
        self.finish = np.full(n, np.inf)
        self.spans: list[tuple[int, int, int]] = []
        self.segs: list[tuple[int, float, int, float, float]] = []
        self.pre_k: list[int] = []
        self.recompute: list[tuple[int, int]] = []
        self.hits: list[tuple[int, int]] = []
        self.cache = _Cache()
        self.private = 0
        self.resident = 0
        self.running: list[int] = []
        self.prefilling: list[int] = []
        self.heap: list[tuple[int, int, int]] = []  # (finish iteration, request, version)
        self.phase = [0] * self.bs  # decoders per phase (k₀ − c₀ mod B): who needs a block at iteration k
        self.members: list[set[int]] = [set() for _ in range(self.bs)]
        self.order = [0] * n  # admission sequence number (the running list's order)
        self.admitted = 0
        self.b = 0
        self.ctx = 0
        self.t = 0.0
        self.k = 0
        self.cut = cut
        waiting = []
        for i in range(n):
            if self.L[i] == 0 and lim.max_num_batched_tokens is not None:
                self.finish[i] = 0.0
                self.state[i] = _DONE
            else:
                waiting.append(i)
        self.waiting = waiting[::-1]  # a stack: the head of the FCFS queue is the last element

    # blocks ---------------------------------------------------------------------------------------------------
    def avail(self) -> int:
        """Blocks an allocation may take now (free ones and unreferenced cached prefixes)."""
        if self.nb is None:
            return 1 << 62
        return self.nb - self.private - self.resident + self.cache.evictable

    def take(self, blocks: int) -> None:
        """Allocate `blocks` private blocks, evicting cached prefixes (LRU) when the free ones do not suffice."""
        if self.nb is not None:
            free = self.nb - self.private - self.resident
            if free < blocks:
                self.resident -= self.cache.evict(blocks - free)
        self.private += blocks

    def held(self, i: int) -> int:
        """Private blocks request i holds at the current boundary."""
        if self.state[i] == _DECODE:
            total = -(-(self.c0[i] + max(self.k - self.ks[i], 1)) // self.bs)
        elif self.state[i] == _PREFILL:
            total = -(-(self.P[i] + self.g0[i] + 1) // self.bs)
        else:
            return 0
        return total - (self.S[i] if self.uses[i] else 0)

    # state changes --------------------------------------------------------------------------------------------
    def start_decode(self, i: int, ks: int) -> None:
        """Request i decodes from iteration ks on (its block for that iteration's token is already held)."""
        self.state[i] = _DECODE
        self.ks[i], self.c0[i] = ks, self.P[i] + self.g0[i]
        self.b += 1
        self.ctx += self.c0[i] + (self.k - ks)
        ph = (ks - self.c0[i]) % self.bs
        self.phase[ph] += 1
        self.members[ph].add(i)
        heapq.heappush(self.heap, (ks + self.L[i] - self.g0[i], i, self.version[i]))

    def leave(self, i: int, new_state: int) -> None:
        """Request i stops running (finished, preempted or aborted): blocks and prefix reference released."""
        self.private -= self.held(i)
        if self.uses[i]:
            self.cache.release(self.K[i])
            self.uses[i] = False
        if self.state[i] == _DECODE:
            done = self.k - self.ks[i]
            self.b -= 1
            self.ctx -= self.c0[i] + done
            ph = (self.ks[i] - self.c0[i]) % self.bs
            self.phase[ph] -= 1
            self.members[ph].discard(i)
            self.spans.append((i, self.ks[i], self.k))
            self.g0[i] += done
            self.version[i] += 1
        elif self.state[i] == _PREFILL and i in self.prefilling:
            self.prefilling.remove(i)
            self.pend_total -= self.pending[i]
            self.pending[i] = 0
        self.running.remove(i)
        self.state[i] = new_state

    def preempt_newest(self) -> int:
        """vLLM v1's preemption: the most recently admitted running request re-queues first (recompute)."""
        victim = self.running[-1]
        self.leave(victim, _WAIT)
        self.waiting.append(victim)
        self.again[victim] = True
        self.pre_k.append(self.k)
        return victim

    # the scheduling step ----------------------------------------------------------------------------------------
    def allocate(self) -> bool:
        """Step 1: every decoder crossing a block boundary at this iteration gets a block; True if any preemption."""
        need = self.phase[self.k % self.bs] if self.b else 0
        if need == 0:
            return False
        if need <= self.avail():
            self.take(need)
            return False
        order = self.order
        for i in sorted(self.members[self.k % self.bs], key=order.__getitem__):
            if self.state[i] != _DECODE:
                continue
            while self.avail() < 1:
                if self.preempt_newest() == i:
                    return True
            self.take(1)
        return True

    def admit(self) -> float:
        """Step 2: FCFS admission while blocks, the seq cap and the token budget allow; the prefill stall (s)."""
        m = self.lim.max_num_batched_tokens
        used = self.b + self.pend_total
        stall, empty = 0, []
        while self.waiting and len(self.running) < self.cap and (m is None or used < m):
            i = self.waiting[-1]
            blocks = -(-(self.P[i] + self.g0[i] + 1) // self.bs)
            entry = self.cache.entries.get(self.K[i]) if self.S[i] else None
            if entry is not None:
                blocks -= self.S[i]
            pinned = entry[0] if entry is not None and entry[1] == 0 else 0  # its own prefix is not evictable
            if blocks > self.avail() - pinned:
                break
            self.waiting.pop()
            if entry is not None:
                self.cache.acquire(self.K[i])
            self.take(blocks)
            if self.S[i] and entry is None:  # the group's first request here caches the prompt's full blocks
                self.private -= self.S[i]
                self.resident += self.S[i]
                self.cache.entries[self.K[i]] = [self.S[i], 1]
            self.uses[i] = self.S[i] > 0
            fill = self.P[i] + self.g0[i] - (self.S[i] * self.bs if entry is not None else 0)
            if entry is not None:
                self.hits.append((self.k, self.S[i] * self.bs))
            if self.again[i]:
                self.recompute.append((self.k, fill))
            self.running.append(i)
            self.admitted += 1
            self.order[i] = self.admitted
            if m is None:
                stall += fill
                self.state[i] = _PREFILL
                if self.L[i] == self.g0[i]:  # nothing to decode: done once its prompt is in, blocks back now
                    empty.append(i)
                    self.leave(i, _DONE)
                else:
                    self.start_decode(i, self.k)
            else:
                self.state[i], self.pending[i] = _PREFILL, fill
                self.pend_total += fill
                self.prefilling.append(i)
                used += fill
        t = self.t + self.lim.prefill_s_per_token * stall
        self.finish[empty] = t
        return self.lim.prefill_s_per_token * stall

    def run(self) -> PagedTrace:
        """The event loop (module docstring)."""
        cut_k = -1 if self.cut is None else self.cut[0]
        while True:
            if self.k == cut_k:
                self.abort()
                cut_k = -1
            preempted = self.allocate()
            if not preempted:
                self.t += self.admit()
            if not self.running:
                if self.waiting:
                    raise ConfigError("paged replica stalled: a waiting request can never be admitted")
                break
            chunk, completing = self.chunks()
            s = 1 if completing or preempted else self.span(chunk, cut_k)
            self.advance(s, chunk, completing)
            if not self.running and not self.waiting:
                break
        return self.trace()

    def abort(self) -> None:
        """The cut: the requests not kept leave at this boundary (running or waiting)."""
        assert self.cut is not None
        keep = self.cut[1]
        for i in [i for i in self.running if not keep[i]]:
            self.leave(i, _DONE)
        self.waiting = [i for i in self.waiting if keep[i]]

    def chunks(self) -> tuple[int, list[int]]:
        """This iteration's prefill tokens (the budget left by the decoders, FCFS) and the requests it completes."""
        m = self.lim.max_num_batched_tokens
        if not self.prefilling or m is None:
            return 0, []
        rem, chunk, completing = max(m - self.b, 0), 0, []
        for i in self.prefilling:
            if rem <= 0:
                break
            step = min(rem, self.pending[i])
            rem -= step
            chunk += step
            if step == self.pending[i]:
                completing.append(i)
        return chunk, completing

    def span(self, chunk: int, cut_k: int) -> int:
        """Iterations from here with the same batch: up to the next finish, prefill completion, block shortage or
        the cut (at least 1)."""
        heap = self.heap
        while heap and heap[0][2] != self.version[heap[0][1]]:
            heapq.heappop(heap)
        s = heap[0][0] - self.k if heap else 1 << 62
        if chunk:  # the head's prefill does not complete in this iteration: it completes in a later single one
            s = min(s, -(-self.pending[self.prefilling[0]] // chunk) - 1)
        if cut_k > self.k:
            s = min(s, cut_k - self.k)
        if self.b and self.nb is not None:
            s = min(s, _first_shortage(self.phase, self.b, self.k, self.avail(), self.bs))
        if s >= 1 << 61:
            raise ConfigError("paged replica stalled: no request can make progress")
        return max(s, 1)

    def advance(self, s: int, chunk: int, completing: list[int]) -> None:
        """Run s iterations of the current batch (the completing prefills join it in a single one), then finish."""
        lim = self.lim
        bb = self.b + len(completing)
        cc = self.ctx + sum(self.P[i] + self.g0[i] for i in completing)
        base = float(self.tau[bb]) + lim.kv_s_per_token * cc + lim.prefill_s_per_token * chunk
        inc = lim.kv_s_per_token * self.b
        self.segs.append((self.k, self.t, s, base, inc))
        self.t += s * base + inc * s * (s - 1) / 2.0
        if chunk:
            rem, pending = chunk * s, self.pending
            self.pend_total -= rem
            for i in self.prefilling:
                step = pending[i] if pending[i] < rem else rem
                pending[i] -= step
                rem -= step
                if rem <= 0:
                    break
        if s > 1 and self.b and self.nb is not None:  # blocks of the iterations inside the run
            self.take(_demand(self.phase, self.b, self.k, s - 1, self.bs))
        self.ctx += self.b * s
        self.k += s
        for i in completing:
            self.prefilling.remove(i)
            self.start_decode(i, self.k - 1)
        heap = self.heap
        while heap and heap[0][0] <= self.k:
            _, i, v = heapq.heappop(heap)
            if v == self.version[i] and self.state[i] == _DECODE:
                self.finish[i] = self.t
                self.leave(i, _DONE)

    def trace(self) -> PagedTrace:
        """The run's record."""
        if self.segs:
            k0, t0, sn, sb, si = (np.asarray(c) for c in zip(*self.segs, strict=True))
            seg = (k0.astype(np.int64), t0.astype(np.float64), sn.astype(np.int64), sb.astype(np.float64),
                   si.astype(np.float64))
        else:
            z, zf = np.zeros(0, np.int64), np.zeros(0)
            seg = (z, zf, z, zf, zf)
        return PagedTrace(self.finish, np.asarray(self.spans, np.int64).reshape(-1, 3), seg,
                          np.asarray(self.pre_k, np.int64), np.asarray(self.recompute, np.int64).reshape(-1, 2),
                          np.asarray(self.hits, np.int64).reshape(-1, 2))


def _demand(phase: list[int], b: int, k: int, j: int, bs: int) -> int:
    """Blocks the decoders need over iterations k+1..k+j (those of phase φ need one at every k' ≡ φ mod B)."""
    full, part = divmod(j, bs)
    return full * b + sum(phase[(k + d) % bs] for d in range(1, part + 1))


def _first_shortage(phase: list[int], b: int, k: int, free: int, bs: int) -> int:
    """Iterations from k that run before a block is short: the first j ≥ 1 at which the blocks needed over iterations
    k+1..k+j exceed `free`."""
    full = free // b  # whole periods of B iterations, each needing b blocks
    left = free - full * b
    j = full * bs
    for d in range(1, bs + 1):
        c = phase[(k + j + d) % bs]
        if c > left:
            return j + d
        left -= c
    return j + bs + 1  # not reached: a whole period needs b > left blocks
