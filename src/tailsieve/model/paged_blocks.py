"""The paged replica's bookkeeping (`model.paged`): its limits, its record, the prefix cache and the block
demand of a run of iterations counted by phase (docs/simulator.md)."""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from dataclasses import dataclass
from itertools import accumulate

import numpy as np
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]


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


class BlockPool:
    """vLLM v1's free block queue (`BlockPool.free_blocks`), as counts: `anon` blocks without a hash at its head (never
    used, a partial block, or any block with prefix caching off: reused first), then the hashed blocks in release
    order as segments [owner, blocks]. An owner is a prompt prefix (its key ≥ 0) or a preempted request (−2 − i) that
    a later admission may hit; None: hashed blocks nobody hits (a finished response's). A segment loses blocks from
    its head side, which holds its owner's tail blocks (vLLM frees a request's blocks in reverse order), so what
    survives of an owner is always a prefix of its blocks. `total`: every block an allocation may take."""

    __slots__ = ("anon", "of", "segs", "total")

    def __init__(self, blocks: int) -> None:
        self.anon = self.total = blocks
        self.segs: deque[list[int | None]] = deque()
        self.of: dict[int, list[int | None]] = {}  # owner → its segment

    def free(self, blocks: int) -> None:
        """Unhashed blocks back at the head."""
        self.anon += blocks
        self.total += blocks

    def push(self, owner: int | None, blocks: int) -> None:
        """Hashed blocks back at the tail, `owner`'s (None: nobody's)."""
        if blocks <= 0:
            return
        self.total += blocks
        segs = self.segs
        if owner is None and segs and segs[-1][0] is None:
            segs[-1][1] += blocks  # type: ignore[operator]
            return
        seg: list[int | None] = [owner, blocks]
        segs.append(seg)
        if owner is not None:
            self.of[owner] = seg

    def take(self, blocks: int) -> None:
        """Allocate `blocks` from the head (the caller checked `total`), evicting what it reaches."""
        self.total -= blocks
        if blocks <= self.anon:
            self.anon -= blocks
            return
        blocks -= self.anon
        self.anon = 0
        segs = self.segs
        while blocks > 0:
            seg = segs[0]
            c: int = seg[1]  # type: ignore[assignment]
            if c <= blocks:
                blocks -= c
                segs.popleft()
                if seg[0] is not None:
                    del self.of[seg[0]]
            else:
                seg[1] = c - blocks
                blocks = 0

    def surviving(self, owner: int) -> int:
        """Blocks of `owner` still cached in the queue."""
        seg = self.of.get(owner)
        return 0 if seg is None else seg[1]  # type: ignore[return-value]

    def remove(self, owner: int) -> int:
        """`owner`'s cached blocks leave the queue (a hit touches them): how many."""
        seg = self.of.pop(owner, None)
        if seg is None:
            return 0
        c: int = seg[1]  # type: ignore[assignment]
        seg[0], seg[1] = None, 0
        self.total -= c
        return c

    def forget(self, owner: int) -> None:
        """`owner`'s cached blocks stay where they are but nobody can hit them any more."""
        seg = self.of.pop(owner, None)
        if seg is not None:
            seg[0] = None


def demand(phase: list[int], b: int, k: int, j: int, bs: int) -> int:
    """Blocks the decoders need over iterations k+1..k+j (those of phase φ need one at every k' ≡ φ mod B)."""
    full, part = divmod(j, bs)
    if not part:
        return full * b
    start = (k + 1) % bs
    end = start + part
    if end <= bs:
        return full * b + sum(phase[start:end])
    return full * b + sum(phase[start:]) + sum(phase[: end - bs])


def first_shortage(phase: list[int], b: int, k: int, free: int, bs: int) -> int:
    """Iterations from k that run before a block is short: the first j ≥ 1 at which the blocks needed over iterations
    k+1..k+j exceed `free`."""
    full = free // b  # whole periods of B iterations, each needing b blocks
    j = full * bs
    start = (k + j + 1) % bs
    need = list(accumulate(phase[start:] + phase[:start]))  # blocks needed over the next d iterations, d = 1..B
    return j + bisect_right(need, free - full * b) + 1  # ≤ j + B: a whole period needs b > what is left
