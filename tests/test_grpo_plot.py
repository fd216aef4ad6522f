"""The GRPO example's q/m panel (examples/grpo_cpu/train.py `qm_panel`, issue 42): q and m both visible on an
integer axis from 0 (integer ticks, none below), also where they coincide (both 0 at uniform, where the old panel
drew a ±0.04 axis with q hidden under m)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")

TRAIN = Path(__file__).resolve().parents[1] / "examples" / "grpo_cpu" / "train.py"

# (q, m) per step: uniform throughout, the tail pool used then left, q = m, q far above m
TRAJECTORIES = {
    "uniform": ([0] * 6, [0] * 6),
    "leaves-and-returns": ([0, 0, 4, 4, 2, 0], [0, 0, 1, 1, 1, 0]),
    "q-equals-m": ([0, 1, 1, 1, 1, 1], [0, 1, 1, 1, 1, 1]),
    "many-groups": ([0, 8, 12, 12, 12, 12], [0, 1, 1, 1, 1, 1]),
}


def _train() -> ModuleType:
    spec = importlib.util.spec_from_file_location("grpo_train", TRAIN)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["grpo_train"] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("name", list(TRAJECTORIES))
def test_q_and_m_are_both_visible_on_an_integer_axis_from_zero(name: str) -> None:
    import matplotlib.pyplot as plt

    q, m = TRAJECTORIES[name]
    fig, ax = plt.subplots()
    _train().qm_panel(ax, list(range(len(q))), q, m)
    fig.canvas.draw()
    low, high = ax.get_ylim()
    assert -0.5 < low < 0 and high == max([*q, *m, 1]) + 0.5  # a line at 0 is above the frame, not on it
    ticks = [t for t in ax.get_yticks() if low <= t <= high]
    assert ticks[0] == 0 and all(float(t).is_integer() for t in ticks) and ticks[-1] >= max([*q, *m, 1]) / 2
    assert all(float(t).is_integer() for t in ax.get_xticks())
    lq, lm = ax.get_lines()
    assert [list(lq.get_ydata()), list(lm.get_ydata())] == [q, m]
    assert lq.get_marker() != lm.get_marker() and lq.get_linestyle() != lm.get_linestyle()
    assert lq.get_color() != lm.get_color()
    assert lq.get_markerfacecolor() == "none"  # hollow: m's filled marker shows through q's where they coincide
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["q (isolated groups)", "m (tail replicas)"]
    plt.close(fig)


def _row(mod: ModuleType, step: int, step_s: float, balancer_s: float | None) -> object:
    return mod.StepRow(step, 0.5, 10.0, 20, 0, 0, step_s, 1.0, 1.0, 0, 0.0, 0.0, step, step == 0, balancer_s)


def test_the_step_panel_shows_the_balancers_step_times_beside_the_policys() -> None:
    """grpo.png's step panel (issue 50, item 6): the policy's step seconds and verl's balancer's measurement step on
    the same weights, step 0 apart; without the balancer (--against none) only the policy's."""
    import matplotlib.pyplot as plt

    mod = _train()
    rows = [_row(mod, 0, 30.0, 9.0), _row(mod, 1, 5.0, 6.0), _row(mod, 2, 4.0, 6.5)]
    fig, ax = plt.subplots()
    mod.step_panel(ax, rows, "tailsieve")
    ours, lif, _ = ax.get_lines()
    assert list(ours.get_ydata()) == [5.0, 4.0] and list(lif.get_ydata()) == [6.0, 6.5]
    assert list(lif.get_xdata()) == [1, 2] and lif.get_linestyle() != ours.get_linestyle()
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "tailsieve", "verl-lif (verl's balancer)", "step 0 (warm-up): 30.0 s"]
    assert ax.get_ylim()[1] == pytest.approx(1.15 * 6.5)  # scaled to the later steps of both
    plt.close(fig)
    fig, ax = plt.subplots()
    mod.step_panel(ax, [_row(mod, 0, 30.0, None), _row(mod, 1, 5.0, None)], "tailsieve")
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["tailsieve", "step 0 (warm-up): 30.0 s"]
    plt.close(fig)
