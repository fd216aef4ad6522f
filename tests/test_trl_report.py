"""The TRL run's closing-note table (`integrations/trl/report.py`): TRL's log entries joined with the session's step
stats and the weight pushes, step by step, and its exact text."""

from __future__ import annotations

from tailsieve.integrations.trl.probe import ProbeResult, ReplicaProbe
from tailsieve.integrations.trl.report import TableRow, format_table, table_rows
from tailsieve.integrations.trl.session import PushRecord, StepStats


def stats(step: int, carried: int, cut: int) -> StepStats:
    return StepStats(step, step, 0, carried, cut, 1.5 + step, (0, 1), (1, 2))


def push(step: int, agree: bool) -> PushRecord:
    gap = 0.0 if agree else 0.5
    probe = ProbeResult(step, (ReplicaProbe(0, (1, 2), 2, 0.0), ReplicaProbe(1, (1, 3), 1, gap)))
    return PushRecord(step, step, ("in-place", "in-place"), 0.25, probe)


LOGS = [{"loss": 0.1, "reward": 0.75, "step_time": 4.0, "step": 1}, {"loss": 0.2, "reward": 0.5, "step_time": 2.0,
                                                                        "step": 2},
        {"train_runtime": 6.0, "step": 2}]


def test_rows_join_trl_logs_session_steps_and_pushes() -> None:
    rows = table_rows(LOGS, [stats(0, 0, 1), stats(1, 1, 0)], [push(1, True), push(2, False)])
    assert rows == (TableRow(1, 0.75, 4.0, 1.5, 0.25, 0, 0, "2/2", 0, 1),
                    TableRow(2, 0.5, 2.0, 2.5, 0.25, 1, 0, "1/2", 1, 0))


def test_several_optimizer_steps_per_generation_share_its_stats() -> None:
    logs = [{"reward": 0.1 * s, "step_time": 1.0, "step": s} for s in (1, 2, 3, 4)]
    rows = table_rows(logs, [stats(0, 0, 0), stats(1, 2, 0)], [], steps_per_generation=2)
    assert [(r.step, r.weight_version, r.carried_in, r.probe, r.push_s) for r in rows] == [
        (1, 0, 0, "-", None), (2, 0, 0, "-", None), (3, 1, 2, "-", None), (4, 1, 2, "-", None)]


def test_a_logged_step_without_a_generation_is_left_out() -> None:
    assert table_rows(LOGS, [stats(0, 0, 0)], []) == (TableRow(1, 0.75, 4.0, 1.5, None, 0, 0, "-", 0, 0),)


def test_format_is_fixed_width_with_a_totals_line() -> None:
    rows = (TableRow(1, 0.75, 4.0, 1.5, 0.25, 0, 0, "2/2", 0, 1), TableRow(2, None, 12.5, 2.5, None, 1, 0, "-", 1, 0))
    assert format_table(rows).splitlines() == [
        "step  reward  step_s  rollout_s  push_s  version  stale_samples  probe  carried_in  cut",
        "   1   0.750   4.000      1.500   0.250        0              0    2/2           0    1",
        "   2       -  12.500      2.500       -        1              0      -           1    0",
        "2 steps, stale_samples 0, tail groups carried 1",
    ]
    assert format_table(()).splitlines()[-1] == "0 steps, stale_samples 0, tail groups carried 0"
