"""The engine limits a model file may carry beside τ(b) and the KV / prefill terms (docs/simulator.md).

`EngineTruth` holds what the paged replica (`model.paged`) simulates: KV capacity in tokens and its block
size, chunked prefill's token budget, prefix caching, and the fleet's per-replica speeds (`FleetSpeed`). The keys
live in the model file's `cost_model` object (`kv_tokens`, `block_size`, `max_num_batched_tokens`,
`prefix_caching`, `speed_factors` or `speed_spread`, `speed_drift`), written by `tailsieve profile` from what the
servers report and read by `simulate --truth` (the engine the simulation runs) and by the controller (what it
believes). Every key is optional; absent keys mean the all-admit engine of §2.1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from tailsieve.errors import CurveError
from tailsieve.inputs import excerpt

MAX_KV_TOKENS = 10**10
MAX_BLOCK = 1024
MAX_SPREAD = 0.9
MAX_DRIFT = 1.0
ENGINE_KEYS = ("kv_tokens", "block_size", "max_num_batched_tokens", "prefix_caching", "speed_factors",
               "speed_spread", "speed_drift")


@dataclass(frozen=True, slots=True)
class FleetSpeed:
    """Per-replica decode speed relative to the curve (1 = the curve, 0.9 = every time ÷ 0.9), and its drift.

    `factors` are measured speeds, cycled over the replicas; `spread` F spaces the replicas' speeds evenly over
    [1 − F, 1] in a seeded order instead; `drift` σ multiplies each replica's speed every step by exp(σ·z), z a
    standard normal drawn from (seed, step): the same draw for every policy of a run (common random numbers)."""

    factors: tuple[float, ...] = ()
    spread: float = 0.0
    drift: float = 0.0

    def __post_init__(self) -> None:
        for f in self.factors:
            if isinstance(f, bool) or not isinstance(f, int | float) or not (0.01 <= f <= 100):
                raise CurveError(f"speed_factors must be numbers in [0.01, 100], got {excerpt(f)}")
        if not (math.isfinite(self.spread) and 0 <= self.spread <= MAX_SPREAD):
            raise CurveError(f"speed_spread must be in [0, {MAX_SPREAD}], got {self.spread}")
        if not (math.isfinite(self.drift) and 0 <= self.drift <= MAX_DRIFT):
            raise CurveError(f"speed_drift must be in [0, {MAX_DRIFT}], got {self.drift}")
        if self.factors and self.spread:
            raise CurveError("give speed_factors or speed_spread, not both")

    @property
    def uniform(self) -> bool:
        """True when every replica runs at the curve's speed at every step."""
        return not self.factors and self.spread == 0 and self.drift == 0

    def speeds(self, replicas: int, seed: int, step: int) -> NDArray[np.float64]:
        """Each replica's speed at `step` (1 = the curve)."""
        if self.factors:
            base = np.resize(np.asarray(self.factors, np.float64), replicas)
        elif self.spread:
            ladder = 1.0 - self.spread * np.linspace(0.0, 1.0, replicas) if replicas > 1 else np.ones(1)
            base = np.random.default_rng([seed, 0x5BEED]).permutation(ladder)
        else:
            base = np.ones(replicas)
        if self.drift:
            z = np.random.default_rng([seed, step, 0xD21F7]).standard_normal(replicas)
            base = base * np.exp(self.drift * z)
        out: NDArray[np.float64] = base
        return out


@dataclass(frozen=True, slots=True)
class EngineTruth:
    """The paged engine's limits and the fleet's speeds (all off by default: the all-admit engine)."""

    kv_tokens: int | None = None
    block_size: int = 16
    max_num_batched_tokens: int | None = None
    prefix_caching: bool = False
    speed: FleetSpeed = field(default_factory=FleetSpeed)

    def __post_init__(self) -> None:
        if not (isinstance(self.block_size, int) and 1 <= self.block_size <= MAX_BLOCK):
            raise CurveError(f"block_size must be an integer in [1, {MAX_BLOCK}], got {excerpt(self.block_size)}")
        if self.kv_tokens is not None and not (self.block_size <= self.kv_tokens <= MAX_KV_TOKENS):
            raise CurveError(f"kv_tokens must be in [block_size, {MAX_KV_TOKENS:g}], got {self.kv_tokens}")
        if self.max_num_batched_tokens is not None and not 1 <= self.max_num_batched_tokens <= MAX_KV_TOKENS:
            raise CurveError(f"max_num_batched_tokens must be a positive integer, got {self.max_num_batched_tokens}")

    def to_json(self) -> dict[str, Any]:
        """The keys of the `cost_model` object (only those set)."""
        out: dict[str, Any] = {}
        if self.kv_tokens is not None:
            out["kv_tokens"] = self.kv_tokens
            out["block_size"] = self.block_size
        if self.max_num_batched_tokens is not None:
            out["max_num_batched_tokens"] = self.max_num_batched_tokens
        if self.prefix_caching:
            out["prefix_caching"] = True
        if self.speed.factors:
            out["speed_factors"] = list(self.speed.factors)
        if self.speed.spread:
            out["speed_spread"] = self.speed.spread
        if self.speed.drift:
            out["speed_drift"] = self.speed.drift
        return out


def _int(obj: dict[str, Any], key: str, where: str, lo: int, hi: int) -> int | None:
    v = obj.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise CurveError(f"{where}: cost_model.{key} must be an integer in [{lo}, {hi:g}], got {excerpt(v)}")
    return v


def _num(obj: dict[str, Any], key: str, where: str, hi: float) -> float:
    v = obj.get(key, 0.0)
    if isinstance(v, bool) or not isinstance(v, int | float) or not (math.isfinite(v) and 0 <= v <= hi):
        raise CurveError(f"{where}: cost_model.{key} must be a number in [0, {hi:g}], got {excerpt(v)}")
    return float(v)


def engine_from_json(terms: dict[str, Any], where: str) -> EngineTruth:
    """The engine keys of a `cost_model` object, validated (one-line errors naming `where` and the key)."""
    block = _int(terms, "block_size", where, 1, MAX_BLOCK)
    kv = _int(terms, "kv_tokens", where, block or 16, MAX_KV_TOKENS)
    mbt = _int(terms, "max_num_batched_tokens", where, 1, MAX_KV_TOKENS)
    pc = terms.get("prefix_caching", False)
    if not isinstance(pc, bool):
        raise CurveError(f"{where}: cost_model.prefix_caching must be true or false, got {excerpt(pc)}")
    raw = terms.get("speed_factors", [])
    if not isinstance(raw, list) or len(raw) > 100_000 or any(
            isinstance(f, bool) or not isinstance(f, int | float) or not (math.isfinite(f) and 0.01 <= f <= 100)
            for f in raw):
        raise CurveError(f"{where}: cost_model.speed_factors must be a list of numbers in [0.01, 100], "
                         f"got {excerpt(raw)}")
    spread = _num(terms, "speed_spread", where, MAX_SPREAD)
    if raw and spread:
        raise CurveError(f"{where}: cost_model has both speed_factors and speed_spread; give one")
    speed = FleetSpeed(tuple(float(f) for f in raw), spread, _num(terms, "speed_drift", where, MAX_DRIFT))
    return EngineTruth(kv, block or 16, mbt, pc, speed)


__all__ = ["ENGINE_KEYS", "EngineTruth", "FleetSpeed", "engine_from_json"]
