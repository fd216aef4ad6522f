"""The predicted half of `bench_engine_fidelity.py`: every real step's plan run again in the simulator on the model
`tailsieve profile` wrote from the same servers.

- all-admit: `SimExecutor` with the fitted τ(b), context (KV-traffic) and prefill terms, every request admitted at
  t = 0 (the paper's §2.1 replica, today's `simulate --curve model.json`);
- KV-aware: the same plus what profile read from the servers (kv_tokens, block_size, max_num_batched_tokens,
  prefix_caching, speed_factors).
A fresh executor per policy replays the plans in order, so its per-prompt generation counters (common draws) follow
the real rollout's: the lengths it draws for each consumed group are checked against what the servers returned.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from engine_fidelity_run import StepObs
from tailsieve.engines.rollout.api import RolloutConfig
from tailsieve.model.costmodel import CostModel
from tailsieve.simulation.executor import SimExecutor
from tailsieve.simulation.replica import ReplicaConfig
from tailsieve.workloads import Workload


@dataclass(frozen=True, slots=True)
class Prediction:
    """Both predictions of one real step."""

    all_admit_s: float
    kv_aware_s: float | None
    preemptions: float | None
    prefix_hit_tokens: float | None
    recomputed_tokens: float | None
    lengths_match: bool


def all_admit_replica(belief: CostModel) -> ReplicaConfig:
    """The profiled terms on the all-admit replica."""
    return ReplicaConfig(kv_ms_per_1k_tokens=belief.kv_ms_per_1k, prefill_ms_per_token=belief.prefill_ms_per_token)


def _consumed_match(ex: SimExecutor, o: StepObs) -> bool:
    """Whether the executor's draws equal the lengths the servers returned for the step's consumed groups."""
    plan = o.plan
    order = [ref.uid for ref in (*plan.tail, *plan.bulk)]
    drawn = {u: tuple(int(x) for x in ex.last_lengths[i]) for i, u in enumerate(order)}
    return all(drawn.get(uid) == tuple(lens) for uid, lens in o.consumed)


def predict_steps(obs: Sequence[StepObs], works: Mapping[str, Workload], belief: CostModel, doc: Mapping[str, Any],
                  configs: Mapping[str, RolloutConfig]) -> dict[tuple[str, int], Prediction]:
    """(policy, step) → the all-admit and KV-aware predictions of that real step's plan."""
    out: dict[tuple[str, int], Prediction] = {}
    replicas = len(obs[0].preemptions) if obs else 1
    for name in dict.fromkeys(o.policy for o in obs):
        router = configs[name].router(replicas)
        flat = SimExecutor(works[name], belief.curve, router, all_admit_replica(belief))
        for o in (x for x in obs if x.policy == name):
            res = flat.execute(o.plan)
            ok = _consumed_match(flat, o)
            out[(name, o.step)] = Prediction(res.makespan_s, None, None, None, None, ok)
    return out
