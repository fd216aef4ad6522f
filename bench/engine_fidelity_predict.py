"""The predicted half of `bench_engine_fidelity.py`: every real step's plan run again in the simulator on the model
`tailsieve profile` wrote from the same servers.

- all-admit: `SimExecutor` with the fitted τ(b), context (KV-traffic) and prefill terms, every request admitted at
  t = 0 (the paper's §2.1 replica, today's `simulate --curve model.json`), all replicas at one speed: the mean of the
  step's speed factors (today's model knows one speed scalar);
- KV-aware: the same plus what profile read from the servers (kv_tokens, block_size, max_num_batched_tokens,
  prefix_caching): the paged replica of `model.paged` (`simulation.predict.replica_model`), each replica at
  its own speed factor for the step.
A step's speed factors come from `profile`'s speed probe run on each replica right before and right after the step
(the mean of the two probe times, against the profiled replica's probe at profile time): the machine's speed around
the step, which CPU contention moves by tens of percent within minutes, read by the same probe as the profile and
never from the step's own timing.
Both are also computed with the profile's speeds alone (all-admit: 1; KV-aware: the profile's `speed_factors`).
A fresh executor per policy replays the plans in order, so its per-prompt generation counters (common draws) follow
the real rollout's: the lengths it draws for each consumed group are checked against what the servers returned.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from engine_fidelity_run import StepObs
from tailsieve.engines.measure.engine_readout import speeds_from_probe
from tailsieve.engines.rollout.api import RolloutConfig
from tailsieve.model.costmodel import CostModel
from tailsieve.model.engine import FleetSpeed
from tailsieve.simulation.executor import SimExecutor
from tailsieve.simulation.predict import replica_model
from tailsieve.workloads import Workload


@dataclass(frozen=True, slots=True)
class Prediction:
    """Both predictions of one real step, with the speeds read right before it and with the profile's alone."""

    all_admit_s: float  # one speed scalar for the fleet: the mean of the step's speed factors
    kv_aware_s: float  # per-replica speed factors of the step (the probes before and after it, averaged)
    all_admit_profile_s: float  # no speed read after the profile (speed 1)
    kv_aware_profile_s: float  # the profile's speed factors
    preemptions: int
    prefix_hit_tokens: int
    recomputed_tokens: int
    speeds: tuple[float, ...]
    lengths_match: bool


def _consumed_match(ex: SimExecutor, o: StepObs) -> bool:
    """Whether the executor's draws equal the lengths the servers returned for the step's consumed groups."""
    plan = o.plan
    order = [ref.uid for ref in (*plan.tail, *plan.bulk)]
    drawn = {u: tuple(int(x) for x in ex.last_lengths[i]) for i, u in enumerate(order)}
    return all(drawn.get(uid) == tuple(lens) for uid, lens in o.consumed)


def predict_steps(obs: Sequence[StepObs], works: Mapping[str, Workload], belief: CostModel,
                  configs: Mapping[str, RolloutConfig], reference_ms: float) -> dict[tuple[str, int], Prediction]:
    """(policy, step) → the predictions of that real step's plan; `reference_ms`: the profiled replica's speed probe
    at profile time (`engine_readout.replicas[0].probe_tpot_ms`), against which each step's probe gives its speeds."""
    out: dict[tuple[str, int], Prediction] = {}
    replicas = len(obs[0].preemptions) if obs else 1
    flat_cfg, paged_cfg = replica_model(belief, all_admit=True), replica_model(belief)
    profiled = FleetSpeed(belief.engine.speed.factors)
    for name in dict.fromkeys(o.policy for o in obs):
        router = configs[name].router(replicas)
        work, curve = works[name], belief.curve
        runs = {k: SimExecutor(work, curve, router, cfg) for k, cfg in
                (("flat", flat_cfg), ("paged", paged_cfg), ("flat0", flat_cfg), ("paged0", paged_cfg))}
        runs["paged0"].speed = profiled
        for o in (x for x in obs if x.policy == name):
            around = [(a + b) / 2 for a, b in zip(o.probe_tpot_ms, o.probe_after_ms, strict=True)]
            speeds = speeds_from_probe(reference_ms, around)
            runs["flat"].speed = FleetSpeed((sum(speeds) / len(speeds),) * len(speeds))
            runs["paged"].speed = FleetSpeed(speeds)
            res = {k: ex.execute(o.plan) for k, ex in runs.items()}
            ok = all(_consumed_match(ex, o) for ex in runs.values())
            k = res["paged"]
            out[(name, o.step)] = Prediction(res["flat"].makespan_s, k.makespan_s, res["flat0"].makespan_s,
                                             res["paged0"].makespan_s, k.preemptions, k.prefix_hit_tokens,
                                             k.recomputed_tokens, speeds, ok)
    return out
