"""The paged replica's bookkeeping (`simulation.paged`): its limits, its record, the prefix cache and the block
demand of a run of iterations counted by phase (docs/simulator.md)."""

from __future__ import annotations

from bisect import bisect_right
from collections import OrderedDict
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


class PrefixCache:
    """Prefix entries: key → [blocks, references]; the unreferenced ones wait in `lru` (release order), evictable."""

    __slots__ = ("entries", "evictable", "lru")

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
