"""One step's prediction for a given set of requests and their replicas: the paged (KV-aware) engine of a model
file, or the all-admit engine of §2.1 (`bench/bench_engine_fidelity.py` prints both beside a real step)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from tailsieve.errors import ConfigError
from tailsieve.model.costmodel import CostModel
from tailsieve.model.engine import FleetSpeed
from tailsieve.simulation.replica import ReplicaConfig, run_replica


@dataclass(frozen=True, slots=True)
class StepPrediction:
    """A predicted step: the makespan (the slowest replica), every replica's time, every request's finish time
    (input order), and the engine counts (0 on the all-admit engine)."""

    makespan_s: float
    replica_s: tuple[float, ...]
    finish_s: NDArray[np.float64]
    preemptions: int
    recomputed_tokens: int
    prefix_hit_tokens: int


def replica_model(model: CostModel, *, all_admit: bool = False, max_num_seqs: int | None = None) -> ReplicaConfig:
    """The replica of a model file: its KV and prefill terms, and (unless `all_admit`) its engine keys."""
    base = ReplicaConfig(max_num_seqs=max_num_seqs, kv_ms_per_1k_tokens=model.kv_ms_per_1k,
                         prefill_ms_per_token=model.prefill_ms_per_token)
    if all_admit:
        return base
    e = model.engine
    return ReplicaConfig(max_num_seqs=max_num_seqs, kv_ms_per_1k_tokens=model.kv_ms_per_1k,
                         prefill_ms_per_token=model.prefill_ms_per_token, kv_tokens=e.kv_tokens,
                         block_size=e.block_size, max_num_batched_tokens=e.max_num_batched_tokens,
                         prefix_caching=e.prefix_caching)


def predict_step(lengths: ArrayLike, replica_of: ArrayLike, model: CostModel, *,
                 prompt_tokens: ArrayLike | None = None, group_of: ArrayLike | None = None,
                 all_admit: bool = False, max_num_seqs: int | None = None) -> StepPrediction:
    """Predict a step in which request i (decode length `lengths[i]`, `prompt_tokens[i]` prompt tokens, prompt
    group `group_of[i]`) runs on replica `replica_of[i]`, the requests of a replica submitted in input order at
    t = 0. `all_admit`: the §2.1 engine with the model's KV and prefill terms (a group's prompt prefilled once per
    replica); otherwise the model file's engine (KV capacity, chunked prefill, prefix caching, replica speeds;
    drift is a between-step effect and is left out)."""
    lens = np.asarray(lengths, np.int64).ravel()
    reps = np.asarray(replica_of, np.int64).ravel()
    if reps.shape != lens.shape:
        raise ConfigError(f"replica_of has {reps.size} entries for {lens.size} requests")
    if lens.size and (reps.min() < 0 or lens.min() < 0):
        raise ConfigError("lengths and replica indices must be >= 0")
    prompts = np.zeros_like(lens) if prompt_tokens is None else np.asarray(prompt_tokens, np.int64).ravel()
    groups = np.arange(lens.size) if group_of is None else np.asarray(group_of, np.int64).ravel()
    if prompts.shape != lens.shape or groups.shape != lens.shape:
        raise ConfigError("prompt_tokens and group_of need one entry per request")
    cfg = replica_model(model, all_admit=all_admit, max_num_seqs=max_num_seqs)
    n_rep = int(reps.max()) + 1 if lens.size else 0
    speeds = np.ones(n_rep)
    if not all_admit and n_rep:
        sp = model.engine.speed
        speeds = FleetSpeed(sp.factors, sp.spread).speeds(n_rep, 0, 0)
    # the all-admit replica shares a group's prompt on a replica perfectly (the first request pays its prefill)
    ptok = prompts if cfg.paged else _shared(prompts, groups, reps)
    finish = np.zeros(lens.size)
    spans: list[float] = []
    counts = np.zeros(3, np.int64)
    for r in range(n_rep):
        idx = np.flatnonzero(reps == r)
        if idx.size == 0:
            spans.append(0.0)
            continue
        run = run_replica(lens[idx], model.curve, cfg, ptok[idx], prefix_keys=groups[idx])
        f = 1.0 / float(speeds[r])
        finish[idx] = run.finish_s * f
        spans.append(run.makespan * f)
        counts += run.counts()
    return StepPrediction(max(spans, default=0.0), tuple(spans), finish, int(counts[0]), int(counts[1]),
                          int(counts[2]))


def _shared(prompts: NDArray[np.int64], groups: NDArray[np.int64], reps: NDArray[np.int64]) -> NDArray[np.int64]:
    """Prompt tokens each request prefills when a replica shares its group's prompt (the first request pays)."""
    key = groups * (int(reps.max(initial=0)) + 1) + reps
    _, first = np.unique(key, return_index=True)
    out = np.zeros_like(prompts)
    out[first] = prompts[first]
    return out


__all__ = ["StepPrediction", "predict_step", "replica_model"]
