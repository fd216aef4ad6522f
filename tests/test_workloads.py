"""Workloads: recorded replay, resampling with common random numbers, prompt streams, names and paths."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tailsieve.errors import ConfigError, TraceError
from tailsieve.policy.stream import PromptStream, StreamState
from tailsieve.workloads import ReplayMode, bundled_workloads, load_workload


def trace_file(tmp_path: Path, rows: list[dict[str, object]]) -> Path:
    p = tmp_path / "w.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


@pytest.fixture
def small(tmp_path: Path) -> Path:
    rows = [{"prompt_id": "b", "length": v} for v in (1, 2, 3)] + [{"prompt_id": "a", "length": v} for v in (10, 20)]
    rows.insert(1, {"prompt_id": "c", "length": 7})
    return trace_file(tmp_path, rows)


def test_recorded_replay_is_exact_and_cyclic(small: Path) -> None:
    w = load_workload(small)
    assert w.prompts == ("b", "c", "a") and w.mode is ReplayMode.RECORDED and w.name == "w"
    assert list(w.lengths("b", 0, 0, 2)) == [1, 2]
    assert list(w.lengths("b", 1, 0, 2)) == [3, 1]  # starts at a·G = 2, cyclic
    assert list(w.lengths("b", 2, 0, 2)) == [2, 3]
    assert list(w.lengths("a", 0, 5, 3)) == [10, 20, 10]
    assert list(w.lengths("c", 4, 9, 2)) == [7, 7]
    assert np.array_equal(w.lengths("b", 1, 0, 2), w.lengths("b", 1, 99, 2))  # step ignored


def test_recorded_is_deterministic_across_loads() -> None:
    a, b = load_workload(), load_workload("kodcode-r1", seed=123)
    for g in range(4):
        for p in a.prompts[:20]:
            assert np.array_equal(a.lengths(p, g, g, 8), b.lengths(p, g, g, 8))


def test_recorded_covers_every_sample_once_per_cycle() -> None:
    w = load_workload()
    trace = w.trace
    assert trace is not None
    p = w.prompts[0]
    recorded = sorted(trace.length[trace.prompt_id == p].tolist())
    assert sorted(w.lengths(p, 0, 0, 3).tolist()) == recorded


def test_resample_same_seed_reproduces_other_seed_differs() -> None:
    a = load_workload(mode="resample", seed=1)
    b = load_workload(mode="resample", seed=1)
    c = load_workload(mode="resample", seed=2)
    pa = [a.lengths(p, g, 0, 8) for p in a.prompts[:40] for g in range(3)]
    pb = [b.lengths(p, g, 0, 8) for p in b.prompts[:40] for g in range(3)]
    pc = [c.lengths(p, g, 0, 8) for p in c.prompts[:40] for g in range(3)]
    assert all(np.array_equal(x, y) for x, y in zip(pa, pb, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(pa, pc, strict=True))


def test_resample_common_random_numbers_and_support() -> None:
    w = load_workload(mode="resample", seed=5)
    trace = w.trace
    assert trace is not None
    p, q = w.prompts[3], w.prompts[4]
    first = w.lengths(p, 2, 0, 8)
    w.lengths(q, 0, 0, 8)  # other calls in between change nothing
    assert np.array_equal(first, w.lengths(p, 2, 17, 8))  # no step column: step irrelevant
    assert not np.array_equal(w.lengths(p, 0, 0, 64), w.lengths(p, 1, 0, 64))
    assert set(w.lengths(p, 0, 0, 64).tolist()) <= set(trace.length[trace.prompt_id == p].tolist())


def test_resample_draws_from_nearest_step(tmp_path: Path) -> None:
    rows = [{"prompt_id": "p", "length": 100 + s, "step": s} for s in (0, 10, 20) for _ in range(3)]
    rows.append({"prompt_id": "q", "length": 5, "step": 0})
    w = load_workload(trace_file(tmp_path, rows), mode="resample")
    assert set(w.lengths("p", 0, 0, 16).tolist()) == {100}
    assert set(w.lengths("p", 0, 6, 16).tolist()) == {110}
    assert set(w.lengths("p", 0, 15, 16).tolist()) == {110}  # tie between 10 and 20: the earlier
    assert set(w.lengths("p", 0, 99, 16).tolist()) == {120}
    assert set(w.lengths("q", 0, 99, 4).tolist()) == {5}


def test_prompt_tokens_and_caps() -> None:
    w = load_workload()
    trace = w.trace
    assert trace is not None and trace.prompt_tokens is not None
    p = w.prompts[0]
    assert w.prompt_tokens(p) == int(np.median(trace.prompt_tokens[trace.prompt_id == p]))
    assert w.max_length == 16384
    assert load_workload("kodcode-tests").max_length is None
    assert load_workload("synthetic-math").prompt_tokens("math-00000") is None


def test_argument_validation() -> None:
    w = load_workload()
    with pytest.raises(ConfigError, match="unknown prompt id 'nope'"):
        w.lengths("nope", 0, 0, 8)
    with pytest.raises(ConfigError, match="generation must be >= 0, got -1"):
        w.lengths(w.prompts[0], -1, 0, 8)
    with pytest.raises(ConfigError, match="group size must be >= 1, got 0"):
        w.lengths(w.prompts[0], 0, 0, 0)
    with pytest.raises(ConfigError, match="step must be >= 0"):
        w.lengths(w.prompts[0], 0, -2, 8)


def test_names_modes_and_paths(small: Path) -> None:
    assert list(bundled_workloads()) == ["kodcode-r1", "kodcode-tests", "synthetic-math", "synthetic-math-weak",
                                         "synthetic-math-strong", "video-rl", "agent-search", "math-drift",
                                         "rare-cap"]
    assert load_workload(None).name == "kodcode-r1"
    assert load_workload(str(small)).prompts == ("b", "c", "a")
    syn = load_workload("synthetic-math", mode="resample")  # synthetic names ignore the mode
    assert syn.mode is ReplayMode.SYNTHETIC and syn.max_length == 16384 and len(syn.prompts) == 2048
    assert load_workload(mode="synthetic").name == "synthetic-math"
    with pytest.raises(ConfigError, match="mode 'synthetic' needs a synthetic workload name"):
        load_workload(small, mode="synthetic")
    with pytest.raises(ConfigError, match="unknown replay mode 'replay'.*recorded, resample, synthetic"):
        load_workload(mode="replay")
    with pytest.raises(ConfigError, match="seed must be a non-negative integer, got -1"):
        load_workload(seed=-1)
    with pytest.raises(TraceError, match="no such trace 'synthetic-maths'"):
        load_workload("synthetic-maths")


# ------------------------------------------------------------------------------------------------------- streams


def test_stream_cycles_in_order_and_counts_epochs() -> None:
    s = PromptStream(["a", "b", "c"])
    refs = s.take(7)
    assert [r.prompt_id for r in refs] == ["a", "b", "c", "a", "b", "c", "a"]
    assert [r.index for r in refs] == list(range(7))
    assert [r.epoch for r in refs] == [0, 0, 0, 1, 1, 1, 2]
    assert s.position == 7 and s.epoch == 2
    assert s.take(0) == [] and s.position == 7


def test_stream_shuffle_is_a_seeded_permutation_per_epoch() -> None:
    prompts = [f"p{i}" for i in range(50)]
    a = PromptStream(prompts, shuffle=True, seed=4)
    b = PromptStream(prompts, shuffle=True, seed=4)
    ea, eb = a.take(100), [*b.take(30), *b.take(70)]  # chunking does not matter
    assert ea == eb
    first, second = [r.prompt_id for r in ea[:50]], [r.prompt_id for r in ea[50:]]
    assert sorted(first) == sorted(prompts) == sorted(second)
    assert first != second and first != prompts
    other = PromptStream(prompts, shuffle=True, seed=5).take(50)
    assert [r.prompt_id for r in other] != first


def test_stream_state_roundtrip() -> None:
    prompts = [f"p{i}" for i in range(7)]
    s = PromptStream(prompts, shuffle=True, seed=9)
    s.take(10)
    st = StreamState.from_json(json.loads(json.dumps(s.state().to_json())))
    resumed = PromptStream.from_state(prompts, st)
    assert resumed.take(20) == s.take(20)
    with pytest.raises(ConfigError, match="stream state is for 7 prompts, got 3"):
        PromptStream.from_state(prompts[:3], st)


def test_stream_validation() -> None:
    with pytest.raises(ConfigError, match="at least one prompt"):
        PromptStream([])
    with pytest.raises(ConfigError, match="take needs k >= 0, got -1"):
        PromptStream(["a"]).take(-1)


def test_columns_apply_to_trace_files_only() -> None:
    """A generated workload has no columns: naming one is an error, not silently ignored."""
    for kw in ({"length_column": "generated_tokens"}, {"prompt_column": "q"}):
        with pytest.raises(ConfigError, match=r"^workload 'rare-cap' is generated, not read from a file: a length or "
                                              r"prompt column applies to trace files only$"):
            load_workload("rare-cap", **kw)
    think, full = load_workload("kodcode-r1", length_column="think_tokens").trace, load_workload("kodcode-r1").trace
    assert think is not None and full is not None
    assert (think.meta["length_column"], full.meta["length_column"]) == ("think_tokens", "response_tokens")
    assert len(think) == len(full) == 696 and (think.length <= full.length).all()
    assert think.length.sum() < full.length.sum()
