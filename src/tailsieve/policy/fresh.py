"""The controller's sample of fresh group work (§3.2 response-work history, App. E), from what a step drew.

The predictor draws the next step's fresh groups from the history. A consumed batch is not a sample of fresh draws:
its q tail groups are regenerated candidates and the E groups cut at the cutoff, the longest fresh ones, are
missing. Where a prompt's length is mostly the prompt's (App. B), a regenerated candidate stands in for its cut
draw and the batch is unbiased (App. E). Where it is not, it is biased short: with a 1% cap hit at random
(`rare-cap`) the cut groups are the ones that hit the cap and their regenerations rarely do, so a history of
consumed batches forecast a uniform step at 73 s against the 150 s it took, and the controller returned to uniform
every dozen steps (issue 22). The sample here is the step's fresh groups instead (never cut before), the cut ones
included. A cut group's finished members are its shortest (all its members started at t = 0); an unfinished one
cut at p tokens would have run longer, so its length is drawn from the step's and the history's member lengths of
at least p (censored resampling; p itself when none is that long). Seeded by the step number: the
controller stays a pure function of its inputs. Measured against the simulator's true lengths of the cut groups
(static (7, 3), 20 steps, mean longest member of 140 cut groups, true / imputed / censored at p): rare-cap
12553 / 11365 / 6375; kodcode-r1 9883 / 11102 / 7547; kodcode-tests 1050 / 1366 / 846; synthetic-math
14075 / 15303 / 9259. Where the prompt sets the length the population's tail over-states a cut group's (it
mixes in other prompts' long members), so the uniform forecast leans pessimistic there (kodcode-tests).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from tailsieve.policy.control_state import StepWork

_SEED = 20261201


def fresh_sample(work: StepWork, history: tuple[NDArray[np.int64], ...], step: int) -> NDArray[np.int64] | None:
    """(F, G) lengths of the step's fresh groups, cut members completed by censored resampling (None when the step
    drew no fresh group, e.g. a uniform step that ran only returning candidates)."""
    fresh = work.fresh if work.fresh is not None else np.ones(work.kept.shape, dtype=bool)
    fresh = fresh.copy()
    fresh[: work.tail] = False  # the tail pool runs candidates only
    if not fresh.any():
        return None
    groups = work.lengths[fresh].astype(np.int64)
    cut = ~work.kept[fresh]
    if not cut.any():
        return groups
    done = work.lengths[work.kept].ravel()
    pool = np.sort(np.concatenate([done, *(h.ravel() for h in history)]).astype(np.int64))
    rng = np.random.default_rng((_SEED, step))
    out = groups.copy()
    rows = np.flatnonzero(cut)
    g = out.shape[1]
    done_n = (np.zeros(rows.size, np.int64) if work.finished is None
              else np.minimum(work.finished[fresh][rows], g))
    # members of a cut group all started at t = 0, so the ones that finished are its shortest: the rest are censored
    rank = np.argsort(np.argsort(out[rows], axis=1, kind="stable"), axis=1, kind="stable")
    censored = rank >= done_n[:, None]
    p = out[rows][censored]
    lo = np.searchsorted(pool, p, side="left")  # pool[lo:] >= p
    n_ge = pool.size - lo
    pick = lo + np.floor(rng.random(p.size) * np.maximum(n_ge, 1)).astype(np.int64)
    block = out[rows]
    block[censored] = np.where(n_ge > 0, pool[np.minimum(pick, pool.size - 1)], p)
    out[rows] = block
    return out
