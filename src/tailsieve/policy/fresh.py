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
    rec = fresh_record(work)
    if rec is None:
        return None
    return complete(rec, (work.lengths[work.kept].ravel(), *(h.ravel() for h in history)), step)


def fresh_record(work: StepWork) -> NDArray[np.int64] | None:
    """(F, 3 + G) the step's fresh groups as they ran: uid (−1 unknown), consumed (0/1), finished members, then the
    G lengths (a cut request's at the cutoff). What `complete` fills in, now or once the regenerations are seen."""
    fresh = _fresh_mask(work)
    fresh[: work.tail] = False  # the tail pool runs candidates only
    if not fresh.any():
        return None
    g = work.lengths.shape[1]
    uids = work.uids[fresh] if work.uids is not None else np.full(int(fresh.sum()), -1, np.int64)
    kept = work.kept[fresh]
    done = np.zeros(kept.shape, np.int64) if work.finished is None else np.minimum(work.finished[fresh], g)
    done = np.where(kept, g, done)
    return np.column_stack((uids, kept, done, work.lengths[fresh])).astype(np.int64)


def _fresh_mask(work: StepWork) -> NDArray[np.bool_]:
    """(P,) groups drawn from the stream this step (a copy; every group where the record does not say)."""
    return np.ones(work.kept.shape, dtype=bool) if work.fresh is None else work.fresh.copy()


def complete(rec: NDArray[np.int64], population: tuple[NDArray[np.int64], ...], step: int) -> NDArray[np.int64]:
    """(F, G) lengths of a `fresh_record`, each cut member (censored at its progress p) drawn from the member lengths
    in `population` of at least p (p itself when none is that long). Seeded by the step number: the controller stays
    a pure function of its inputs."""
    out = rec[:, 3:].copy()
    rows = np.flatnonzero(rec[:, 1] == 0)
    if rows.size == 0:
        return out
    pool = np.sort(np.concatenate([np.asarray(a, np.int64).ravel() for a in population]))
    rng = np.random.default_rng((_SEED, step))
    # members of a cut group all started at t = 0, so the ones that finished are its shortest: the rest are censored
    block = out[rows]
    rank = np.argsort(np.argsort(block, axis=1, kind="stable"), axis=1, kind="stable")
    censored = rank >= rec[rows, 2][:, None]
    draw = rng.random(block.shape)
    j, k = np.nonzero(censored)
    p = block[j, k]
    block[j, k] = _at_least(pool, p, draw[j, k], p)
    out[rows] = block
    return out


def _at_least(source: NDArray[np.int64], p: NDArray[np.int64], u: NDArray[np.float64],
              fallback: NDArray[np.int64]) -> NDArray[np.int64]:
    """Per element: a length of at least p drawn from the sorted `source` (u: its uniform draw), else `fallback`."""
    lo = np.searchsorted(source, p, side="left")
    span = source.size - lo
    ok = span > 0
    pick = lo + np.minimum(np.floor(u * span).astype(np.int64), span - 1)
    out: NDArray[np.int64] = np.where(ok, source[np.where(ok, pick, 0)] if source.size else fallback, fallback)
    return out
