"""The paired rule's arithmetic (`policy.paired`): the paired gain and its standard error against a brute-force
computation, the common lottery cancelling, and the value of a move, V = horizon·(ḡ − z·s) − C (plain z: no
Student-t widening of the margin for short histories), −∞ below one degree of freedom."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tailsieve.policy.paired import paired_gain, value


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
    """V = horizon·(ḡ − z·s) − C exactly, whatever the degrees of freedom from one on (the margin is z·s, not a
    Student-t quantile that widens it for two or three history steps); its parts are kept; `beyond_noise` says the
    gain clears z·s before the cost (V + C > 0, strictly)."""
    p = value(3.0, 0.5, 10, 4.0, 2.0, 8)
    assert (p.gain_s, p.se_s, p.cost_s, p.value_s) == (3.0, 0.5, 4.0, 12.0)  # 8·(3 − 2·0.5) − 4, in exact binary
    assert p.beyond_noise
    for dof in (1, 2, 3, 10**9):  # no dependence on dof: a t quantile would shrink V at small dof
        assert value(3.0, 0.5, dof, 4.0, 2.0, 8).value_s == 12.0, dof
    assert value(3.0, 0.0, 10, 0.0, 2.0, 8).value_s == 24.0  # s = 0: no margin
    unpaid = value(1.0, 0.25, 10, 100.0, 2.0, 8)
    assert unpaid.value_s == 8 * (1.0 - 0.5) - 100.0 == -96.0 and unpaid.beyond_noise
    noise = value(1.0, 1.0, 10, 0.0, 2.0, 8)
    assert noise.value_s == -8.0 and not noise.beyond_noise
    edge = value(1.0, 0.5, 3, 0.0, 2.0, 8)  # ḡ = z·s exactly: V = 0, not beyond the noise
    assert edge.value_s == 0.0 and not edge.beyond_noise
    rng = np.random.default_rng(7)
    for _ in range(200):
        g, s, c, z = rng.normal(0, 5), rng.uniform(0, 3), rng.uniform(0, 50), rng.uniform(0, 3)
        h, dof = int(rng.integers(1, 20)), int(rng.integers(1, 40))
        p = value(g, s, dof, c, z, h)
        assert p.value_s == h * (g - z * s) - c and p.beyond_noise == (h * (g - z * s) > 0), (g, s, c, z, h, dof)
    # no degree of freedom (fewer than two history steps): s unknown, V = −∞ whatever the gain, even at s = 0
    for se in (math.inf, 0.5, 0.0):
        p = value(1e6, se, 0, 0.0, 2.0, 8)
        assert p.value_s == -math.inf and not p.beyond_noise, se
    assert value(1.0, math.inf, 0, 0.0, 2.0, 8).value_s == -math.inf
    assert value(1.0, 0.0, -1, 0.0, 2.0, 8).value_s == -math.inf
