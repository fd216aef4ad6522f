"""The paged replica's state (`model.paged`): requests, blocks, the prefix cache, the decoders by phase, and the
state changes the scheduling step makes (admission, decode start, leaving, preemption, finishing), with the run's
record (docs/simulator.md). Plain lists and locals, not arrays: a step touches a handful of requests."""

from __future__ import annotations

import heapq

import numpy as np
from numpy.typing import NDArray

from tailsieve.errors import ConfigError
from tailsieve.model.paged_blocks import BlockPool, PagedLimits, PagedTrace

IntArray = NDArray[np.int64]

WAIT, PREFILL, DECODE, DONE = 0, 1, 2, 3
STALLED_MSG = "paged replica stalled: a waiting request can never be admitted"
NO_PROGRESS_MSG = "paged replica stalled: no request can make progress"
BIG = 1 << 62  # "no bound": more iterations or blocks than any run has


def check_fits(lens: IntArray, prompts: IntArray, lim: PagedLimits) -> None:
    """Refuse a capacity that cannot hold the largest request alone (prompt + response, whole blocks)."""
    if lim.blocks is not None and lens.size:
        need = int((-(-(prompts + np.maximum(lens, 1)) // lim.block_size)).max())
        if need > lim.blocks:
            raise ConfigError(f"kv_tokens {lim.blocks * lim.block_size} cannot hold one request of "
                              f"{need * lim.block_size} tokens (prompt + response in blocks of {lim.block_size}); "
                              "raise kv_tokens")


class PagedState:
    """One replica's state in one run. Decoders are kept lazily: request i decoding since iteration ks[i] with context
    c0[i] then has g0[i] + (k − ks[i]) tokens at iteration k."""

    def __init__(self, lens: IntArray, prompts: IntArray, keys: IntArray | None, tau: NDArray[np.float64],
                 lim: PagedLimits, cut: tuple[int, NDArray[np.bool_]] | None) -> None:
        n = int(lens.size)
        self.bs, self.nb, self.lim = lim.block_size, lim.blocks, lim
        self.tau: list[float] = tau.tolist()
        self.m, self.kv, self.pre = lim.max_num_batched_tokens, lim.kv_s_per_token, lim.prefill_s_per_token
        self.cap = n if lim.max_num_seqs is None else lim.max_num_seqs
        check_fits(lens, prompts, lim)
        self.L: list[int] = lens.tolist()
        self.P: list[int] = prompts.tolist()
        self.K: list[int] = [-1] * n if keys is None else keys.tolist()
        self.S = [0] * n  # full prompt blocks shared with the request's group (prefix caching)
        if lim.prefix_caching and keys is not None:
            self.S = [((p - 1) // self.bs if (key >= 0 and p > 0) else 0)
                      for p, key in zip(self.P, self.K, strict=True)]
        self.g0, self.state, self.ks, self.c0, self.pending = [0] * n, [WAIT] * n, [0] * n, [0] * n, [0] * n
        self.pend_total = 0  # Σ pending
        self.uses, self.again = [False] * n, [False] * n  # holds a prefix reference; preempted before (recompute)
        self.version = [0] * n
        self.finish = [float("inf")] * n
        self.spans: list[tuple[int, int, int]] = []
        self.segs: list[tuple[int, float, int, float, float]] = []
        self.pre_k: list[int] = []
        self.recompute: list[tuple[int, int]] = []
        self.hits: list[tuple[int, int]] = []
        self.pool = BlockPool(BIG if self.nb is None else self.nb)  # free and cached blocks (vLLM's free queue)
        self.refs: dict[int, int] = {}  # prompt prefix key → running requests holding it (resident while > 0)
        self.caching = lim.prefix_caching
        self.private = self.resident = 0  # blocks held by running requests: their own; referenced prompt prefixes
        self.running: list[int] = []
        self.prefilling: list[int] = []
        self.heap: list[tuple[int, int, int]] = []  # (finish iteration, request, version)
        self.phase = [0] * self.bs  # decoders per phase (k₀ − c₀ mod B): who needs a block at iteration k
        self.b = self.ctx = self.k = 0
        self.t = 0.0
        self.cut = cut
        chunked = lim.max_num_batched_tokens is not None
        for i in range(n):
            if chunked and self.L[i] == 0:
                self.finish[i], self.state[i] = 0.0, DONE
        self.waiting = [i for i in range(n - 1, -1, -1) if self.state[i] == WAIT]  # a stack: the head is last

    # blocks ---------------------------------------------------------------------------------------------------
    def avail(self) -> int:
        """Blocks an allocation may take now (free ones and unreferenced cached ones)."""
        return self.pool.total

    def take(self, blocks: int) -> None:
        """Allocate `blocks` private blocks from the free queue's head, evicting the cached blocks it reaches."""
        self.pool.take(blocks)
        self.private += blocks

    def held(self, i: int) -> int:
        """Private blocks request i holds at the current boundary."""
        st = self.state[i]
        if st == DECODE:
            total = -(-(self.c0[i] + max(self.k - self.ks[i], 1)) // self.bs)
        elif st == PREFILL:
            total = -(-(self.P[i] + self.g0[i] + 1) // self.bs)
        else:
            return 0
        return total - (self.S[i] if self.uses[i] else 0)

    # state changes --------------------------------------------------------------------------------------------
    def start_decode(self, i: int, ks: int) -> None:
        """Request i decodes from iteration ks on (its block for that iteration's token is already held)."""
        self.state[i] = DECODE
        c0 = self.P[i] + self.g0[i]
        self.ks[i], self.c0[i] = ks, c0
        self.b += 1
        self.ctx += c0 + (self.k - ks)
        ph = (ks - c0) % self.bs
        self.phase[ph] += 1
        heapq.heappush(self.heap, (ks + self.L[i] - self.g0[i], i, self.version[i]))

    def leave(self, i: int, new_state: int) -> None:
        """Request i stops running (finished, preempted or aborted): its blocks go back to the free queue, the
        hashed ones (every token's KV computed) at the tail, a preempted request's under its name so that its
        re-admission can hit them; then its prompt prefix reference."""
        st, bs = self.state[i], self.bs
        share = self.S[i] if self.uses[i] else 0
        if st == DECODE:  # `held` inlined
            ks, c0 = self.ks[i], self.c0[i]
            done = self.k - ks
            blocks = (c0 + (done if done > 1 else 1) + bs - 1) // bs - share
            computed = c0 + done - 1  # the last sampled token's KV is not computed yet
        else:
            blocks = self.held(i)
            computed = self.P[i] + self.g0[i] - self.pending[i]
        self.private -= blocks
        pool = self.pool
        if self.caching:
            hashed = min(max(computed // bs - share, 0), blocks)
            pool.free(blocks - hashed)
            pool.push(-2 - i if new_state == WAIT else None, hashed)
        else:
            pool.free(blocks)
        if share:
            key = self.K[i]
            r = self.refs[key] - 1
            if r:
                self.refs[key] = r
            else:
                del self.refs[key]
                self.resident -= share
                pool.push(key, share)
            self.uses[i] = False
        if st == DECODE:
            self.b -= 1
            self.ctx -= c0 + done
            ph = (ks - c0) % self.bs
            self.phase[ph] -= 1
            self.spans.append((i, ks, self.k))
            self.g0[i] += done
            self.version[i] += 1
        elif st == PREFILL and i in self.prefilling:
            self.prefilling.remove(i)
            self.pend_total -= self.pending[i]
            self.pending[i] = 0
        self.running.remove(i)
        self.state[i] = new_state

    def preempt_newest(self) -> int:
        """vLLM v1's preemption: the most recently admitted running request re-queues first (recompute)."""
        victim = self.running[-1]
        self.leave(victim, WAIT)
        self.waiting.append(victim)
        self.again[victim] = True
        self.pre_k.append(self.k)
        return victim

    def preempt_for(self, ph: int) -> bool:
        """Step 1 short of blocks: the c decoders of phase `ph` take one block each in admission order, the newest
        running request preempted whenever none is left, and the blocks taken so far allocated before each
        preemption (as one at a time would). Served from the oldest, preempted from the newest, so no victim is one
        already served, and each round serves exactly the blocks free: while more wait than are free, the free ones
        are taken and the newest leaves (one fewer waiting if it is one of them; it stops the visit if it was the
        one being served, which is then the last). True."""
        left, avail = self.phase[ph], self.avail()
        while left > avail:
            if avail:
                self.take(avail)
                left -= avail
            victim = self.running[-1]
            if self.state[victim] == DECODE and (self.ks[victim] - self.c0[victim]) % self.bs == ph:
                left -= 1
            self.preempt_newest()
            avail = self.avail()
        if left:
            self.take(left)
        return True

    def finish_due(self, k: int, t: float) -> int:
        """The decoders whose last token is at or before iteration k finish at t: how many."""
        heap, version, state, done = self.heap, self.version, self.state, 0
        while heap and heap[0][0] <= k:
            _, i, v = heapq.heappop(heap)
            if v == version[i] and state[i] == DECODE:
                self.finish[i] = t
                self.leave(i, DONE)
                done += 1
        return done

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

