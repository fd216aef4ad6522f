"""Ablations of the paired rule's mechanisms for the ledger (bench/README.md, "Ablation ledger"; issue 40 item 6):
each name takes one mechanism out of `tailsieve` by patching it in the worker process that runs the regime, so the
package carries no switch to turn its own behaviour off. `bench_family.py --ablate NAME` runs `tailsieve` so
patched, beside the unpatched one, on the same streams.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

import numpy as np

import tailsieve.policy.paired_rule as paired_rule
import tailsieve.policy.predictor as predictor
import tailsieve.policy.tailsieve_rule as rule
from tailsieve.policy.control_state import ControlState
from tailsieve.policy.controller_base import Controller

FloatArray = np.ndarray


def _unpaired(current: FloatArray, option: FloatArray, steps: int) -> tuple[float, float, int]:
    """Each option's mean over the history steps with its own error, as if priced on independent draws: the
    standard error of the difference is √(s_a² + s_o²)/√H instead of the paired sd(d)/√H."""
    k = len(current)
    if steps < 2 or k % steps:
        return float(np.mean(current - option)), math.inf, 0
    a = np.asarray(current).reshape(k // steps, steps).mean(axis=0)
    o = np.asarray(option).reshape(k // steps, steps).mean(axis=0)
    se = math.sqrt((a.var(ddof=1) + o.var(ddof=1)) / steps)
    return float(a.mean() - o.mean()), se, steps - 1


def _with_replacement(rows: int, blocks: tuple[int, ...] | None, k: int, width: int,
                      rng: np.random.Generator) -> np.ndarray:
    """Pool k's groups drawn from step k mod H with replacement (the draw before issue 40)."""
    if not blocks or sum(blocks) != rows or min(blocks) <= 0:
        return rng.integers(0, rows, size=(k, width))
    h = len(blocks)
    k = -(-k // h) * h
    start = np.concatenate(([0], np.cumsum(blocks)[:-1]))
    step = np.arange(k) % h
    size = np.asarray(blocks)[step]
    return start[step][:, None] + np.floor(rng.random((k, width)) * size[:, None]).astype(np.int64)


def _no_return_cost(self: rule.TailSieveController, state: ControlState, pred: object,
                    option: tuple[int, int, str]) -> float:
    """A move costs its restarts only: a return to the uniform boundary is free."""
    return self.move_cost(state) if option[1] != state.m else 0.0


def _q_search(self: Controller, state: ControlState, pred: predictor.Predictor, m: int,
              around: int | None = None) -> tuple[int, float]:
    """q searched over the grid at the pinned redraw limit too (before issue 40: argmin of the mean T̂)."""
    qs = self.q_grid(around)
    pred.prefetch(qs, m)
    best = min((float(np.mean(self.times(state, pred, q, m))), q) for q in qs)
    return best[1], best[0]


def _apply(patches: list[tuple[object, str, object]]) -> None:
    for owner, name, value in patches:
        setattr(owner, name, value)


def _uncalibrated_learn() -> Callable[..., tuple[ControlState, object]]:
    """`Controller.learn` with the model errors forgotten after every step (every factor back to 1)."""
    learn = Controller.learn

    def patched(self: Controller, state: ControlState, obs: object) -> tuple[ControlState, object]:
        new, pred = learn(self, state, obs)  # type: ignore[arg-type]
        return replace(new, calib_tail=math.nan, calib_bulk=math.nan, calib_uniform=math.nan), pred

    return patched


ABLATIONS: dict[str, tuple[str, Callable[[], None]]] = {
    "unpaired": ("options priced with independent errors (no common random numbers in the error)",
                 lambda: _apply([(paired_rule, "paired_gain", _unpaired)])),
    "free-return": ("a return to the uniform boundary costs nothing (no waiting-candidate step)",
                    lambda: _apply([(rule.TailSieveController, "cost", _no_return_cost)])),
    "one-placement": ("the uniform boundary always deals requests (no choice of whole groups)",
                      lambda: _apply([(rule.TailSieveController, "placements", lambda self: ("request",))])),
    "no-calibration": ("no model error: every forecast class at factor 1",
                       lambda: _apply([(Controller, "learn", _uncalibrated_learn())])),
    "with-replacement": ("pools drawn from their step with replacement",
                         lambda: _apply([(predictor, "draw_rows", _with_replacement)])),
    "q-search": ("q searched over 1..E at every split instead of q = E at the pinned redraw limit",
                 lambda: _apply([(Controller, "best_q", _q_search)])),
    "no-kv-term": ("the KV-pressure floor off although the model file holds the KV capacity (issue 48)",
                   lambda: _apply([(predictor.Predictor, "_kv", lambda self, times, *a, **k: times)])),
    "no-feasibility": ("C.2's feasibility not asked for moves between splits",
                       lambda: _apply([(Controller, "feasible", lambda self, *a: True)])),
}


def apply(name: str) -> None:
    """Patch mechanism `name` out of `tailsieve` in this process (KeyError: unknown)."""
    ABLATIONS[name][1]()
