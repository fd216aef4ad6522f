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

import asyncio
import gc
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

from tailsieve.analysis.weights import BiasWeights, WeightState, observe
from tailsieve.engines.rollout.batch import Batch, GroupResult, TrainerSample
from tailsieve.engines.rollout.engine_executor import EngineExecutor, ExecutedStep, GroupSpec
from tailsieve.engines.rollout.prompts import Messages, PromptRecord, load_prompts, render
from tailsieve.engines.rollout.resume import check_state
from tailsieve.engines.rollout.rollout_config import RolloutConfig
from tailsieve.engines.rollout.state import RolloutState
from tailsieve.engines.rollout.weight_sync import (
    ReloadHook,
    StaleBatch,
    VersionCheck,
    WeightPush,
    WeightSync,
    WeightUpdate,
)
from tailsieve.engines.transport.engine_client import (
    ClientOptions,
    Endpoint,
    EngineClient,
    EngineError,
    NoHealthyReplica,
    ReplicaFault,
    SamplingParams,
)
from tailsieve.engines.transport.health import Replicas
from tailsieve.errors import ConfigError
from tailsieve.hashing import stable_hash
from tailsieve.loop import LoopState, PoolHook, build_loop
from tailsieve.policy.peers import PEERS
from tailsieve.policy.step import GroupRef, StepPlan

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
    `make_rollout` builds."""

    def __init__(self, endpoints: Sequence[str | Endpoint], config: RolloutConfig,
                 prompts: Sequence[PromptRecord] | str | Path, *, state: RolloutState | str | Path | None = None,
                 pools: PoolHook | None = None, reload: ReloadHook | None = None) -> None:
        if type(self) is Rollout and config.policy in PEERS:
            raise ConfigError(f"{config.policy} is a peer policy: make_rollout(endpoints, config, prompts) builds its "
                              "PeerRollout")
        self.endpoints = tuple(e if isinstance(e, Endpoint) else Endpoint.parse(e) for e in endpoints)
        if not self.endpoints:
            raise ConfigError("no endpoints given")
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
        self._drawn: tuple[int, dict[int, int], dict[str, int]] | None = None  # (step, uid → generation, counters)
        self._by_id = {p.prompt_id: p for p in self.prompts}
        self._rendered: dict[str, str | Messages] = {}
        self._replay_id = self._replay_map()
        start = self.loop.initial()
        self.rstate, self.cstate = start.router, start.control
        self.weigher = BiasWeights() if config.bias_correction else None
        self.wstate = WeightState()  # the weights' window (not saved: it refills after a resume)
        self.generation: dict[str, int] = {}
        self._first: dict[int, int] = {}  # uid → step its draw was first dispatched (delays; not saved)
        self.reload = reload  # restart-on-checkpoint fallback of `update_weights` (a launcher's `reload`)
        self._version = 0
        self.weights: WeightSync | None = None  # set by `open`
        if state is not None:
            self.restore(state if isinstance(state, RolloutState) else RolloutState.load(state))
        self.client = EngineClient(ClientOptions(api=config.api, stream=config.stream,
                                                 connect_timeout_s=config.faults.connect_timeout_s,
                                                 stall_timeout_s=config.faults.stall_timeout_s,
                                                 api_key_env=config.api_key_env, logprobs=config.logprobs,
                                                 deadline_s=config.faults.deadline_s))
        for e in self.endpoints:
            self.client.check_endpoint(e)
        self.replicas: Replicas | None = None
        self.executor: EngineExecutor | None = None

    def _replay_map(self) -> dict[str, str]:
        w = self.config.replay
        if w is None:
            return {}
        known = set(w.prompts)
        return {p.prompt_id: p.prompt_id if p.prompt_id in known else w.prompts[i % len(w.prompts)]
                for i, p in enumerate(self.prompts)}

    def fingerprint(self) -> dict[str, Any]:
        """The run shape a saved state must match."""
        ids = "\n".join(p.prompt_id for p in self.prompts)
        return {"groups": self.rc.groups, "group_size": self.rc.group_size, "replicas": self.rc.replicas,
                "rho": self.rc.rho, "prompts": len(self.prompts), "prompt_ids": f"{stable_hash(ids):016x}",
                "seed": self.config.seed, "shuffle": self.config.shuffle}

    def state(self) -> RolloutState:
        """A snapshot after the last completed step."""
        return RolloutState(self.config.policy, self.fingerprint(), self.rstate, self.cstate, dict(self.generation),
                            self.weight_version)

    def save(self, path: str | Path) -> None:
        """Write `state()` atomically."""
        self.state().save(path)

    def restore(self, state: RolloutState) -> None:
        """Continue from a saved state: it must belong to this run (same shape, prompts, seed and policy; its waiting
        groups and counters this run's: `resume.check_state`), else a one-line ConfigError and nothing changes."""
        check_state(state, self.fingerprint(), self.config.policy, self.router)
        self.rstate, self.cstate, self.generation = state.router, state.control, dict(state.generation)
        self._version = state.weight_version
        if self.weights is not None:
            self.weights.version = state.weight_version
        self._drawn = None

    async def __aenter__(self) -> Rollout:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def open(self) -> None:
        """Open the HTTP session, health-check every endpoint and resolve the model name."""
        self.client.open()
        self.replicas = Replicas(self.endpoints, self.client, self.config.faults)
        try:
            model = await self._resolve_model(self.replicas)
        except BaseException:
            await self.close()
            raise
        self.executor = self.build_executor(self.replicas, model)
        self.weights = WeightSync(self.replicas, self.reload, self._version)
        self.executor.weight_version = self._version
        self.executor.exclude_other_versions = True  # the servers' versions are the run's (WeightSync)
        if self._version > 0:  # resumed: do the servers really serve the saved version?
            await self.weights.verify()
        freeze_startup_heap()

    def build_executor(self, replicas: Replicas, model: str) -> EngineExecutor:
        """The step's executor (hook: an adapter overrides it, e.g. to instrument requests or to generate through
        an RL framework's engines); it must return `ExecutedStep`s, whose samples become the batch."""
        return EngineExecutor(replicas, model, self._params(), self.rc.group_size, self.config.request_mode,
                              spec=self._group_spec)

    async def _resolve_model(self, replicas: Replicas) -> str:
        await replicas.check_all()
        healthy = replicas.healthy()
        if not healthy:
            raise NoHealthyReplica(f"no endpoint answers /health: {', '.join(e.url for e in self.endpoints)}")
        model = self.config.model or self.endpoints[healthy[0]].model
        return model if model is not None else await self._ask_model(replicas, healthy)

    async def _ask_model(self, replicas: Replicas, healthy: list[int]) -> str:
        """The first served name that a healthy endpoint's /v1/models lists; an endpoint whose reply is bad (or
        lists nothing) is skipped, and marked down when the fault is the replica's."""
        errors: list[str] = []
        for i in healthy:
            try:
                names = await self.client.models(self.endpoints[i])
            except ReplicaFault as exc:
                replicas.mark_down(i, exc.kind, str(exc))
                errors.append(str(exc))
                continue
            except EngineError as exc:
                errors.append(str(exc))
                continue
            if names:
                return names[0]
            errors.append(f"{self.endpoints[i].url} serves no model")
        raise ConfigError(f"no endpoint names a served model (/v1/models): {'; '.join(errors)}"[:600])

    def _params(self) -> SamplingParams:
        s = self.config.sampling
        if self.config.replay is None:
            return s
        return SamplingParams(s.temperature, s.top_p, s.top_k, s.presence_penalty, s.max_tokens, (), True, s.extra)

    async def close(self) -> None:
        """Stop probes and close the session."""
        if self.replicas is not None:
            await self.replicas.close()
        await self.client.close()

    def _prompt(self, prompt_id: str) -> str | Messages:
        if prompt_id not in self._rendered:
            self._rendered[prompt_id] = render(self._by_id[prompt_id], self.config.template)
        return self._rendered[prompt_id]

    def _spec(self, ref: GroupRef, a: int, step: int) -> GroupSpec:
        g, cfg = self.rc.group_size, self.config
        seeds: tuple[int | None, ...] = (None,) * g
        if cfg.seed is not None:
            h = stable_hash(f"{cfg.seed}|{ref.prompt_id}|{a}")
            seeds = tuple(int((h + j * 0x9E3779B1) % (2**31 - 1)) for j in range(g))
        lens: tuple[int | None, ...] = (None,) * g
        if cfg.replay is not None:
            raw = cfg.replay.lengths(self._replay_id[ref.prompt_id], a, step, g)
            lens = tuple(max(1, round(int(x) * cfg.length_scale)) for x in raw)
        return GroupSpec(self._prompt(ref.prompt_id), seeds, lens)

    def _generations(self, plan: StepPlan) -> tuple[dict[int, int], dict[str, int]]:
        """The generation each planned group regenerates (per prompt, counting every earlier one) and the counters
        after the step; computed once per plan and committed only when the step succeeds."""
        if self._drawn is None or self._drawn[0] != plan.step:
            gen = dict(self.generation)
            drawn: dict[int, int] = {}
            for ref in (*plan.tail, *plan.bulk):
                drawn[ref.uid] = gen.get(ref.prompt_id, 0)
                gen[ref.prompt_id] = drawn[ref.uid] + 1
            self._drawn = (plan.step, drawn, gen)
        return self._drawn[1], self._drawn[2]

    def _group_spec(self, ref: GroupRef, plan: StepPlan) -> GroupSpec:
        """The executor's spec function: prompt, per-member seeds and (replay) max_tokens of a planned group."""
        return self._spec(ref, self._generations(plan)[0][ref.uid], plan.step)

    @property
    def version_check(self) -> VersionCheck | None:
        """What the replicas last reported serving (`WeightSync.verify`: at `open` of a resumed run); None before."""
        return None if self.weights is None else self.weights.last_check

    @property
    def weight_version(self) -> int:
        """The weights the replicas serve: 0 at the start, +1 per `update_weights` (saved with the state)."""
        return self.weights.version if self.weights is not None else self._version

    async def update_weights(self, path: str | Path | None = None, *, version: int | None = None,
                             push: WeightPush | None = None) -> WeightUpdate:
        """Make every replica serve new weights before the next step: from the checkpoint folder `path` (in place
        through the engine's update path, else restarted by the `reload` hook), or through a framework's `push`
        hook. Every later sample carries the new version; a replica that could not be updated is not used until it
        is (see `tailsieve.engines.rollout.weight_sync`)."""
        if self.weights is None or self.executor is None:
            raise ConfigError("Rollout is not open: use `async with Rollout(...) as r`")
        done = await self.weights.update(path, version=version, push=push)
        self._version = self.executor.weight_version = done.version
        return done

    async def _pool_move(self, plan: StepPlan) -> float:
        """The pool hook (a launcher moving replicas), off the event loop; its restart seconds."""
        spent = 0.0 if self.pools is None else float(await asyncio.to_thread(self.pools, plan))
        if self.replicas is not None:  # right before dispatch: a replica back up serves this step, not the next
            await self.replicas.reprobe_down()
        return spent

    async def step(self) -> Batch:
        """Run one step and return its N complete groups; state advances only when the step succeeds."""
        if self.executor is None or self.replicas is None:
            raise ConfigError("Rollout is not open: use `async with Rollout(...) as r`")
        if self.weights is not None:
            await self.weights.refresh()
            self.weights.require_fresh()
        out = await self.loop.astep(LoopState(self.rstate, self.cstate), self.executor, self._pool_move)
        ex = cast(ExecutedStep, out.result)
        wstate, weights = self.wstate, list[float | None]([None] * len(out.consumed))
        if self.weigher is not None:
            wstate, w = self.weigher.update(self.wstate, observe(ex.outcomes, out.consumed))
            weights = [float(x) for x in w]
        groups = tuple(
            GroupResult(o.ref.uid, o.ref.prompt_id, self._prompt(o.ref.prompt_id), o.pool, float(o.finish_s or 0.0),
                        tuple(s for s in ex.samples[o.ref.uid] if s is not None), wt)
            for o, wt in zip(out.consumed, weights, strict=True)
        )
        down = tuple(i for i, u in enumerate(self.replicas.up) if not u)
        first = {r.uid: self._first.get(r.uid, out.plan.step) for r in (*out.plan.tail, *out.plan.bulk)}
        batch = Batch(out.plan.step, groups, out.record, ex.outcomes, ex.redispatched, ex.started_at, down,
                      out.restart_s, tuple(o.ref.cuts for o in out.consumed), self.truncated(groups),
                      self.weight_version, tuple(out.plan.step - first[o.ref.uid] for o in out.consumed))
        self.refuse_stale(batch)
        self.rstate, self.cstate, self.wstate = out.state.router, out.state.control, wstate
        self.generation = self._generations(out.plan)[1]
        eaten = {o.ref.uid for o in out.consumed}
        self._first = {u: f for u, f in (self._first | first).items() if u not in eaten}
        return batch

    @property
    def steps_done(self) -> int:
        """Steps completed so far (the next step's index)."""
        return self.rstate.step

    @staticmethod
    def refuse_stale(batch: Batch) -> None:
        """StaleBatch when a consumed sample predates the weights (refused before the state moves: the next step
        runs these groups again)."""
        if batch.stale_samples:
            why = (f"{batch.served_stale} were served under another version than the run's (a replica's weights "
                   "changed outside update_weights)" if batch.served_stale else
                   "update_weights ran during the step")
            raise StaleBatch(f"step {batch.step}: {batch.stale_samples} consumed sample(s) predate weight version "
                             f"{batch.weight_version} ({why}); the step was not consumed, run it again")

    def truncated(self, groups: Sequence[GroupResult]) -> tuple[tuple[bool, ...], ...] | None:
        """Which samples hit the length cap: finish_reason "length" when every sample has one (exact), else tokens
        >= max_tokens; with length replay (every request ends at its replayed max_tokens) tokens >= the workload's
        cap × length_scale, None when the workload has no cap."""
        if self.config.replay is not None:
            w = self.config.replay
            if w.max_length is None:
                return None
            cap = max(1, round(w.max_length * self.config.length_scale))
            return tuple(tuple(s.tokens >= cap for s in g.samples) for g in groups)
        if all(s.finish_reason is not None for g in groups for s in g.samples):
            return tuple(tuple(s.finish_reason == "length" for s in g.samples) for g in groups)
        cap = self.config.sampling.max_tokens
        return tuple(tuple(s.tokens >= cap for s in g.samples) for g in groups)

