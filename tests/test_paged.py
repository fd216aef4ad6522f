"""The paged replica (`model.paged`): exact against a token-by-token reference of vLLM v1's scheduling rules
(docs/simulator.md), with preemption, recompute and prefix-hit counts; the all-admit closed form with it off."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import curves
from paged_reference import ceil_div, reference
from tailsieve.errors import ConfigError
from tailsieve.model.curve_names import load_curve
from tailsieve.model.curves import TpotCurve
from tailsieve.model.makespan import finish_times
from tailsieve.simulation.replica import ReplicaConfig, resume_replica, run_replica

pytestmark = pytest.mark.usefixtures("paged_engine")  # every test on both engines (conftest.py)


def counts_of(run) -> dict[str, int]:  # type: ignore[no-untyped-def]
    p, r, h = run.counts()
    return {"preemptions": p, "recomputed": r, "hits": h}


cases = st.lists(st.tuples(st.integers(0, 24), st.integers(0, 24), st.integers(0, 3)), min_size=1, max_size=8)


def unpack(reqs: list[tuple[int, int, int]]) -> tuple[list[int], list[int], list[int]]:
    """Lengths, prompts and keys; requests with one key share one prompt (the first one's), as a group does."""
    lens, keys = [r[0] for r in reqs], [r[2] for r in reqs]
    first = {}
    for r in reqs:
        first.setdefault(r[2], r[1])
    return lens, [first[k] for k in keys], keys


@settings(max_examples=250, deadline=None)
@given(cases, st.sampled_from([1, 2, 4, 16]), st.integers(0, 40), st.one_of(st.none(), st.integers(1, 4)),
       st.one_of(st.none(), st.integers(1, 12)), st.booleans(), st.sampled_from([0.0, 0.7]),
       st.sampled_from([0.0, 0.3]), curves())
def test_paged_matches_token_by_token(reqs: list[tuple[int, int, int]], bs: int, extra_blocks: int, cap: int | None,
                                      mbt: int | None, prefix: bool, kv: float, pre: float, curve: TpotCurve) -> None:
    lens, prompts, keys = unpack(reqs)
    biggest = max(ceil_div(p + max(n, 1), bs) for n, p in zip(lens, prompts, strict=False))
    cfg = ReplicaConfig(max_num_seqs=cap, kv_ms_per_1k_tokens=kv, prefill_ms_per_token=pre,
                        kv_tokens=(biggest + extra_blocks) * bs if extra_blocks < 40 else None, block_size=bs,
                        max_num_batched_tokens=mbt, prefix_caching=prefix)
    if not cfg.paged:
        cfg = ReplicaConfig(max_num_seqs=cap, kv_ms_per_1k_tokens=kv, prefill_ms_per_token=pre, block_size=bs,
                            kv_tokens=10**6)
    run = run_replica(lens, curve, cfg, prompts, prefix_keys=keys)
    want = reference(lens, prompts, keys, curve, cfg)
    assert run.finish_s == pytest.approx(want["finish"], rel=1e-9, abs=1e-12)
    assert counts_of(run) == want["counts"]
    for t, gen in want["history"]:  # an abort at any iteration boundary reports the tokens generated so far
        got = run.tokens_at(t)
        assert [min(g, n) for g, n in zip(gen, lens, strict=False)] == list(got) or t == 0


def test_tokens_at_a_boundary_summed_in_another_order() -> None:
    """Found by the property above: the reference sums 37 iteration times one by one and reaches the last boundary
    at 1.5484999999999993 s, the engine's segments at 1.5485 s. The error is relative to t (36 iterations of 43 ms),
    not to the last 0.5 ms iteration, and an abort at the reference's time still reports that iteration's tokens."""
    curve = TpotCurve(name="steep", batch=(1, 2), tpot_ms=(43.0, 0.5))
    lens, prompts, keys = [12, 24, 1, 1], [1, 1, 0, 0], [1, 1, 0, 0]
    cfg = ReplicaConfig(kv_tokens=25, block_size=1, max_num_batched_tokens=1)
    run = run_replica(lens, curve, cfg, prompts, prefix_keys=keys)
    t, gen = reference(lens, prompts, keys, curve, cfg)["history"][-1]
    assert (t, gen) == (pytest.approx(1.5485), [12, 24, 1, 1]) and t < run.makespan
    assert list(run.tokens_at(t)) == gen and run.iterations_at(t) == 37
    assert run.iterations_at(1.5484) == 36  # a real gap is not rounding


@settings(max_examples=120, deadline=None)
@given(cases, st.sampled_from([1, 4]), st.integers(0, 6), st.one_of(st.none(), st.integers(2, 10)), st.booleans(),
       st.data(), curves())
def test_paged_cut_matches_reference(reqs: list[tuple[int, int, int]], bs: int, extra: int, mbt: int | None,
                                     prefix: bool, data: st.DataObject, curve: TpotCurve) -> None:
    lens, prompts, keys = unpack(reqs)
    biggest = max(ceil_div(p + max(n, 1), bs) for n, p in zip(lens, prompts, strict=False))
    cfg = ReplicaConfig(kv_tokens=(biggest + extra) * bs, block_size=bs, max_num_batched_tokens=mbt,
                        prefix_caching=prefix, prefill_ms_per_token=0.2)
    run = run_replica(lens, curve, cfg, prompts, prefix_keys=keys)
    keep = data.draw(st.lists(st.booleans(), min_size=len(lens), max_size=len(lens)))
    cut_k = data.draw(st.integers(0, int(run.seg_k0[-1] + run.seg_n[-1]) if run.seg_n.size else 0))
    cut_s = 0.0 if cut_k == 0 else float(reference(lens, prompts, keys, curve, cfg)["history"][cut_k][0])
    got = resume_replica(run, keep, cut_s, curve, cfg, prompts)
    want = reference(lens, prompts, keys, curve, cfg, cut=(cut_k, keep))["finish"]
    assert got == pytest.approx(want, rel=1e-9, abs=1e-12)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(1, 30), min_size=1, max_size=10), st.sampled_from([1, 16]), curves())
def test_unbounded_paged_equals_closed_form(lens: list[int], bs: int, curve: TpotCurve) -> None:
    """KV large enough for everything, no chunking, no prefix caching: the §2.1 closed form exactly."""
    run = run_replica(lens, curve, ReplicaConfig(kv_tokens=10**7, block_size=bs))
    assert run.finish_s == pytest.approx(finish_times(lens, curve), rel=1e-12)
    assert run.counts() == (0, 0, 0)


def test_preemption_recomputes_prompt_and_generated_tokens() -> None:
    """Two requests (4-token prompts, 12 tokens each) in 5 blocks of 4: both admitted (2 blocks each); at their 4th
    token both need a third block, one is free: the first takes it, the second (the newest) is preempted and later
    prefills its prompt and its 4 generated tokens again (8 recomputed tokens)."""
    curve = load_curve("h100-llama3-8b")
    cfg = ReplicaConfig(kv_tokens=20, block_size=4)
    run = run_replica([12, 12], curve, cfg, [4, 4])
    want = reference([12, 12], [4, 4], [-1, -1], curve, cfg)
    assert run.counts() == (1, 8, 0)
    assert want["counts"] == {"preemptions": 1, "recomputed": 8, "hits": 0}
    assert run.finish_s == pytest.approx(want["finish"])
    tau1 = curve.tpot_s(1)
    assert run.finish_s[0] == pytest.approx(4 * curve.tpot_s(2) + 8 * tau1)  # alone after the preemption


def test_readmission_hits_its_own_cached_blocks() -> None:
    """The same two requests with prefix caching on: the preempted one (4 tokens generated) leaves its one full block
    (its prompt) hashed at the free queue's tail and its partial block at the head; the survivor's next block comes
    from the head, so the re-admission hits 4 tokens and prefills only the other 4 (1 ms each)."""
    curve = load_curve("h100-llama3-8b")
    on = ReplicaConfig(kv_tokens=20, block_size=4, prefix_caching=True, prefill_ms_per_token=1.0)
    off = ReplicaConfig(kv_tokens=20, block_size=4, prefill_ms_per_token=1.0)
    got, base = run_replica([12, 12], curve, on, [4, 4]), run_replica([12, 12], curve, off, [4, 4])
    assert (got.counts(), base.counts()) == ((1, 4, 0), (1, 8, 0))
    assert got.finish_s[0] == pytest.approx(base.finish_s[0])
    assert got.finish_s[1] == pytest.approx(base.finish_s[1] - 0.004)
    assert got.finish_s == pytest.approx(reference([12, 12], [4, 4], [-1, -1], curve, on)["finish"])


def test_evicted_cached_blocks_are_recomputed() -> None:
    """In 4 blocks nothing is free at the preemption: the survivor's fourth block evicts the preempted request's
    cached one, and the re-admission prefills all 8 tokens again."""
    curve = load_curve("h100-llama3-8b")
    cfg = ReplicaConfig(kv_tokens=16, block_size=4, prefix_caching=True)
    assert run_replica([12, 12], curve, cfg, [4, 4]).counts() == (1, 8, 0)
    assert reference([12, 12], [4, 4], [-1, -1], curve, cfg)["counts"] == {"preemptions": 1, "recomputed": 8,
                                                                           "hits": 0}


def test_prefix_hits_per_group_on_one_replica() -> None:
    """A group of 4 sharing a 33-token prompt in blocks of 16: 2 full blocks shared, 3 hits of 32 tokens each."""
    curve = load_curve("h100-llama3-8b")
    cfg = ReplicaConfig(prefix_caching=True, prefill_ms_per_token=1.0)
    run = run_replica([5, 5, 5, 5], curve, cfg, [33] * 4, prefix_keys=[7] * 4)
    assert run.counts() == (0, 0, 96)
    alone = run_replica([5, 5, 5, 5], curve, ReplicaConfig(prefill_ms_per_token=1.0, kv_tokens=10**6), [33] * 4)
    assert run.makespan == pytest.approx(alone.makespan - 0.096)  # 96 prompt tokens not prefilled at 1 ms each


def test_request_larger_than_the_cache_is_one_line() -> None:
    with pytest.raises(ConfigError, match="cannot hold one request"):
        run_replica([100], load_curve("h100-llama3-8b"), ReplicaConfig(kv_tokens=64), [10])
    with pytest.raises(ConfigError, match="block_size"):
        ReplicaConfig(block_size=0)
    with pytest.raises(ConfigError, match="kv_tokens"):
        ReplicaConfig(kv_tokens=3)


def test_multi_turn_with_paged_engine_is_refused() -> None:
    cfg = ReplicaConfig(kv_tokens=10**6, tool_wait_s=1.0)
    with pytest.raises(ConfigError, match="multi-turn"):
        run_replica([10, 10], load_curve("h100-llama3-8b"), cfg, [0, 0], turns=[2, 2])


@settings(max_examples=60, deadline=None)
@given(cases, st.integers(0, 8), curves())
def test_invariants_under_pressure(reqs: list[tuple[int, int, int]], extra: int, curve: TpotCurve) -> None:
    """Every request finishes; tokens never decrease over time and end at the lengths; more KV never preempts more."""
    lens, prompts, _keys = unpack(reqs)
    biggest = max(ceil_div(p + max(n, 1), 4) for n, p in zip(lens, prompts, strict=False))
    tight = run_replica(lens, curve, ReplicaConfig(kv_tokens=(biggest + extra) * 4, block_size=4), prompts)
    roomy = run_replica(lens, curve, ReplicaConfig(kv_tokens=10**6, block_size=4), prompts)
    assert np.isfinite(tight.finish_s).all()
    assert roomy.counts()[0] == 0
    times = np.linspace(0, tight.makespan, 9)
    toks = np.array([tight.tokens_at(t) for t in times])
    assert (np.diff(toks, axis=0) >= 0).all()
    assert list(toks[-1]) == lens
