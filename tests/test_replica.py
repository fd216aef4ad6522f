"""Replica simulator: equals the closed form with options off, and a token-by-token reference with them on."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import curves, make_curve
from tailsieve.errors import ConfigError
from tailsieve.model.curves import TpotCurve
from tailsieve.model.makespan import finish_times, makespan
from tailsieve.simulation.replica import ReplicaConfig, _event_loop, run_replica


def reference(
    lengths: list[int], prompts: list[int], curve: TpotCurve, cfg: ReplicaConfig
) -> tuple[list[float], list[tuple[float, list[int]]]]:
    """Token-by-token: finish times and (time, tokens generated) after every iteration and stall."""
    n = len(lengths)
    cap = n if cfg.max_num_seqs is None else cfg.max_num_seqs
    gen = [0] * n
    finish = [0.0] * n
    running: list[int] = []
    nxt, t = 0, 0.0
    trace: list[tuple[float, list[int]]] = [(0.0, [0] * n)]
    while True:
        if len(running) < cap and nxt < n:
            take = list(range(nxt, min(n, nxt + cap - len(running))))
            nxt = take[-1] + 1
            t += cfg.prefill_ms_per_token / 1e3 * sum(prompts[i] for i in take)
            for i in take:
                if lengths[i] == 0:
                    finish[i] = t
                else:
                    running.append(i)
            trace.append((t, list(gen)))
            continue
        if not running:
            break
        ctx = sum(prompts[i] + gen[i] for i in running)
        t += curve.tpot_s(len(running)) + cfg.kv_ms_per_1k_tokens / 1e6 * ctx
        for i in running:
            gen[i] += 1
        for i in [i for i in running if gen[i] == lengths[i]]:
            finish[i] = t
            running.remove(i)
        trace.append((t, list(gen)))
    return finish, trace


@settings(max_examples=120, deadline=None)
@given(st.lists(st.integers(0, 25), max_size=8), curves())
def test_all_admit_equals_closed_form(lengths: list[int], curve: TpotCurve) -> None:
    run = run_replica(lengths, curve)
    assert run.finish_s == pytest.approx(finish_times(lengths, curve), abs=1e-12)
    assert run.makespan == pytest.approx(makespan(lengths, curve), abs=1e-12)
    # the general event loop agrees with the vectorised closed-form path
    lens = np.asarray(lengths, np.int64)
    loop = _event_loop(lens, np.zeros_like(lens), curve, ReplicaConfig())
    assert loop.finish_s == pytest.approx(run.finish_s, abs=1e-12)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 20), st.integers(0, 30)), min_size=1, max_size=8),
    st.one_of(st.none(), st.integers(1, 4)),
    st.sampled_from([0.0, 0.5, 3.0]),
    st.sampled_from([0.0, 0.2]),
    curves(),
)
def test_options_match_token_by_token(
    pairs: list[tuple[int, int]], cap: int | None, kv: float, pre: float, curve: TpotCurve
) -> None:
    lengths = [p[0] for p in pairs]
    prompts = [p[1] for p in pairs]
    cfg = ReplicaConfig(max_num_seqs=cap, kv_ms_per_1k_tokens=kv, prefill_ms_per_token=pre)
    run = run_replica(lengths, curve, cfg, prompts)
    want, trace = reference(lengths, prompts, curve, cfg)
    assert run.finish_s == pytest.approx(want, rel=1e-9, abs=1e-12)
    for t, gen in trace:  # an abort just after each iteration reports exactly the tokens generated so far
        assert list(run.tokens_at(t + 1e-12)) == gen


def test_tokens_at_mid_iteration_and_after_finish() -> None:
    c = make_curve(batch=(1, 2), tpot_ms=(1000.0, 2000.0))  # τ(1) = 1 s, τ(2) = 2 s
    run = run_replica([2, 5], c)
    assert list(run.finish_s) == pytest.approx([4.0, 7.0])
    assert list(run.tokens_at(0.0)) == [0, 0]
    assert list(run.tokens_at(3.9)) == [1, 1]
    assert list(run.tokens_at(4.0)) == [2, 2]
    assert list(run.tokens_at(5.5)) == [2, 3]
    assert list(run.tokens_at(100.0)) == [2, 5]


def test_cap_queues_fcfs() -> None:
    c = make_curve(batch=(1, 2), tpot_ms=(1000.0, 2000.0))
    run = run_replica([3, 1, 2], c, ReplicaConfig(max_num_seqs=2))
    # 0 and 1 run together (2 s/iter); 1 ends at 2 s; 2 joins; two left for 2 iterations (4 s): 0 ends at 6 s
    assert list(run.finish_s) == pytest.approx([6.0, 2.0, 6.0])
    assert list(run.start_iter) == [0, 0, 1]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_num_seqs": 0}, "max_num_seqs must be >= 1 or None, got 0"),
        ({"kv_ms_per_1k_tokens": -1.0}, "kv_ms_per_1k_tokens must be finite and >= 0, got -1.0"),
        ({"prefill_ms_per_token": float("nan")}, "prefill_ms_per_token must be finite and >= 0, got nan"),
    ],
)
def test_config_validation(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ReplicaConfig(**kwargs)  # type: ignore[arg-type]
