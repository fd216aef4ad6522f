"""The paired rule's arithmetic (`policy.paired`): the paired gain and its standard error against a brute-force
computation, the common lottery cancelling, and the value of a move, V = horizon·(ḡ − z·s) − C (plain z: no
Student-t widening of the margin for short histories), −∞ below one degree of freedom."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from tailsieve.policy.paired import paired_gain, t_quantile, value


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
    """V = horizon·(ḡ − t·s) − C exactly, t Student's quantile at the normal confidence Φ(z) with the paired degrees
    of freedom (`t_quantile`); its parts are kept; `beyond_noise` says the gain clears t·s before the cost (V + C > 0,
    strictly)."""
    t10 = t_quantile(2.0, 10)
    p = value(3.0, 0.5, 10, 4.0, 2.0, 8)
    assert (p.gain_s, p.se_s, p.cost_s, p.value_s) == (3.0, 0.5, 4.0, 8 * (3.0 - t10 * 0.5) - 4.0)
    assert p.beyond_noise and 2.0 < t10 < 2.4
    # the margin widens as the history shrinks: fewer steps, a less certain standard error
    vals = [value(3.0, 0.5, dof, 4.0, 2.0, 8).value_s for dof in (1, 2, 3, 10, 200, 201)]
    assert vals == sorted(vals) and vals[-1] == 8 * (3.0 - 2.0 * 0.5) - 4.0 == 12.0  # past 200 dof: z itself
    assert value(3.0, 0.0, 10, 0.0, 2.0, 8).value_s == 24.0  # s = 0: no margin
    unpaid = value(1.0, 0.25, 10, 100.0, 2.0, 8)
    assert unpaid.value_s == 8 * (1.0 - t10 * 0.25) - 100.0 and unpaid.beyond_noise
    noise = value(1.0, 1.0, 10, 0.0, 2.0, 8)
    assert noise.value_s < 0 and not noise.beyond_noise
    edge = value(t_quantile(2.0, 3) * 0.5, 0.5, 3, 0.0, 2.0, 8)  # ḡ = t·s exactly: V = 0, not beyond the noise
    assert edge.value_s == 0.0 and not edge.beyond_noise
    rng = np.random.default_rng(7)
    for _ in range(200):
        g, s, c, z = rng.normal(0, 5), rng.uniform(0, 3), rng.uniform(0, 50), rng.uniform(0, 3)
        h, dof = int(rng.integers(1, 20)), int(rng.integers(1, 40))
        p, t = value(g, s, dof, c, z, h), t_quantile(z, dof)
        assert p.value_s == h * (g - t * s) - c and p.beyond_noise == (h * (g - t * s) > 0), (g, s, c, z, h, dof)


@pytest.mark.parametrize("p", [0.6, 0.841344746, 0.9, 0.975, 0.999])
def test_t_quantile_against_closed_forms(p: float) -> None:
    """Student's quantile at probability p: tan(π(p − ½)) with one degree of freedom, (2p − 1)/√(2p(1 − p)) with two
    (the closed forms); the normal quantile is its limit, so t(z, dof) falls to z as dof grows, from above."""
    z = math.sqrt(2.0) * _erfinv(2 * p - 1)
    assert t_quantile(z, 1) == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=1e-9)
    assert t_quantile(z, 2) == pytest.approx((2 * p - 1) / math.sqrt(2 * p * (1 - p)), rel=1e-9)
    ts = [t_quantile(z, d) for d in (1, 2, 3, 5, 9, 30, 100, 200)]
    assert all(a > b > z for a, b in itertools.pairwise(ts)) and ts[-1] - z < 0.02 * z
    assert t_quantile(z, 201) == z and t_quantile(0.0, 3) == 0.0
    # table values of t_{0.975}: 12.706 (1), 4.303 (2), 3.182 (3), 2.228 (10)
    for dof, want in ((1, 12.706), (2, 4.303), (3, 3.182), (10, 2.228)):
        assert t_quantile(1.959963985, dof) == pytest.approx(want, abs=1e-3)


def _erfinv(y: float) -> float:
    """Inverse error function by bisection on math.erf (a test reference)."""
    lo, hi = -10.0, 10.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if math.erf(mid) < y else (lo, mid)
    return (lo + hi) / 2


def test_no_degree_of_freedom_never_moves() -> None:
    """No degree of freedom (fewer than two history steps): s unknown, V = −∞ whatever the gain, even at s = 0."""
    for se in (math.inf, 0.5, 0.0):
        p = value(1e6, se, 0, 0.0, 2.0, 8)
        assert p.value_s == -math.inf and not p.beyond_noise, se
    assert value(1.0, math.inf, 0, 0.0, 2.0, 8).value_s == -math.inf
    assert value(1.0, 0.0, -1, 0.0, 2.0, 8).value_s == -math.inf


def test_t_quantile_far_in_the_tail() -> None:
    """A large z with one degree of freedom lies far past any fixed search bound: tan(π(Φ(4) − ½)) ≈ 10,050."""
    p = 0.5 * (1 + math.erf(4.0 / math.sqrt(2.0)))
    assert t_quantile(4.0, 1) == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=1e-6)
    assert t_quantile(4.0, 1) > 1e4 and math.isfinite(t_quantile(40.0, 1))
