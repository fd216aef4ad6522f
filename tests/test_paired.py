"""The paired rule's arithmetic (`policy.paired`): the t quantile against tables, the paired gain and its standard
error against a brute-force computation, the common lottery cancelling, and the value of a move."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tailsieve.policy.paired import paired_gain, t_quantile, value

# two-sided 95% and 98% Student-t quantiles (upper-tail 0.025 and 0.01), from the standard tables
T_975 = {3: 3.182, 4: 2.776, 5: 2.571, 10: 2.228, 15: 2.131, 30: 2.042}
T_99 = {3: 4.541, 5: 3.365, 10: 2.764, 15: 2.602}


@pytest.mark.parametrize(("z", "table"), [(1.959964, T_975), (2.326348, T_99)])
def test_t_quantile_matches_tables(z: float, table: dict[int, float]) -> None:
    for dof, exact in table.items():
        assert t_quantile(z, dof) == pytest.approx(exact, rel=5e-3), dof


def test_t_quantile_limits() -> None:
    assert t_quantile(2.0, 0) == math.inf
    assert t_quantile(2.0, 10**9) == pytest.approx(2.0, abs=1e-6)
    assert t_quantile(0.0, 4) == 0.0


def test_paired_gain_by_history_step_brute_force() -> None:
    rng = np.random.default_rng(3)
    steps, rounds = 4, 3
    cur = rng.uniform(50, 150, steps * rounds)
    opt = cur - rng.uniform(-5, 10, steps * rounds)
    g, se, dof = paired_gain(cur, opt, steps)
    per = [np.mean([cur[k] - opt[k] for k in range(steps * rounds) if k % steps == h]) for h in range(steps)]
    mean = sum(per) / steps
    sd = math.sqrt(sum((x - mean) ** 2 for x in per) / (steps - 1))
    assert g == pytest.approx(mean, rel=1e-12)
    assert se == pytest.approx(sd / math.sqrt(steps), rel=1e-12)
    assert dof == steps - 1


def test_the_lottery_of_a_step_cancels() -> None:
    # each history step's pools swing by ±60 s, shared by both options: the paired gain is exact, its error 0
    swing = np.repeat(np.random.default_rng(0).normal(0, 60, 8), 2).reshape(2, 8).T.ravel()
    g, se, _ = paired_gain(100 + swing, 97.5 + swing, 8)
    assert g == pytest.approx(2.5)
    assert se == pytest.approx(0.0, abs=1e-9)


def test_fewer_than_two_steps_is_unknown() -> None:
    assert paired_gain(np.ones(12), np.zeros(12), 1)[1:] == (math.inf, 0)
    assert paired_gain(np.ones(10), np.zeros(10), 4)[1:] == (math.inf, 0)  # not whole rounds of the steps


def test_value_of_a_move() -> None:
    p = value(3.0, 0.5, 10, 4.0, 2.0, 8)
    assert p.value_s == pytest.approx(8 * (3.0 - t_quantile(2.0, 10) * 0.5) - 4.0)
    assert p.beyond_noise
    assert value(3.0, 0.0, 10, 0.0, 2.0, 8).value_s == pytest.approx(24.0)
    unpaid = value(1.0, 0.1, 10, 100.0, 2.0, 8)
    assert unpaid.value_s < 0 and unpaid.beyond_noise
    noise = value(1.0, 1.0, 10, 0.0, 2.0, 8)
    assert noise.value_s < 0 and not noise.beyond_noise
    assert value(1.0, math.inf, 0, 0.0, 2.0, 8).value_s == -math.inf
