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

import numpy as np
from numpy.typing import NDArray

from tailsieve.errors import ConfigError
from tailsieve.simulation.paged_blocks import PagedLimits, PagedTrace, PrefixCache, demand, first_shortage

__all__ = ["PagedLimits", "PagedTrace", "run_paged"]

IntArray = NDArray[np.int64]

_WAIT, _PREFILL, _DECODE, _DONE = 0, 1, 2, 3
_BIG = 1 << 62  # "no bound": more iterations or blocks than any run has


def run_paged(lens: IntArray, prompts: IntArray, keys: IntArray | None, tau: NDArray[np.float64], lim: PagedLimits,
              cut: tuple[int, NDArray[np.bool_]] | None = None) -> PagedTrace:
    """Serve `lens` (decode tokens) with `prompts` on one replica under `lim`; `keys` name each request's shared
    prompt (−1: none); `tau` is τ(0..n) in seconds. With `cut` = (k, keep), the requests not kept leave at the
    boundary of iteration k (a bulk cutoff): their finish time stays inf unless they finished before."""
    return _Paged(lens, prompts, keys, tau, lim, cut).run()


class _Paged:
    """The event loop's state (one replica, one run); `run` is the loop. Decoders are kept lazily: request i decoding
    since iteration ks[i] with context c0[i] then has g0[i] + (k − ks[i]) tokens at iteration k. Plain lists and
    locals, not arrays: a step touches a handful of requests, and the loop runs once per event."""

    def __init__(self, lens: IntArray, prompts: IntArray, keys: IntArray | None, tau: NDArray[np.float64],
                 lim: PagedLimits, cut: tuple[int, NDArray[np.bool_]] | None) -> None:
        n = int(lens.size)
        self.bs, self.nb, self.tau, self.lim = lim.block_size, lim.blocks, tau.tolist(), lim
        self.m, self.kv, self.pre = lim.max_num_batched_tokens, lim.kv_s_per_token, lim.prefill_s_per_token
        self.cap = n if lim.max_num_seqs is None else lim.max_num_seqs
        if self.nb is not None and n:
            need = int((-(-(prompts + np.maximum(lens, 1)) // self.bs)).max())
            if need > self.nb:
                raise ConfigError(f"kv_tokens {self.nb * self.bs} cannot hold one request of {need * self.bs} tokens "
                                  f"(prompt + response in blocks of {self.bs}); raise kv_tokens")
        self.L, self.P = lens.tolist(), prompts.tolist()
        self.K = [-1] * n if keys is None else keys.tolist()
        self.S = [0] * n  # full prompt blocks shared with the request's group (prefix caching)
        if lim.prefix_caching and keys is not None:
            self.S = [((p - 1) // self.bs if (key >= 0 and p > 0) else 0)
                      for p, key in zip(self.P, self.K, strict=True)]
        self.g0, self.state, self.ks, self.c0, self.pending = [0] * n, [_WAIT] * n, [0] * n, [0] * n, [0] * n
        self.pend_total = 0  # Σ pending
        self.uses, self.again = [False] * n, [False] * n  # holds a prefix reference; preempted before (recompute)
        self.version = [0] * n
        self.finish = [float("inf")] * n
        self.spans: list[tuple[int, int, int]] = []
        self.segs: list[tuple[int, float, int, float, float]] = []
        self.pre_k: list[int] = []
        self.recompute: list[tuple[int, int]] = []
        self.hits: list[tuple[int, int]] = []
        self.cache = PrefixCache()
        self.private = self.resident = 0
        self.running: list[int] = []
        self.prefilling: list[int] = []
        self.heap: list[tuple[int, int, int]] = []  # (finish iteration, request, version)
        self.phase = [0] * self.bs  # decoders per phase (k₀ − c₀ mod B): who needs a block at iteration k
        self.members: list[set[int]] = [set() for _ in range(self.bs)]
        self.order = [0] * n  # admission sequence number (the running list's order)
        self.admitted = self.b = self.ctx = self.k = 0
        self.t = 0.0
        self.cut = cut
        chunked = lim.max_num_batched_tokens is not None
        for i in range(n):
            if chunked and self.L[i] == 0:
                self.finish[i], self.state[i] = 0.0, _DONE
        self.waiting = [i for i in range(n - 1, -1, -1) if self.state[i] == _WAIT]  # a stack: the head is last

    # blocks ---------------------------------------------------------------------------------------------------
    def avail(self) -> int:
        """Blocks an allocation may take now (free ones and unreferenced cached prefixes)."""
        if self.nb is None:
            return _BIG
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
        st = self.state[i]
        if st == _DECODE:
            total = -(-(self.c0[i] + max(self.k - self.ks[i], 1)) // self.bs)
        elif st == _PREFILL:
            total = -(-(self.P[i] + self.g0[i] + 1) // self.bs)
        else:
            return 0
        return total - (self.S[i] if self.uses[i] else 0)

    # state changes --------------------------------------------------------------------------------------------
    def start_decode(self, i: int, ks: int) -> None:
        """Request i decodes from iteration ks on (its block for that iteration's token is already held)."""
        self.state[i] = _DECODE
        c0 = self.P[i] + self.g0[i]
        self.ks[i], self.c0[i] = ks, c0
        self.b += 1
        self.ctx += c0 + (self.k - ks)
        ph = (ks - c0) % self.bs
        self.phase[ph] += 1
        self.members[ph].add(i)
        heapq.heappush(self.heap, (ks + self.L[i] - self.g0[i], i, self.version[i]))

    def leave(self, i: int, new_state: int) -> None:
        """Request i stops running (finished, preempted or aborted): blocks and prefix reference released."""
        self.private -= self.held(i)
        if self.uses[i]:
            self.cache.release(self.K[i])
            self.uses[i] = False
        st = self.state[i]
        if st == _DECODE:
            ks, c0 = self.ks[i], self.c0[i]
            done = self.k - ks
            self.b -= 1
            self.ctx -= c0 + done
            ph = (ks - c0) % self.bs
            self.phase[ph] -= 1
            self.members[ph].discard(i)
            self.spans.append((i, ks, self.k))
            self.g0[i] += done
            self.version[i] += 1
        elif st == _PREFILL and i in self.prefilling:
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
        if not self.b:
            return False
        ph = self.k % self.bs
        need = self.phase[ph]
        if not need:
            return False
        if self.nb is None:
            self.private += need
            return False
        free = self.nb - self.private - self.resident
        if need <= free:
            self.private += need
            return False
        if need <= free + self.cache.evictable:
            self.resident -= self.cache.evict(need - free)
            self.private += need
            return False
        order, state = self.order, self.state
        for i in sorted(self.members[ph], key=order.__getitem__):
            if state[i] != _DECODE:
                continue
            while self.avail() < 1:
                if self.preempt_newest() == i:
                    return True
            self.take(1)
        return True

    def admit(self) -> float:
        """Step 2: FCFS admission while blocks, the seq cap and the token budget allow; the prefill stall (s)."""
        m, bs, cache, waiting, running = self.m, self.bs, self.cache, self.waiting, self.running
        P, g0, S, K = self.P, self.g0, self.S, self.K
        used = self.b + self.pend_total
        stall, empty = 0, []
        while waiting and len(running) < self.cap and (m is None or used < m):
            i = waiting[-1]
            blocks, share = (P[i] + g0[i] + bs) // bs, S[i]  # ⌈(P + g + 1)/B⌉
            entry = cache.entries.get(K[i]) if share else None
            pinned = 0
            if entry is not None:
                blocks -= share
                if entry[1] == 0:
                    pinned = entry[0]  # its own prefix is not evictable
            if blocks > self.avail() - pinned:
                break
            waiting.pop()
            fill = self.admit_one(i, blocks, entry)
            if m is None:
                stall += fill
                self.state[i] = _PREFILL
                if self.L[i] == g0[i]:  # nothing to decode: done once its prompt is in, blocks back now
                    empty.append(i)
                    self.leave(i, _DONE)
                else:
                    self.start_decode(i, self.k)
            else:
                self.state[i], self.pending[i] = _PREFILL, fill
                self.pend_total += fill
                self.prefilling.append(i)
                used += fill
        if empty:
            t = self.t + self.pre * stall
            for i in empty:
                self.finish[i] = t
        return self.pre * stall

    def admit_one(self, i: int, blocks: int, entry: list[int] | None) -> int:
        """Request i joins the running list holding `blocks` private blocks (and its group's cached prefix if
        `entry`); the prompt and generated tokens it prefills."""
        share, key = self.S[i], self.K[i]
        if entry is not None:
            self.cache.acquire(key)
        self.take(blocks)
        if share and entry is None:  # the group's first request here caches the prompt's full blocks
            self.private -= share
            self.resident += share
            self.cache.entries[key] = [share, 1]
        self.uses[i] = share > 0
        fill = self.P[i] + self.g0[i]
        if entry is not None:
            fill -= share * self.bs
            self.hits.append((self.k, share * self.bs))
        if self.again[i]:
            self.recompute.append((self.k, fill))
        self.running.append(i)
        self.admitted += 1
        self.order[i] = self.admitted
        return fill

    def run(self) -> PagedTrace:
        """The event loop (module docstring)."""
        cut_k = -1 if self.cut is None else self.cut[0]
        chunked = self.m is not None
        while True:
            if self.k == cut_k:
                self.abort()
                cut_k = -1
            preempted = self.allocate()
            if not preempted and self.waiting:
                stall = self.admit()
                if stall:
                    self.t += stall
            if not self.running:
                if self.waiting:
                    raise ConfigError("paged replica stalled: a waiting request can never be admitted")
                break
            chunk, completing = self.chunks() if chunked and self.prefilling else (0, [])
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
        s = heap[0][0] - k if heap else _BIG
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
            raise ConfigError("paged replica stalled: no request can make progress")
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
        heap, version, state = self.heap, self.version, self.state
        while heap and heap[0][0] <= k:
            _, i, v = heapq.heappop(heap)
            if v == version[i] and state[i] == _DECODE:
                self.finish[i] = t
                self.leave(i, _DONE)

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

    def trace(self) -> PagedTrace:
        """The run's record."""
        if self.segs:
            k0, t0, sn, sb, si = (np.asarray(c) for c in zip(*self.segs, strict=True))
            seg = (k0.astype(np.int64), t0.astype(np.float64), sn.astype(np.int64), sb.astype(np.float64),
                   si.astype(np.float64))
        else:
            z, zf = np.zeros(0, np.int64), np.zeros(0)
            seg = (z, zf, z, zf, zf)
        return PagedTrace(np.asarray(self.finish, np.float64), np.asarray(self.spans, np.int64).reshape(-1, 3), seg,
                          np.asarray(self.pre_k, np.int64), np.asarray(self.recompute, np.int64).reshape(-1, 2),
                          np.asarray(self.hits, np.int64).reshape(-1, 2))
