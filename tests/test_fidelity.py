"""Fidelity beside every speedup: redraws, truncation against uniform, the paired noise rule, the Batch numbers,
resuming steps.jsonl files written before redraws existed."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from engine_fake import FakeServer
from tailsieve.analysis.fidelity import Truncation, redraws, truncated_share, truncation, verdict
from tailsieve.analysis.report import fidelity_notes, summarize, summary_table
from tailsieve.engines.rollout.api import Batch, Rollout, RolloutConfig
from tailsieve.engines.rollout.prompts import PromptRecord
from tailsieve.engines.rollout.resume import saved_step
from tailsieve.engines.rollout.runner import PolicyOutput
from tailsieve.engines.transport.engine_client import SamplingParams
from tailsieve.loop import PolicyRun, StepRecord

PROMPTS = tuple(PromptRecord(f"p{i}", f"prompt number {i}") for i in range(40))


def rec(i: int, t: float, m: int = 1) -> StepRecord:
    """Step i (warm-up at 0) with makespan t, q = m."""
    return StepRecord(step=i, makespan_s=t, tail_s=0.0, bulk_s=t, q=m, m=m, candidates=0, wasted_tokens=0,
                      batch_mean_length=1.0, warmup=i == 0)


def timed(name: str, times: list[float], m: int = 1) -> PolicyRun:
    """A run with these step makespans and one-response batches."""
    steps = tuple(rec(i, t, m) for i, t in enumerate(times))
    return PolicyRun(name, steps, tuple(np.ones((1, 1), np.int64) for _ in times), tuple(range(len(times))))


def lengths_run(name: str, batches: list[list[list[int]]], **kw: object) -> PolicyRun:
    """A run with these consumed batches (4 steps: the window is steps 2 and 3)."""
    arrs = tuple(np.array(b, dtype=np.int64) for b in batches)
    return PolicyRun(name, tuple(rec(i, 1.0) for i in range(len(arrs))), arrs, tuple(range(len(arrs))),
                     **kw)  # type: ignore[arg-type]


def test_redraws_max_and_mean_over_the_window() -> None:
    run = lengths_run("x", [[[1]], [[1]], [[1], [1]], [[1], [1], [1]]],
                      batch_redraws=tuple(np.array(r, np.int64) for r in ([5], [4], [0, 2], [1, 3, 0])))
    r = redraws(run)
    assert (r.max, r.mean) == (3, 1.2)  # steps 0 and 1 are outside the window: (0 + 2 + 1 + 3 + 0) / 5
    none = redraws(lengths_run("u", [[[1]]] * 4))  # a run that carries no redraws (uniform, older files)
    assert (none.max, none.mean) == (0, 0.0)


def test_truncation_from_the_cap_and_from_flags() -> None:
    policy = lengths_run("x", [[[99, 99]], [[99, 99]], [[10, 3]], [[12, 9]]], length_cap=10)
    uniform = lengths_run("uniform", [[[0, 0]], [[0, 0]], [[10, 1]], [[1, 1]]], length_cap=10)
    assert truncated_share(policy) == (0.5, "")
    assert truncation(policy, uniform) == Truncation(0.5, 0.25, 2.0)
    none = lengths_run("uniform", [[[1, 1]]] * 4, length_cap=10)
    assert truncation(policy, none) == Truncation(0.5, 0.0, None, "uniform truncated no response: compare the "
                                                                    "two shares")
    flags = tuple(np.array(f, dtype=bool) for f in ([[1, 1]], [[1, 1]], [[0, 0]], [[0, 1]]))
    flagged = lengths_run("x", [[[99, 99]], [[99, 99]], [[10, 3]], [[12, 9]]], length_cap=10, batch_truncated=flags)
    assert truncated_share(flagged) == (0.25, "")  # finish reasons win over the cap
    old = lengths_run("x", [[[1, 1]]] * 4, batch_truncated=(*flags[:3], None))
    assert truncated_share(old) == (None, "x: steps without finish reasons or cap (written by an older version)")
    assert truncated_share(lengths_run("x", [[[1]]] * 4)) == (None, "length cap unknown (the workload has no "
                                                                   "max_length)")


def test_identical_runs_are_within_noise_with_speedup_exactly_one() -> None:
    times = [30.0, 20.0, 11.0, 9.0, 12.0, 10.0]
    s = summarize({"uniform": timed("uniform", times), "x": timed("x", times)})["x"]
    assert s.speedup == 1.0 and s.verdict is not None
    assert (s.verdict.within_noise, s.verdict.left_uniform, s.verdict.speedup_2sigma) == (True, True, 0.0)
    assert s.verdict.note == "within noise of uniform (±0.0% at 2σ over 4 paired steps)"


def test_a_clear_ten_percent_gap_is_not_noise() -> None:
    uniform = timed("uniform", [200.0, 200.0, 109.0, 111.0, 110.0, 110.0, 109.0, 111.0])
    policy = timed("x", [200.0, 200.0, *[100.0] * 6])
    s = summarize({"uniform": uniform, "x": policy})["x"]
    assert s.speedup == pytest.approx(1.1) and s.verdict is not None
    band = 2 * math.sqrt(0.8) / math.sqrt(6) / 100  # d = (9, 11, 10, 10, 9, 11): std √0.8, 6 pairs, mean(T) 100
    assert s.verdict.speedup_2sigma == pytest.approx(band)
    assert (s.verdict.within_noise, s.verdict.left_uniform, s.verdict.paired_steps) == (False, True, 6)
    assert s.verdict.note == "1.100× is outside noise (±0.7% at 2σ over 6 paired steps)"


def test_a_run_that_never_left_the_boundary_says_so() -> None:
    uniform = timed("uniform", [5.0, 5.0, 10.0, 12.0, 11.0], m=0)
    policy = timed("x", [5.0, 5.0, 9.0, 12.0, 10.0], m=0)
    s = summarize({"uniform": uniform, "x": policy})
    v = s["x"].verdict
    assert v is not None and v.left_uniform is False
    assert v.note.startswith("never left the uniform boundary (q = m = 0 every steady step)")
    assert verdict(timed("x", [1.0, 1.0, 2.0]), timed("uniform", [1.0, 1.0, 3.0]), 1.5).note == \
        "too few paired steps (1) to tell the speedup from noise"
    line = fidelity_notes(s)[0]
    assert line.startswith("x: never left the uniform boundary") and line.endswith("redraws max 0, mean 0.00")
    assert s["uniform"].verdict is None
    table = summary_table(s, title="t")
    assert list(table.columns[3].cells) == ["-", f"±{100 * (v.speedup_2sigma or 0):.1f}% ~"]


def test_a_run_that_dealt_requests_at_the_boundary_routed_differently() -> None:
    """q = m = 0 throughout but its uniform steps dealt requests (`StepRecord.dealt`): verl's routing, not uniform's,
    so the speedup is judged by its noise band like any other."""
    uniform = timed("uniform", [5.0, 5.0, 10.0, 12.0, 11.0, 10.0], m=0)
    base = timed("x", [5.0, 5.0, 9.0, 11.0, 10.0, 9.0], m=0)
    dealt = replace(base, steps=tuple(replace(r, dealt=True) for r in base.steps))
    v = summarize({"uniform": uniform, "x": dealt})["x"].verdict
    assert v is not None and v.left_uniform is True and not v.within_noise
    assert v.note == "1.103× is outside noise (±0.0% at 2σ over 4 paired steps)"  # every step 1 s faster


def test_simulate_json_carries_redraws_truncation_and_verdict(capsys: pytest.CaptureFixture[str]) -> None:
    from tailsieve.cli import main

    assert main(["simulate", "--json", "--replicas", "4", "--groups", "16", "--group-size", "4", "--steps", "6",
                 "--policy", "static", "--q", "2", "--m", "1"]) == 0
    doc = json.loads(capsys.readouterr().out)["policies"]
    static, uniform = doc["static"], doc["uniform"]
    assert set(static["bias"]) == {"mean_ratio", "ks", "truncated_ratio", "truncated_share",
                                   "reference_truncated_share", "truncated_reason"}
    assert set(static["verdict"]) == {"within_noise", "left_uniform", "speedup_2sigma", "paired_steps", "note"}
    assert uniform["verdict"] is None and uniform["redraws"] == {"max": 0, "mean": 0.0}
    assert static["verdict"]["left_uniform"] is True and static["verdict"]["paired_steps"] == 4
    assert static["redraws"]["max"] == max(s["redraws_max"] for s in static["steps"][2:])
    assert static["steps"][1]["redraws_max"] >= 1  # step 1 isolates groups cut at the warm-up


def test_batch_fidelity_numbers() -> None:
    record = rec(3, 1.0)
    b = Batch(3, (), record, (), 0, 0.0, (), redraws=(2, 0, 1), truncated=((True, False), (False, False), (True,
                                                                                                         True)))
    assert (b.redraws_max, b.redraws_mean, b.truncated_share, b.wasted_tokens) == (2, 1.0, 0.5, 0)
    empty = Batch(3, (), record, (), 0, 0.0, ())
    assert (empty.redraws_max, empty.redraws_mean, empty.truncated_share) == (0, 0.0, None)


@pytest.fixture
def servers() -> Iterator[list[FakeServer]]:
    with FakeServer() as a, FakeServer() as b:
        yield [a, b]


def test_rollout_batches_carry_redraws_and_finish_reason_truncation(servers: list[FakeServer]) -> None:
    cfg = RolloutConfig(groups=4, group_size=4, rho=0.5, policy="static", q=1, m=1,
                        sampling=SamplingParams(max_tokens=60))

    async def go() -> list[Batch]:
        async with Rollout([s.url for s in servers], cfg, PROMPTS) as r:
            return [await r.step() for _ in range(3)]

    batches = asyncio.run(go())
    assert batches[0].redraws == (0, 0, 0, 0) and batches[1].redraws[0] == 1  # the tail group was cut at warm-up
    for b in batches:
        cuts = {o.ref.uid: o.ref.cuts for o in b.outcomes}
        assert b.redraws == tuple(cuts[g.uid] for g in b.groups) and b.record.redraws_max == max(b.redraws)
        assert b.truncated == tuple(tuple(r == "length" for r in g.finish_reasons) for g in b.groups)
        assert b.truncated == tuple(tuple(n >= 60 for n in g.lengths) for g in b.groups)  # the fake stops at cap


def test_resume_of_a_steps_file_without_redraws(tmp_path: Path) -> None:
    (tmp_path / "x").mkdir()
    old = {"step": 0, "makespan_s": 2.0, "tail_s": 0.0, "bulk_s": 2.0, "q": 0, "m": 0, "candidates": 2,
           "wasted_tokens": 5, "batch_mean_length": 3.0, "warmup": True, "note": "", "lengths": [[3, 3], [3, 3]],
           "uids": [0, 1], "prompt_ids": ["p0", "p1"], "redispatched": 0, "down": [], "started_at": 0.0}
    po = PolicyOutput(tmp_path, "x")
    po.load([saved_step("steps.jsonl, line 1", json.loads(json.dumps(old)))])
    run = po.run()
    assert run.steps[0].redraws_max == 0 and run.steps[0].wasted_tokens == 5
    assert [r.tolist() for r in run.batch_redraws] == [[0, 0]]
    assert run.batch_truncated == (None,)
    assert (redraws(run).max, redraws(run).mean) == (0, 0.0)
    assert truncated_share(run) == (None, "x: steps without finish reasons or cap (written by an older version)")


def test_rollout_cli_writes_redraws_and_prints_them(servers: list[FakeServer], tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    from tailsieve.cli import main

    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"question_id": f"q{i}", "question": f"{i}?"}) + "\n" for i in range(30)))
    out = tmp_path / "run"
    assert main(["rollout", "--endpoints", ",".join(s.url for s in servers), "--prompts", str(prompts), "--groups",
                 "4", "--group-size", "3", "--rho", "0.5", "--max-tokens", "30", "--steps", "3", "--policy",
                 "static,uniform", "--out", str(out)]) == 0
    lines = [json.loads(x) for x in (out / "static" / "steps.jsonl").read_text().splitlines()]
    assert [max(ln["redraws"]) for ln in lines] == [ln["redraws_max"] for ln in lines]
    assert lines[1]["redraws"][0] == 1 and all(len(ln["truncated"]) == 4 for ln in lines)
    err = capsys.readouterr().err
    assert "static step 1: " in err and f"redraws={lines[1]['redraws_max']}/" in err
    rep = json.loads((out / "report.json").read_text())["policies"]
    assert set(rep["static"]["bias"]) >= {"truncated_ratio", "truncated_share", "reference_truncated_share"}
    assert rep["static"]["verdict"]["paired_steps"] == 1 and rep["uniform"]["verdict"] is None
