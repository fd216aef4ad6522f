"""Python API for RL loops: `async with Rollout(endpoints, config, prompts) as r: batch = await r.step()`.

Each step plans with the same `Router` and controller as the simulator, executes on the replicas with
`EngineExecutor`, feeds the controller the same `StepObservation`, and returns N complete groups. `r.state()` /
`r.save(path)` capture router, controller and generation counters; `Rollout(..., state=path)` resumes from them.
Per-pool speculation (§3.4): the controller gets the tail pool's curve (`tail_curve`, or `spec` derived from
`curve`). The step itself is the shared step loop (`tailsieve.loop.StepLoop.astep`) with `EngineExecutor`.
`Rollout(..., pools=launcher.pool_hook)` gives a replica launcher each plan's pools before the step runs; the
restart seconds it returns are added to the step's makespan (docs/launch.md). `make_rollout`
(`engines/rollout/peer_rollout.py`) builds the rollout a config names: a `Rollout`, or a `PeerRollout` for a peer
policy (verl-lif, rollpacker, …).
"""

from __future__ import annotations

import gc
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

from tailsieve.engines.rollout.batch import Batch, GroupResult, TrainerSample, group_results, truncated
from tailsieve.engines.rollout.engine_executor import EngineExecutor, ExecutedStep
from tailsieve.engines.rollout.engine_setup import EngineSetup, parse_endpoints
from tailsieve.engines.rollout.prompt_specs import PromptSpecs
from tailsieve.engines.rollout.prompts import PromptRecord, load_prompts
from tailsieve.engines.rollout.rollout_config import RolloutConfig
from tailsieve.engines.rollout.run_position import RunPosition, fingerprint
from tailsieve.engines.rollout.run_weights import RunWeights, refuse_stale
from tailsieve.engines.rollout.sample_weights import SampleWeights
from tailsieve.engines.rollout.state import RolloutState
from tailsieve.engines.rollout.weight_sync import ReloadHook, VersionCheck, WeightPush, WeightSync, WeightUpdate
from tailsieve.engines.transport.engine_client import Endpoint, EngineClient
from tailsieve.engines.transport.health import Replicas
from tailsieve.errors import ConfigError
from tailsieve.loop import PoolHook, build_loop
from tailsieve.policy.controller import ControlState
from tailsieve.policy.peers import PEERS
from tailsieve.policy.router import RouterState
from tailsieve.policy.step import StepPlan

__all__ = ["Batch", "GroupResult", "Rollout", "RolloutConfig", "TrainerSample", "WeightUpdate"]

def freeze_startup_heap() -> None:
    """Once per process: move every object alive now (imported modules, configs, the prompt set) out of the cyclic
    collector's scans (`gc.freeze`). A step allocates a few objects per stream event; each full collection would
    otherwise walk the whole start-up heap again (measured: 0.06 ms of CPU per request, a sixth of the client's
    cost). What runs allocate later is collected as usual; `TAILSIEVE_NO_GC_FREEZE=1` turns it off."""
    global _FROZEN
    if not _FROZEN and os.environ.get("TAILSIEVE_NO_GC_FREEZE") != "1":
        gc.freeze()
        _FROZEN = True


_FROZEN = False


class Rollout:
    """Drives real replicas step by step with the simulator's router and controller (see module docstring); a peer
    policy runs as a `PeerRollout` (`engines/rollout/peer_rollout.py`: the peer's own loop, same executor), which
    `make_rollout` builds. A façade over parts with one job each: `specs` (what each group is sent: rendered prompt,
    seeds, replayed lengths, generation counters), `engines` (endpoints, client, replicas, model, executor, pool
    moves), `versions` (the weight version and its sync), `position` (router and controller state, fingerprint,
    save and restore, delays) and `weighting` (bias-correction weights)."""

    def __init__(self, endpoints: Sequence[str | Endpoint], config: RolloutConfig,
                 prompts: Sequence[PromptRecord] | str | Path, *, state: RolloutState | str | Path | None = None,
                 pools: PoolHook | None = None, reload: ReloadHook | None = None) -> None:
        if type(self) is Rollout and config.policy in PEERS:
            raise ConfigError(f"{config.policy} is a peer policy: make_rollout(endpoints, config, prompts) builds its "
                              "PeerRollout")
        self.endpoints = parse_endpoints(endpoints)
        self.config = config
        self.prompts = load_prompts(prompts) if isinstance(prompts, str | Path) else tuple(prompts)
        if not self.prompts:
            raise ConfigError("no prompts given")
        self.policy_spec = config.policy_spec(len(self.endpoints))
        self.rc = self.policy_spec.router
        self.tail_curve, self.curve = self.policy_spec.cost.tail_curve, self.policy_spec.cost.bulk_curve
        self.pools = pools
        self.loop = build_loop(self.policy_spec, [p.prompt_id for p in self.prompts])
        self.router, self.controller = self.loop.router, self.loop.controller
        self.specs = PromptSpecs(self.prompts, config, self.rc.group_size)
        self.position = RunPosition(self.loop.initial(), config.policy, fingerprint(self.rc, config, self.prompts))
        self.weighting = SampleWeights(config.bias_correction)
        self.versions = RunWeights(reload)
        if state is not None:
            self.restore(state if isinstance(state, RolloutState) else RolloutState.load(state))
        self.engines = EngineSetup(self.endpoints, config)

    @property
    def client(self) -> EngineClient:
        """The HTTP client (open between `open` and `close`)."""
        return self.engines.client

    @property
    def replicas(self) -> Replicas | None:
        """The replicas (health, faults), None before `open`."""
        return self.engines.replicas

    @property
    def executor(self) -> EngineExecutor | None:
        """The step's executor (`build_executor`), None before `open`."""
        return self.engines.executor

    @property
    def weights(self) -> WeightSync | None:
        """The replicas' weight sync, None before `open`."""
        return self.versions.sync

    @property
    def rstate(self) -> RouterState:
        """The router's state after the last completed step."""
        return self.position.loop_state.router

    @property
    def cstate(self) -> ControlState:
        """The controller's state after the last completed step."""
        return self.position.loop_state.control

    @property
    def generation(self) -> dict[str, int]:
        """Per prompt, the generations already started (seeds and replayed lengths depend on it; saved)."""
        return self.specs.generation

    def fingerprint(self) -> dict[str, Any]:
        """The run shape a saved state must match."""
        return self.position.fingerprint

    def state(self) -> RolloutState:
        """A snapshot after the last completed step."""
        return self.position.snapshot(self.generation, self.weight_version)

    def save(self, path: str | Path) -> None:
        """Write `state()` atomically."""
        self.state().save(path)

    def restore(self, state: RolloutState) -> None:
        """Continue from a saved state: it must belong to this run (same shape, prompts, seed and policy; its waiting
        groups and counters this run's: `resume.check_state`), else a one-line ConfigError and nothing changes."""
        self.position.restore(state, self.router)
        self.specs.restore(state.generation)
        self.versions.restore(state.weight_version)

    async def __aenter__(self) -> Rollout:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def open(self) -> None:
        """Open the HTTP session, health-check every endpoint, resolve the model name, build the executor and sync
        the replicas' weights (a resumed run: verify that they serve the saved version)."""
        replicas, executor = await self.engines.open(self.build_executor)
        await self.versions.attach(replicas, executor)
        freeze_startup_heap()

    def build_executor(self, replicas: Replicas, model: str) -> EngineExecutor:
        """The step's executor (hook: an adapter overrides it, e.g. to instrument requests or to generate through
        an RL framework's engines); it must return `ExecutedStep`s, whose samples become the batch."""
        return EngineExecutor(replicas, model, self.specs.params(), self.rc.group_size, self.config.request_mode,
                              spec=self.specs.group_spec)

    async def close(self) -> None:
        """Stop probes and close the session."""
        await self.engines.close()

    @property
    def version_check(self) -> VersionCheck | None:
        """What the replicas last reported serving (`WeightSync.verify`: at `open` of a resumed run); None before."""
        return self.versions.check

    @property
    def weight_version(self) -> int:
        """The weights the replicas serve: 0 at the start, +1 per `update_weights` (saved with the state)."""
        return self.versions.version

    async def update_weights(self, path: str | Path | None = None, *, version: int | None = None,
                             push: WeightPush | None = None) -> WeightUpdate:
        """Make every replica serve new weights before the next step: from the checkpoint folder `path` (in place
        through the engine's update path, else restarted by the `reload` hook), or through a framework's `push`
        hook. Every later sample carries the new version; a replica that could not be updated is not used until it
        is (see `tailsieve.engines.rollout.weight_sync`)."""
        return await self.versions.update(self.executor, path, version=version, push=push)

    async def _pool_move(self, plan: StepPlan) -> float:
        """The pool hook (a launcher moving replicas), off the event loop; its restart seconds."""
        return await self.engines.pool_move(plan, self.pools)

    async def step(self) -> Batch:
        """Run one step and return its N complete groups; state advances only when the step succeeds."""
        if self.executor is None or self.replicas is None:
            raise ConfigError("Rollout is not open: use `async with Rollout(...) as r`")
        await self.versions.before_step()
        out = await self.loop.astep(self.position.loop_state, self.executor, self._pool_move)
        ex = cast(ExecutedStep, out.result)
        window, weights = self.weighting.weigh(ex.outcomes, out.consumed)
        groups = group_results(out.consumed, ex.samples, self.specs.prompt, weights)
        first = self.position.first_dispatch(out.plan)
        batch = Batch(out.plan.step, groups, out.record, ex.outcomes, ex.redispatched, ex.started_at,
                      self.engines.down(), out.restart_s, tuple(o.ref.cuts for o in out.consumed),
                      self.truncated(groups), self.weight_version,
                      tuple(out.plan.step - first[o.ref.uid] for o in out.consumed))
        self.refuse_stale(batch)
        self.position.advance(out.state, first, out.consumed)
        self.weighting.commit(window)
        self.specs.commit(out.plan)
        return batch

    @property
    def steps_done(self) -> int:
        """Steps completed so far (the next step's index)."""
        return self.position.step

    @staticmethod
    def refuse_stale(batch: Batch) -> None:
        """StaleBatch when a consumed sample predates the weights (refused before the state moves: the next step
        runs these groups again)."""
        refuse_stale(batch)

    def truncated(self, groups: Sequence[GroupResult]) -> tuple[tuple[bool, ...], ...] | None:
        """Which samples hit the length cap (`batch.truncated`)."""
        return truncated(groups, self.config)

