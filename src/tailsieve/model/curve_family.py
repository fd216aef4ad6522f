"""The throughput curves of the generated regime family (`family:SEED`, issue 40; docs/workloads.md).

A family curve is a parametric τ(b) between a flat dense curve and a steep MoE knee:

    τ(b) = τ(1) · (1 + knee · (1 − exp(−(b − 1) / knee_batch)) + slope · (b − 1) / 64)

at b = 1, 2, 4, …, 512 (past 512 it extends linearly, as every curve does). `knee` = 0 is a dense model whose
per-token time grows only linearly with the batch (h100-llama2-70b-tp8 ≈ slope 0.6, h100-llama3-8b ≈ knee 0.2,
slope 1.1); `knee` ≈ 1.5 with `knee_batch` ≈ 4 rises as a100x4-mixtral-8x7b does (2.3× τ(1) at b = 16, as more
experts are read). A regime's curve is the first four draws of the family's stream
`numpy.random.default_rng([FAMILY_TAG, seed])`, so `load_curve("family:SEED")` (here, in the cost model) and
`tailsieve.workloads.family.family_regime(SEED).curve` (which continues the same stream) are the same curve.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tailsieve.errors import ConfigError, TailSieveError
from tailsieve.inputs import excerpt
from tailsieve.model.curves import TpotCurve

__all__ = ["CURVE_BATCHES", "FAMILY_PREFIX", "FAMILY_SEED_LIMIT", "FAMILY_TAG", "KneeShape", "draw_knee_shape",
           "family_curve", "family_rng", "knee_curve", "parse_family_seed"]

FAMILY_TAG = 40  # the family's stream: default_rng([FAMILY_TAG, seed]) (issue 40)
FAMILY_PREFIX = "family:"
FAMILY_SEED_LIMIT = 2**32  # seeds 0 .. 2**32 - 1
CURVE_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)

# ranges of the curve draws (docs/workloads.md, "Generated regime family")
TPOT1_MS = (5.0, 35.0)  # τ(1), log-uniform
KNEE_MAX = 1.6  # knee = KNEE_MAX · k, k ~ U(0, 1) (the steepness)
KNEE_BATCH = (2.0, 8.0)  # log-uniform
SLOPE = (0.25, 1.5)  # per 64 requests, U(...) · (1 − k/2): steep knees flatten afterwards


@dataclass(frozen=True, slots=True)
class KneeShape:
    """The four parameters of a family curve (see the module docstring)."""

    tpot1_ms: float  # τ(1), ms per token
    knee: float  # height of the knee in units of τ(1) (0: flat dense)
    knee_batch: float  # requests over which the knee rises (1 − 1/e of it by b = 1 + knee_batch)
    slope: float  # linear rise per 64 requests, in units of τ(1)


def knee_curve(name: str, shape: KneeShape) -> TpotCurve:
    """The curve of `shape` at `CURVE_BATCHES`."""
    b = np.asarray(CURVE_BATCHES, dtype=np.float64)
    rel = 1.0 + shape.knee * (1.0 - np.exp(-(b - 1.0) / shape.knee_batch)) + shape.slope * (b - 1.0) / 64.0
    desc = (f"generated family curve: tau(1) {shape.tpot1_ms:.2f} ms, knee {shape.knee:.2f} over "
            f"{shape.knee_batch:.1f} requests, slope {shape.slope:.2f} per 64")
    return TpotCurve(name=name, batch=CURVE_BATCHES, tpot_ms=tuple(float(v) for v in shape.tpot1_ms * rel),
                     description=desc, source="tailsieve.model.curve_family (parametric, no measurement)",
                     extension="linear past 512 along the last two points")


def _log_uniform(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def draw_knee_shape(rng: np.random.Generator) -> KneeShape:
    """Exactly four draws from `rng`: τ(1), the steepness k, the knee's batch scale, the slope."""
    tpot1 = _log_uniform(rng, *TPOT1_MS)
    k = float(rng.uniform(0.0, 1.0))
    knee_batch = _log_uniform(rng, *KNEE_BATCH)
    slope = float(rng.uniform(*SLOPE)) * (1.0 - 0.5 * k)
    return KneeShape(tpot1, KNEE_MAX * k, knee_batch, slope)


def parse_family_seed(spec: str, what: str, error: type[TailSieveError]) -> int:
    """The SEED of 'family:SEED' (decimal, 0 <= SEED < 2**32); a one-line `error` naming `what` otherwise."""
    text = spec[len(FAMILY_PREFIX):] if spec.startswith(FAMILY_PREFIX) else spec
    if len(text) > 10 or not (text.isascii() and text.isdigit()) or int(text) >= FAMILY_SEED_LIMIT:
        raise error(f"{what} {excerpt(spec, 40)}: the generated family is addressed as family:SEED with SEED an "
                    f"integer in 0..{FAMILY_SEED_LIMIT - 1} (e.g. family:3), got {excerpt(text, 40)}")
    return int(text)


def family_rng(seed: int) -> np.random.Generator:
    """The family's random stream for `seed` (its first four draws are the curve's)."""
    if not 0 <= seed < FAMILY_SEED_LIMIT:
        raise ConfigError(f"family seed must lie in 0..{FAMILY_SEED_LIMIT - 1}, got {seed}")
    return np.random.default_rng([FAMILY_TAG, seed])


def family_curve(seed: int) -> TpotCurve:
    """The curve of regime `seed` of the family (named 'family:SEED'), unscaled: the curve its policies see."""
    return knee_curve(f"{FAMILY_PREFIX}{seed}", draw_knee_shape(family_rng(seed)))
