"""What the engine half's controller is told of a regime's truth (`bench_family.py --belief`; bench/README.md, "The
engine half: truth ≠ belief")."""

from __future__ import annotations

from tailsieve.simulation.replica import ReplicaConfig
from tailsieve.workloads.engine_family import EngineRegime

BELIEFS = ("curve", "servers", "profile")  # what the engine half's controller is told of the truth (`belief_replica`)


def belief_replica(belief: str, eng: EngineRegime) -> ReplicaConfig:
    """What the controller's model file holds of the regime's truth (`--belief`): `curve`, nothing but the family curve;
    `servers`, also what a server reports of itself (KV capacity, block size), no cost term; `profile`, also what
    `tailsieve profile` measures (the KV and prefill terms)."""
    tm, e = eng.truth, eng.truth.engine
    if belief == "curve":
        return ReplicaConfig()
    if belief == "servers":
        return ReplicaConfig(kv_tokens=e.kv_tokens, block_size=e.block_size)
    if belief == "profile":
        return ReplicaConfig(kv_ms_per_1k_tokens=tm.kv_ms_per_1k, prefill_ms_per_token=tm.prefill_ms_per_token,
                             kv_tokens=e.kv_tokens, block_size=e.block_size)
    raise ValueError(f"belief must be one of {BELIEFS}, got {belief!r}")
