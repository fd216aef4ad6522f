"""The verdict against verl's balancer pooled over independent replications (issue 50, item 4;
`analysis/replications.py`, `simulate`/`plan --replications`): pooling, the stopping rule, the band against brute
force, no false narrowing on a recorded replay, and a narrower band on the bundled heavy-tailed workloads."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from tailsieve.analysis.balancer import Standing, against_balancer
from tailsieve.analysis.replications import FLOOR, RESOLVE, pool_runs, replicate, unpooled_fields
from tailsieve.cli import main
from tailsieve.loop import SKIP_STEPS, PolicyRun, StepRecord

STEPS = 8


def _run(name: str, times: list[float], length: int = 10) -> PolicyRun:
    steps = tuple(StepRecord(step=i, makespan_s=t, tail_s=t, bulk_s=t, q=1 if i else 0, m=1 if i else 0,
                             candidates=0, wasted_tokens=0, batch_mean_length=float(length), warmup=i == 0)
                  for i, t in enumerate(times))
    return PolicyRun(name, steps, tuple(np.full((2, 2), length + i, np.int64) for i in range(len(times))),
                     tuple(range(len(times))), step_dropped=tuple(range(len(times))))


def _pair(r: int, delta: float, noise: float) -> tuple[PolicyRun, PolicyRun]:
    rng = np.random.default_rng(r)
    lif = [10.0 + float(x) for x in rng.uniform(0, 4, STEPS)]
    ours = [t - delta + noise * float(e) for t, e in zip(lif, rng.standard_normal(STEPS), strict=True)]
    return _run("tailsieve", ours, 9), _run("verl-lif", lif)


def test_every_per_step_field_is_pooled() -> None:
    assert unpooled_fields() == set()


def test_pooled_runs_keep_the_first_whole_and_drop_later_warm_ups() -> None:
    a, b, c = (_pair(r, 0.5, 1.0)[0] for r in range(3))
    pooled = pool_runs([a, b, c])
    kept = STEPS - SKIP_STEPS
    assert [s.step for s in pooled.steps] == list(range(STEPS + 2 * kept))
    assert [s.makespan_s for s in pooled.steps] == [s.makespan_s for s in (*a.steps, *b.steps[2:], *c.steps[2:])]
    assert len(pooled.batch_lengths) == len(pooled.steps) and pooled.step_dropped == (
        *range(STEPS), *range(2, STEPS), *range(2, STEPS))
    assert pooled.consumed_uids == a.consumed_uids and pooled.policy == "tailsieve"


def test_the_pooled_band_is_the_paired_rule_over_every_runs_window() -> None:
    calls: list[int] = []

    def more(r: int) -> tuple[PolicyRun, PolicyRun]:
        calls.append(r)
        return _pair(r + 1, 0.05, 2.0)

    v = replicate(*_pair(1, 0.05, 2.0), more, max_runs=3)
    assert calls == [1, 2] and v.runs == 3 and v.standing is Standing.WITHIN_NOISE
    pairs = [_pair(r + 1, 0.05, 2.0) for r in range(3)]
    ours = np.concatenate([[s.makespan_s for s in p[0].steps[SKIP_STEPS:]] for p in pairs])
    theirs = np.concatenate([[s.makespan_s for s in p[1].steps[SKIP_STEPS:]] for p in pairs])
    d = theirs - ours
    assert v.paired_steps == 3 * (STEPS - SKIP_STEPS)
    assert v.speedup_2sigma == pytest.approx(2 * d.std(ddof=1) / math.sqrt(d.size) / ours.mean())
    assert v.speedup == pytest.approx(theirs.mean() / ours.mean())
    assert v.length_ratio is not None and v.length_ratio < 1 and "responses" in v.note and "in 3 runs" in v.note
    assert v.steps_needed == math.ceil(v.paired_steps * (v.speedup_2sigma / max(abs(v.speedup - 1), FLOOR)) ** 2)


def test_a_resolved_verdict_runs_nothing_more() -> None:
    def more(r: int) -> tuple[PolicyRun, PolicyRun]:
        raise AssertionError("a resolved verdict must not add runs")

    v = replicate(*_pair(0, 3.0, 0.1), more, max_runs=4)
    assert v.standing is Standing.PAYS and v.runs == 1 and v.steps_needed is None
    assert v == against_balancer(*_pair(0, 3.0, 0.1))


SMALL = ["--groups", "16", "--group-size", "4", "--replicas", "4", "--steps", "12", "--policy", "tailsieve,verl-lif"]


def _vs(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    assert main(["simulate", *SMALL, *argv, "--json"]) == 0
    out: dict[str, object] = json.loads(capsys.readouterr().out)["vs_balancer"]["tailsieve"]
    return out


@pytest.mark.parametrize("workload", ["synthetic-math-strong", "rare-cap"])
def test_replications_narrow_the_band_on_heavy_tailed_workloads(workload: str,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    one = _vs(["--workload", workload, "--replications", "1"], capsys)
    pooled = _vs(["--workload", workload, "--replications", "4"], capsys)
    assert one["runs"] == 1 and one["paired_steps"] == 10
    assert pooled["runs"] in (1, 2, 3, 4)
    if pooled["runs"] == 4:  # ran to the end: 4 × 10 pairs, about half the band
        assert pooled["paired_steps"] == 40
        assert pooled["speedup_2sigma"] < one["speedup_2sigma"]  # type: ignore[operator]
    else:  # stopped early: resolved or narrow enough
        assert pooled["standing"] != "within_noise" or pooled["speedup_2sigma"] <= FLOOR  # type: ignore[operator]


def test_a_recorded_replay_is_never_pooled_with_copies_of_itself(capsys: pytest.CaptureFixture[str]) -> None:
    vs = _vs(["--workload", "kodcode-r1", "--replay", "recorded", "--replications", "4"], capsys)
    assert vs["runs"] == 1  # the same draws again would narrow the band falsely


def test_replications_out_of_range_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", *SMALL, "--replications", "0"]) == 1
    err = capsys.readouterr().err.strip()
    assert err == "tailsieve simulate: error: --replications must be an integer in 1..1000, got 0"


def test_a_narrow_band_within_noise_asks_for_no_more_steps() -> None:
    lif = [10.0 + i % 3 for i in range(STEPS)]
    ours = [t + 0.05 * (-1) ** i for i, t in enumerate(lif)]  # paired differences ±0.05: mean 0, band ~1%
    v = against_balancer(_run("tailsieve", ours), _run("verl-lif", lif))
    assert v.standing is Standing.WITHIN_NOISE and v.speedup_2sigma is not None and v.speedup_2sigma <= FLOOR
    assert v.steps_needed is None
    assert v.note.endswith("a band narrow enough to show any difference of 2% or more")


def test_a_resolved_verdict_with_a_wide_band_gets_runs_until_a_ten_percent_difference_would_show() -> None:
    """Pays at 1.5× but with a band above 10%: runs are added until the band is at most 10% (`RESOLVE`)."""
    calls: list[int] = []

    def pair(r: int) -> tuple[PolicyRun, PolicyRun]:
        lif = [30.0 + 20.0 * ((r + i) % 2) for i in range(STEPS)]
        return _run("tailsieve", [t / 1.5 + 6.0 * (-1) ** i for i, t in enumerate(lif)]), _run("verl-lif", lif)

    def more(r: int) -> tuple[PolicyRun, PolicyRun]:
        calls.append(r)
        return pair(r)

    first = against_balancer(*pair(0))
    assert first.standing is Standing.PAYS and first.speedup_2sigma is not None and first.speedup_2sigma > RESOLVE
    v = replicate(*pair(0), more, max_runs=8)
    assert v.standing is Standing.PAYS and v.speedup_2sigma is not None and v.speedup_2sigma <= RESOLVE
    assert calls == list(range(1, v.runs)) and v.runs > 1
