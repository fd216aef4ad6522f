"""Shared helpers of the controller tests (test_controller.py, test_tailsieve_rule.py, test_paper.py): a curve, small
deterministic histories and observations, and a controller by name on a small fleet."""

from __future__ import annotations

import numpy as np

from conftest import make_curve
from tailsieve.policy.controller import CONTROLLERS, StepObservation
from tailsieve.policy.controller_knobs import controller_from_mapping
from tailsieve.policy.router import DEFAULT_REDRAWS, RouterConfig

CURVE = make_curve()


def history(*, n: int = 16, g: int = 4, seed: int = 0, tail: float = 8.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    base = rng.lognormal(6.0, 0.4, size=(n, 1)) * rng.lognormal(0, 0.2, size=(n, g))
    base[: max(1, n // 8)] *= tail  # a few long-tail groups
    return base.astype(np.int64)


def obs(*, q: int, m: int, tail_s: float, bulk_s: float, warmup: bool = False, n: int = 16, seed: int = 0
        ) -> StepObservation:
    return StepObservation(step=1, q=q, m=m, warmup=warmup, tail_s=tail_s, bulk_s=bulk_s,
                           consumed_lengths=history(n=n, seed=seed))


def make(name: str, *, n: int = 16, r: int = 8, rho: float = 0.25,  # type: ignore[no-untyped-def]
         max_redraws: int = DEFAULT_REDRAWS, **cfg: object):
    """A controller by name on a small fleet, its knobs `cfg`; the router's redraw limit `max_redraws`: at the
    default (1) the candidates not isolated run pinned and every split isolates q = E (`Controller.best_q`); from 2
    on q is the best of `q_grid`."""
    rc = RouterConfig(groups=n, group_size=4, replicas=r, rho=rho, max_redraws=max_redraws)
    return CONTROLLERS[name](rc, CURVE, controller_from_mapping(cfg, "make"))  # type: ignore[arg-type]
