"""Simulated policy runs: `run_policy` / `run_policies` drive the step loop (`tailsieve.loop`) with `SimExecutor`.

The router and controller are the same objects a real-engine run uses; only the executor differs. The known-length
oracles (App. A.2) are applied per step to the batches a `uniform` run consumed: same prompts, same draws, exact
makespans. Per-pool speculative decoding (§3.4, `SimConfig.spec`) gives tail replicas the tail curve and the others
the bulk curve (docs/speculative.md). Details: docs/simulate.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from tailsieve.analysis.weights import BiasWeights, WeightState, observe
from tailsieve.errors import ConfigError
from tailsieve.inputs import check_replicas
from tailsieve.loop import SKIP_STEPS, PeerLoop, PolicyRun, RunLog, StepRecord, build_loop
from tailsieve.model.baselines import GroupBatch, assign_checked, get_policy
from tailsieve.model.curves import TpotCurve
from tailsieve.model.engine import FleetSpeed
from tailsieve.model.speculative import PoolSpec
from tailsieve.policy.controller import CONTROLLERS, ControllerConfig
from tailsieve.policy.peers import PEERS, PeerConfig, make_peer
from tailsieve.policy.router import RouterConfig, pool_split
from tailsieve.policy.spec import FleetCost, PolicySpec, resolve_policy
from tailsieve.simulation.executor import SimExecutor, SimRestarts
from tailsieve.simulation.replica import ReplicaConfig, run_replica
from tailsieve.workloads import Workload

__all__ = ["ORACLES", "PEERS", "SKIP_STEPS", "PolicyRun", "SimConfig", "SimExecutor", "StaticGrid", "StepRecord",
           "check_policy", "policy_names", "policy_spec", "run_policies", "run_policy", "static_grid"]

ORACLES: tuple[str, ...] = ("uniform-oracle", "streamrl-oracle", "seer-oracle", "topq-best")  # App. A.2, known lengths


@dataclass(frozen=True, slots=True)
class SimConfig:
    """One simulated run: step shape, replica options, controller constants, static (q, m), seeds, speculation."""

    router: RouterConfig = field(default_factory=RouterConfig)
    replica: ReplicaConfig = field(default_factory=ReplicaConfig)
    controller: ControllerConfig = field(default_factory=ControllerConfig)
    steps: int = 20
    q: int | None = None
    m: int | None = None
    shuffle: bool = False
    seed: int = 0
    spec: PoolSpec = field(default_factory=PoolSpec)  # per-pool speculative decoding (§3.4); off by default
    restart_s: float = 0.0  # seconds a step pays when m changed (a launcher restarting the moved replicas)
    bias_correction: bool = False  # per-group weights (`analysis.weights`) and the weighted bias keys; opt-in
    peers: PeerConfig = field(default_factory=PeerConfig)  # the peer policies' knobs (docs/peers.md)
    # the simulated replicas decode at τ(b)·engine_scale while every policy's cost model keeps the profiled curve:
    # a fleet slower (> 1) or faster (< 1) than its profile, the model error the controller's calibration learns
    engine_scale: float = 1.0
    # the engine the simulation runs (truth) where it differs from what the policies believe (`replica` is the
    # truth's replica model): its own τ(b) (None: the policy's curve × engine_scale), its replicas' speeds, and
    # the replica terms the controller prices with (None: the truth's; `simulate --truth`, docs/simulator.md)
    truth_curve: TpotCurve | None = None
    speed: FleetSpeed = field(default_factory=FleetSpeed)
    belief: ReplicaConfig | None = None

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ConfigError(f"steps must be >= 1, got {self.steps}")
        if not (self.restart_s >= 0 and math.isfinite(self.restart_s)):
            raise ConfigError(f"restart_s must be >= 0 and finite, got {self.restart_s}")
        if not (self.engine_scale > 0 and math.isfinite(self.engine_scale)):
            raise ConfigError(f"engine_scale must be > 0 and finite, got {self.engine_scale}")

    def fleet_curve(self, curve: TpotCurve) -> TpotCurve:
        """The curve the simulated replicas decode at: the policy's `curve` × `engine_scale`."""
        return curve.scaled(self.engine_scale)

    def engine_curves(self, curve: TpotCurve) -> tuple[TpotCurve, TpotCurve]:
        """(bulk, tail) curves of the simulated replicas: the truth's curve (else the policy's `curve`) through the
        per-pool speculation, × `engine_scale`."""
        tail, bulk = self.spec.curves(curve if self.truth_curve is None else self.truth_curve)
        return bulk.scaled(self.engine_scale), tail.scaled(self.engine_scale)

    @property
    def believed(self) -> ReplicaConfig:
        """The replica model the policies price with (the truth's unless `belief` is set)."""
        return self.replica if self.belief is None else self.belief


OnStep = Callable[[str, int], None]  # (policy, steps done so far) after every simulated step


def policy_names() -> tuple[str, ...]:
    """Every policy `run_policy` knows: uniform, the oracles, the other controllers, then the peers (what RL
    frameworks run today, docs/peers.md) (`simulate --policy all`)."""
    ordered = ("uniform", *ORACLES, "static", "tailsieve-fixed", "tailsieve", "tailsieve-paper")
    return tuple(dict.fromkeys((*ordered, *CONTROLLERS, *PEERS)))


def check_policy(name: str, replicas: int) -> None:
    """The simulator's names beside the loop's policies: an oracle needs its baseline's `min_replicas`; anything else
    resolves as every `--policy` does (`spec.resolve_policy`: a peer, which runs on any R >= 1, or a controller, a
    `PolicySpec`'s policy, `inputs.check_replicas`)."""
    if name in ORACLES:
        check_replicas(name, get_policy(name).min_replicas, replicas)
        return
    if resolve_policy(name, [*policy_names(), "all"]) is CONTROLLERS:
        check_replicas(name, CONTROLLERS[name].min_replicas, replicas)


def policy_spec(name: str, workload: Workload, curve: TpotCurve, config: SimConfig) -> PolicySpec:
    """The `PolicySpec` of a simulated loop policy: the pools' curves (per-pool speculation), the replicas' KV and
    prefill terms, the controller constants, the static (q, m), the prompt order."""
    tail_curve, bulk_curve = config.spec.curves(curve)
    belief = config.believed
    kv_tokens = belief.kv_tokens or 0  # the KV capacity the controller's model file holds (0: not priced)
    prompts = float(np.mean([workload.prompt_tokens(p) or 0 for p in workload.prompts])) if kv_tokens else 0.0
    cost = FleetCost(bulk_curve, tail_curve, belief.kv_ms_per_1k_tokens / 1e6, prompt_prefill_s(workload, belief),
                     kv_tokens=kv_tokens, prompt_tokens=prompts)
    return PolicySpec(name, config.router, cost, config.controller, q=config.q, m=config.m, shuffle=config.shuffle,
                      seed=config.seed)


def run_policy(
    name: str,
    workload: Workload,
    curve: TpotCurve,
    config: SimConfig,
    *,
    reference: PolicyRun | None = None,
    on_step: OnStep | None = None,
) -> PolicyRun:
    """Simulate `config.steps` steps of one policy; an oracle replays `reference` (a `uniform` run, made if None)."""
    check_policy(name, config.router.replicas)
    if name in ORACLES:
        if reference is None or reference.policy != "uniform" or len(reference.steps) != config.steps:
            reference = _run_controller("uniform", workload, curve, config, None)
        return _run_oracle(name, reference, workload, curve, config, on_step)
    if name in PEERS:
        return _run_peer(name, workload, curve, config, on_step)
    return _run_controller(name, workload, curve, config, on_step)


def run_policies(
    names: Sequence[str], workload: Workload, curve: TpotCurve, config: SimConfig, *, on_step: OnStep | None = None
) -> dict[str, PolicyRun]:
    """Several policies on the same prompt stream and draws; `uniform` always runs (first) as the reference."""
    names = list(dict.fromkeys(["uniform", *names]))
    for name in names:  # every check before the first step: a loop policy's whole `PolicySpec`
        check_policy(name, config.router.replicas)
        if name not in PEERS and name not in ORACLES:
            policy_spec(name, workload, curve, config)
    uniform = run_policy("uniform", workload, curve, config, on_step=on_step)
    out = {"uniform": uniform}
    for name in names[1:]:
        out[name] = run_policy(name, workload, curve, config, reference=uniform, on_step=on_step)
    return out


@dataclass(frozen=True, slots=True)
class StaticGrid:
    """Every static (q, m) on one prompt stream: mean step times (after the warm-up window) and the best one."""

    q: int
    m: int
    best: PolicyRun
    mean_s: dict[tuple[int, int], float]


def static_grid(workload: Workload, curve: TpotCurve, config: SimConfig, *, qs: Sequence[int] | None = None,
                ms: Sequence[int] | None = None, on_step: OnStep | None = None) -> StaticGrid:
    """Simulate the static policy at every (q, m) (default q = 1..E, m = 1..R − 1) and keep the fastest (ties: the
    smaller q, then the smaller m): the best static split of `tailsieve plan`."""
    rc = config.router
    qs = list(qs) if qs is not None else list(range(1, max(rc.extra, 1) + 1))
    ms = list(ms) if ms is not None else list(range(1, rc.replicas))
    if not qs or not ms:
        raise ConfigError(f"no static split to search: R={rc.replicas} needs at least 2 replicas")
    means: dict[tuple[int, int], float] = {}
    best: tuple[float, int, int, PolicyRun] | None = None
    for q in qs:
        for m in ms:
            run = run_policy("static", workload, curve, replace(config, q=q, m=m), on_step=on_step)
            mean = run.mean_step_s(SKIP_STEPS)
            means[(q, m)] = mean
            if best is None or mean < best[0]:
                best = (mean, q, m, run)
    assert best is not None
    return StaticGrid(best[1], best[2], best[3], means)


def sim_executor(workload: Workload, bulk: TpotCurve, router: RouterConfig, config: SimConfig,
                 tail: TpotCurve | None = None) -> SimExecutor:
    """The executor of a simulated run: the truth's replicas (`config.replica`, `config.speed`, seeded)."""
    return SimExecutor(workload, bulk, router, config.replica, tail_curve=tail, speed=config.speed, seed=config.seed)


def prompt_prefill_s(workload: Workload, replica: ReplicaConfig) -> float:
    """Seconds one replica spends prefilling one prompt of the workload (the mean recorded prompt length; 0 where
    none is recorded or the replicas have no prefill term): the controller's price of dealing a group over
    several replicas (each prefills it again)."""
    if replica.prefill_ms_per_token <= 0:
        return 0.0
    tokens = [workload.prompt_tokens(p) or 0 for p in workload.prompts]
    return float(np.mean(tokens)) * replica.prefill_ms_per_token / 1e3 if tokens else 0.0


def _run_controller(
    name: str, workload: Workload, curve: TpotCurve, config: SimConfig, on_step: OnStep | None
) -> PolicyRun:
    """The step loop on `SimExecutor`; exactly-once consumption is checked every step and over the run."""
    spec = policy_spec(name, workload, curve, config)
    loop = build_loop(spec, workload.prompts)
    bulk, tail = config.engine_curves(curve)
    executor = sim_executor(workload, bulk, spec.router, config, tail)
    restarts = SimRestarts(config.restart_s)
    log = RunLog(name)
    state = loop.initial()
    weigher = BiasWeights() if config.bias_correction else None
    wstate = WeightState()
    for i in range(config.steps):
        out = loop.step(state, executor, restarts)
        state = out.state
        weights = None
        if weigher is not None:
            wstate, weights = weigher.update(wstate, observe(out.result.outcomes, out.consumed))
        log.add_output(out, weights)
        if on_step is not None:
            on_step(name, i + 1)
    log.check_final(state.router)
    return replace(log.run(), length_cap=workload.max_length)


def _run_peer(name: str, workload: Workload, curve: TpotCurve, config: SimConfig, on_step: OnStep | None) -> PolicyRun:
    """A peer policy (`tailsieve.policy.peers`) on `SimExecutor`, every replica on the bulk curve; exactly-once
    consumption (or counted as dropped) is checked every step by the policy and over the run by `RunLog`."""
    loop = PeerLoop(make_peer(name, config.router, config.peers, workload.prompts, shuffle=config.shuffle,
                              seed=config.seed))
    executor = sim_executor(workload, config.engine_curves(curve)[0], config.router, config)
    log = RunLog(name)
    state = loop.initial()
    for i in range(config.steps):
        out = loop.step(state, executor)
        state = out.state
        log.add_peer(out)
        if on_step is not None:
            on_step(name, i + 1)
    return replace(log.run(), length_cap=workload.max_length, own_routing=True)


def _run_oracle(
    name: str, ref: PolicyRun, workload: Workload, curve: TpotCurve, config: SimConfig, on_step: OnStep | None
) -> PolicyRun:
    """A known-length baseline applied per step to uniform's batches (same prompts, same draws): exact makespans.

    With speculation on, every replica runs the bulk pool's configuration (the per-pool split is TailSieve's)."""
    policy = get_policy(name)
    r = config.router.replicas
    curve = config.engine_curves(curve)[0]  # an oracle knows the fleet's real speed
    ex = sim_executor(workload, curve, config.router, config)
    records: list[StepRecord] = []
    for i, (rec, lens) in enumerate(zip(ref.steps, ref.batch_lengths, strict=True)):
        a = assign_checked(policy, GroupBatch(lens), r, curve)
        spans = np.asarray(a.replica_makespans_s, dtype=np.float64)
        if not config.replica.all_admit or not config.speed.uniform:  # the simulator's replicas (batch order)
            ptoks = ex.prompt_tokens(ref.batch_prompts[i]) if ref.batch_prompts else None
            flat_p = None if ptoks is None else np.repeat(ptoks, lens.shape[1])
            flat_l, flat_r = lens.ravel(), a.replica.ravel()
            keys = np.repeat(np.arange(lens.shape[0]), lens.shape[1])
            slow = 1.0 / config.speed.speeds(r, config.seed, rec.step)
            spans = np.array([
                run_replica(flat_l[flat_r == k], curve, config.replica,
                            None if flat_p is None else flat_p[flat_r == k], prefix_keys=keys[flat_r == k]).makespan
                * slow[k] for k in range(r)
            ])
        q, m = int(a.info.get("q", 0)), int(a.info.get("m", a.info.get("dedicated", 0)))
        tail_reps, bulk_reps = pool_split(r, m)
        tail_s = float(spans[list(tail_reps)].max()) if m > 0 else 0.0
        bulk_s = float(spans[list(bulk_reps)].max())
        note = " ".join(f"{k}={v}" for k, v in a.info.items() if k in ("q", "m", "dedicated", "isolated_requests"))
        records.append(StepRecord(step=rec.step, makespan_s=max(tail_s, bulk_s), tail_s=tail_s, bulk_s=bulk_s, q=q, m=m,
                                  candidates=0, wasted_tokens=0, batch_mean_length=rec.batch_mean_length, note=note))
        if on_step is not None:
            on_step(name, i + 1)
    return replace(ref, policy=name, steps=tuple(records))  # uniform's batches, redraws and length cap
