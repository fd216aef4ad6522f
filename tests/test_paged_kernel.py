"""The paged engine's kernel (`model/paged_kernel*.py`): bit-identical to the Python engine on random runs (with and
without a cut, every record compared), its free queue and finish heap against the Python structures they mirror
under random operations (compaction and stale purges included), the records growing mid-run, and the
fallback when numba cannot compile. tests/test_paged.py and test_paged_pinned.py run every test on both engines."""

from __future__ import annotations

import heapq
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tailsieve.model.paged as paged
from conftest import require_extra
from tailsieve.errors import ConfigError
from tailsieve.model.paged_blocks import BlockPool, PagedLimits, PagedTrace
from tailsieve.model.paged_kernel import run_kernel
from tailsieve.model.paged_kernel_pool import (
    ANON,
    HN,
    NV,
    SH,
    ST,
    TOTAL,
    _heap_pop,
    _heap_push,
    _pool_forget,
    _pool_push,
    _pool_remove,
    _pool_take,
    drop_stale_cache,
)
from tailsieve.model.paged_state import check_fits

requests = st.lists(st.tuples(st.integers(0, 60), st.integers(0, 40), st.integers(-1, 3)), min_size=1, max_size=12)
limits = st.builds(lambda bs, extra, cap, mbt, prefix, kv, pre: (bs, extra, cap, mbt, prefix, kv, pre),
                   st.sampled_from([1, 2, 4, 16]), st.one_of(st.none(), st.integers(0, 30)),
                   st.one_of(st.none(), st.integers(1, 5)), st.one_of(st.none(), st.integers(1, 40)), st.booleans(),
                   st.sampled_from([0.0, 1e-4]), st.sampled_from([0.0, 2e-5]))


def both(lens: np.ndarray, prompts: np.ndarray, keys: np.ndarray, tau: np.ndarray, lim: PagedLimits,
         cut: tuple[int, np.ndarray] | None = None) -> tuple[PagedTrace, PagedTrace]:
    """The same run on the Python engine and on the kernel."""
    check_fits(lens, prompts, lim)
    python = paged._Paged(lens, prompts, keys, tau, lim, cut).run()
    return python, run_kernel(lens, prompts, keys, tau, lim, cut)


def assert_same(a: PagedTrace, b: PagedTrace) -> None:
    assert a.finish_s.tobytes() == b.finish_s.tobytes()
    assert a.spans.tolist() == b.spans.tolist()
    for x, y in zip(a.seg, b.seg, strict=True):
        assert x.dtype == y.dtype and x.tobytes() == y.tobytes()
    assert a.preempt_k.tolist() == b.preempt_k.tolist()
    assert a.recompute.tolist() == b.recompute.tolist()
    assert a.hits.tolist() == b.hits.tolist()


def case(reqs: list[tuple[int, int, int]], lim_args: tuple) -> tuple:  # type: ignore[type-arg]
    bs, extra, cap, mbt, prefix, kv, pre = lim_args
    lens = np.array([r[0] for r in reqs], np.int64)
    first: dict[int, int] = {}
    for r in reqs:
        first.setdefault(r[2], r[1])
    prompts = np.array([first[r[2]] if r[2] >= 0 else r[1] for r in reqs], np.int64)
    keys = np.array([r[2] for r in reqs], np.int64)
    biggest = int((-(-(prompts + np.maximum(lens, 1)) // bs)).max())
    lim = PagedLimits(None if extra is None else biggest + extra, bs, cap, mbt, prefix, kv, pre)
    tau = 0.01 + 0.001 * np.sqrt(np.arange(lens.size + 2, dtype=np.float64))
    return lens, prompts, keys, tau, lim


@settings(max_examples=300, deadline=None)
@given(requests, limits, st.integers(0, 200), st.integers(0, 2**32 - 1))
def test_kernel_is_the_python_engine(reqs: list[tuple[int, int, int]], lim_args: tuple, cut_k: int,  # type: ignore[type-arg]
                                     seed: int) -> None:
    lens, prompts, keys, tau, lim = case(reqs, lim_args)
    assert_same(*both(lens, prompts, keys, tau, lim))
    keep = np.random.default_rng(seed).random(lens.size) < 0.5
    assert_same(*both(lens, prompts, keys, tau, lim, (cut_k, keep)))


def test_kernel_on_a_kv_bound_replica_with_storms() -> None:
    """Hundreds of requests far beyond the cache (the bench's shape, smaller): hundreds of preemptions, identical."""
    rng = np.random.default_rng(7)
    n = 96
    lens = rng.integers(200, 3000, n).astype(np.int64)
    keys = np.repeat(np.arange(n // 8), 8).astype(np.int64)
    prompts = rng.integers(50, 400, n // 8).astype(np.int64)[keys]
    tau = 0.02 + 0.0002 * np.arange(n + 2, dtype=np.float64)
    for mbt in (None, 512):
        a, b = both(lens, prompts, keys, tau, PagedLimits(1200, 16, None, mbt, True, 1e-6, 2e-5))
        assert a.preempt_k.size > 200
        assert_same(a, b)


def test_any_prompt_keys_name_the_same_groups() -> None:
    """Keys far beyond the request count (renumbered before the kernel's lookup table) give the same run."""
    lens, prompts, keys, tau, lim = case([(30, 9, 0), (40, 9, 0), (10, 3, -1), (25, 12, 2), (5, 12, 2)],
                                         (4, 3, None, None, True, 0.0, 0.0))
    small = both(lens, prompts, keys, tau, lim)
    assert small[0].hits.size  # the shared prompts are hit
    big = np.where(keys >= 0, keys * 10**12 + 7, -1)
    for run in (*both(lens, prompts, big, tau, lim), *small):
        assert_same(run, small[0])


def test_an_empty_replica_and_empty_responses() -> None:
    """No requests; and responses of no tokens (done once admitted, or at 0 with chunked prefill): the same."""
    empty = np.zeros(0, np.int64)
    for mbt in (None, 8):
        lim = PagedLimits(10, 4, None, mbt, True, 0.0, 1e-3)
        a, b = both(empty, empty, empty, np.full(2, 0.01), lim)
        assert_same(a, b)
        assert a.finish_s.size == 0 and a.seg[0].size == 0
        lens, prompts = np.array([0, 0, 4], np.int64), np.array([3, 0, 5], np.int64)
        assert_same(*both(lens, prompts, np.array([0, 0, 1], np.int64), np.full(5, 0.01), lim))


def test_full_records_grow_and_the_run_goes_on() -> None:
    rng = np.random.default_rng(3)
    lens, prompts = rng.integers(20, 400, 24).astype(np.int64), rng.integers(5, 60, 24).astype(np.int64)
    keys = np.repeat(np.arange(6), 4).astype(np.int64)
    tau = np.linspace(0.01, 0.02, 26)
    lim = PagedLimits(130, 4, None, 64, True, 0.0, 1e-5)
    check_fits(lens, prompts, lim)
    tight = run_kernel(lens, prompts, keys, tau, lim, None, room=np.ones(5, np.int64))
    assert tight.preempt_k.size > 1
    assert_same(tight, run_kernel(lens, prompts, keys, tau, lim, None))


def test_stalls_are_the_python_engines_errors() -> None:
    lens, prompts = np.array([5, 5], np.int64), np.array([0, 0], np.int64)
    lim = PagedLimits(4, 4, 0, None, False, 0.0, 0.0)  # max_num_seqs 0: nothing is ever admitted
    tau = np.full(3, 0.01)
    with pytest.raises(ConfigError, match="a waiting request can never be admitted"):
        paged._Paged(lens, prompts, None, tau, lim, None).run()
    with pytest.raises(ConfigError, match="a waiting request can never be admitted"):
        run_kernel(lens, prompts, None, tau, lim, None)


def test_free_queue_matches_the_python_pool_under_random_operations() -> None:
    """take / push / remove / forget on `BlockPool` and on the arrays, 8 blocks in 10 segment slots (the kernel's
    bound: blocks + 2; compaction every few pushes): the same totals, head blocks and surviving blocks of every owner
    after every operation."""
    rng = np.random.default_rng(11)
    for _ in range(200):
        pool = BlockPool(8)
        v = np.zeros(NV, np.int64)
        v[ANON] = v[TOTAL] = 8
        pq = np.zeros((2, 10), np.int64)
        of_key, of_req = np.full(4, -1, np.int64), np.full(4, -1, np.int64)
        owners = [0, 1, 2, 3, -2, -3, -4, -5]
        live: set[int] = set()
        for _ in range(60):
            op = rng.integers(4)
            owner = int(rng.choice(owners))
            if op == 0 and pool.total:
                blocks = int(rng.integers(0, pool.total + 1))
                pool.take(blocks)
                _pool_take(v, pq[0], pq[1], of_key, of_req, blocks)
            elif op == 1 and pool.total < 8:
                blocks = int(rng.integers(1, 8 - pool.total + 1))
                who = None if rng.random() < 0.3 or owner in live else owner
                pool.push(who, blocks)
                _pool_push(v, pq[0], pq[1], of_key, of_req, -1 if who is None else who, blocks)
            elif op == 2:
                assert pool.remove(owner) == _pool_remove(v, pq[0], pq[1], of_key, of_req, owner)
            else:
                pool.forget(owner)
                _pool_forget(pq[0], of_key, of_req, owner)
            live = set(pool.of)
            assert (v[TOTAL], v[ANON]) == (pool.total, pool.anon)
            assert v[ST] - v[SH] <= 10
            for o in owners:
                idx = of_key[o] if o >= 0 else of_req[-2 - o]
                assert (0 if idx < 0 else pq[1, idx]) == pool.surviving(o)


def test_finish_heap_pops_as_heapq_with_stale_entries_purged() -> None:
    """Pushes and pops of (finish iteration, request, version) against heapq; a full heap drops stale entries (a
    version the request no longer has) and the valid ones still pop in heapq's order."""
    rng = np.random.default_rng(5)
    for _ in range(100):
        n = 6
        version = np.zeros(n, np.int64)
        hp = np.zeros((3, n + 2), np.int64)
        v = np.zeros(NV, np.int64)
        ref: list[tuple[int, int, int]] = []
        for _ in range(80):
            if ref and rng.random() < 0.35:
                while ref and ref[0][2] != version[ref[0][1]]:
                    heapq.heappop(ref)
                while v[HN] and hp[2, 0] != version[hp[1, 0]]:
                    _heap_pop(v, hp[0], hp[1], hp[2])
                if ref:
                    assert tuple(hp[:, 0]) == heapq.heappop(ref)
                    _heap_pop(v, hp[0], hp[1], hp[2])
            else:
                i = int(rng.integers(n))
                version[i] += 1  # its older entries are stale: at most one valid entry per request
                item = (int(rng.integers(0, 50)), i, int(version[i]))
                heapq.heappush(ref, item)
                _heap_push(v, hp[0], hp[1], hp[2], version, *item)
                assert v[HN] <= hp.shape[1]


def test_numba_failure_falls_back_to_the_python_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """numba installed but unable to compile (fault injected on top of the real call): a warning, then the Python
    engine's result; any other error is not swallowed."""
    lens, prompts, keys, tau, lim = case([(30, 5, 0), (40, 5, 0), (10, 3, -1)], (4, 2, None, None, True, 0.0, 0.0))
    want = paged._Paged(lens, prompts, keys, tau, lim, None).run()
    numba_error = type("TypingError", (Exception,), {"__module__": "numba.core.errors"})

    def broken(*args: object, **kw: object) -> None:
        raise numba_error("cannot compile")

    monkeypatch.setattr(paged, "_kernel", lambda: broken)
    monkeypatch.setattr(paged, "USE_KERNEL", True)
    with pytest.warns(RuntimeWarning, match="compiled paged engine is unavailable"):
        assert_same(paged.run_paged(lens, prompts, keys, tau, lim), want)
    assert paged.USE_KERNEL is False

    def bug(*args: object, **kw: object) -> None:
        raise IndexError("a bug")

    monkeypatch.setattr(paged, "_kernel", lambda: bug)
    monkeypatch.setattr(paged, "USE_KERNEL", True)
    with warnings.catch_warnings(), pytest.raises(IndexError):
        warnings.simplefilter("error")
        paged.run_paged(lens, prompts, keys, tau, lim)


def test_the_fast_extra_compiles_the_kernel() -> None:
    require_extra("numba")
    from numba.core.registry import CPUDispatcher

    from tailsieve.model import paged_kernel

    assert paged_kernel.COMPILED and isinstance(paged_kernel._run, CPUDispatcher)


def test_a_changed_kernel_file_drops_every_cached_kernel_function(tmp_path: Path) -> None:
    """numba would keep a cached caller's old callee when only the callee's file changed: the digest of all the
    kernel files decides, and every cached kernel function goes when it moves; other caches stay."""
    (tmp_path / "paged_kernel.py").write_text("a = 1\n")
    (tmp_path / "paged_kernel_pool.py").write_text("b = 1\n")
    cache = tmp_path / "__pycache__"
    cache.mkdir()
    cached = [cache / "paged_kernel._run-90.py311.nbi", cache / "paged_kernel._run-90.py311.1.nbc",
              cache / "paged_kernel_pool._pool_take-70.py311.nbi"]
    other = cache / "other._f-1.py311.nbi"
    for f in [*cached, other]:
        f.write_text("x")
    assert drop_stale_cache(tmp_path) and not any(f.exists() for f in cached) and other.exists()
    for f in cached:
        f.write_text("x")
    assert not drop_stale_cache(tmp_path) and all(f.exists() for f in cached)  # unchanged: the cache stays
    (tmp_path / "paged_kernel_pool.py").write_text("b = 2\n")  # only the callee's file changes
    assert drop_stale_cache(tmp_path) and not any(f.exists() for f in cached)
    for f in cached:
        f.write_text("x")
    (tmp_path / "paged_state.py").write_text("WAIT = 0\n")  # the constants the kernel imports count too
    assert drop_stale_cache(tmp_path) and not any(f.exists() for f in cached)
    assert [p.name for p in cache.iterdir() if p.suffix in (".tmp",)] == []
