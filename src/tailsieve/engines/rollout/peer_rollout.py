"""`PeerRollout`: a peer policy (`tailsieve.policy.peers`: verl-lif, rollpacker, april-drop, openrlhf-group …) on
real replicas. `make_rollout(endpoints, RolloutConfig(policy="verl-lif"), prompts)` gives one: `make_rollout` (here,
one floor above both rollouts) builds the rollout a config names, a `Rollout` or a `PeerRollout`.

Everything but the policy is `Rollout`'s: the same endpoints, `EngineExecutor`, prompts, per-request seeds and
generation counters, pool hook, weight sync and batches. Each step runs the peer's loop (`tailsieve.loop.PeerLoop`:
the peer plans with every replica bulk, the executor runs the plan with the step contract's cutoff rule, the peer
observes it with its step check, carry and token ledger), and the batch carries the peer's fidelity numbers: delays,
off-policy tokens and dropped prompts (the same columns as `simulate`). april-partial's resumed groups continue on
the replicas from their text (`EngineExecutor.partial`, docs/peers.md) in the generation they were cut in (same
seeds and replayed lengths). A peer's run cannot be resumed from its output folder yet: `state.json` records the
peer state for reading, with `"resumable": false`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

from tailsieve.engines.rollout.api import Batch, Rollout, RolloutConfig
from tailsieve.engines.rollout.batch import group_results
from tailsieve.engines.rollout.engine_executor import EngineExecutor, ExecutedStep
from tailsieve.engines.rollout.prompts import PromptRecord
from tailsieve.engines.rollout.state import RolloutState
from tailsieve.engines.transport.engine_client import Endpoint
from tailsieve.engines.transport.health import Replicas
from tailsieve.errors import ConfigError
from tailsieve.loop import PeerLoop
from tailsieve.outputs import write_json_atomic
from tailsieve.policy.peers import PEERS, PeerState, make_peer


class PeerRollout(Rollout):
    """`Rollout` driven by a peer's loop (see the module docstring)."""

    def __init__(self, endpoints: Sequence[str | Endpoint], config: RolloutConfig,
                 prompts: Sequence[PromptRecord] | str | Path, *, state: RolloutState | str | Path | None = None,
                 **kw: Any) -> None:
        if state is not None:
            raise ConfigError(f"a run of peer {config.policy} cannot be resumed yet (its state is not saved)")
        super().__init__(endpoints, config, prompts, **kw)
        ids = [p.prompt_id for p in self.prompts]
        self.peers = PeerLoop(make_peer(config.policy, self.rc, config.peers, ids, shuffle=config.shuffle,
                                        seed=config.seed or 0))
        self.pstate: PeerState = self.peers.initial()

    def build_executor(self, replicas: Replicas, model: str) -> EngineExecutor:
        """`Rollout`'s executor, keeping cut requests' output when the peer resumes them (april-partial)."""
        ex = super().build_executor(replicas, model)
        ex.partial = self.peers.peer.resumes
        return ex

    @property
    def steps_done(self) -> int:
        """Steps completed so far."""
        return self.pstate.step

    def save(self, path: str | Path) -> None:
        """Write the peer state (for reading; not a resume point)."""
        st = self.pstate
        write_json_atomic(Path(path), {
            "policy": self.config.policy, "resumable": False, "step": st.step, "consumed": st.consumed,
            "dropped": st.dropped, "stream_position": None if st.stream is None else st.stream.position,
            "waiting": [{"uid": w.ref.uid, "prompt_id": w.ref.prompt_id, "cuts": w.ref.cuts,
                         "first_step": w.first_step, "prefix": list(w.prefix)} for w in st.waiting],
            "generation": dict(self.generation), "weight_version": self.weight_version})

    def restore(self, state: RolloutState) -> None:
        """Refused: a peer's run is not resumable yet."""
        raise ConfigError(f"a run of peer {self.config.policy} cannot be resumed yet (its state is not saved)")

    async def step(self) -> Batch:
        """Run one step of the peer and return its N complete groups; state advances only when the step succeeds."""
        if self.executor is None or self.replicas is None:
            raise ConfigError("Rollout is not open: use `async with Rollout(...) as r`")
        await self.versions.before_step(require_fresh=False)
        out = await self.peers.astep(self.pstate, self.executor, self._pool_move)
        ex, got = cast(ExecutedStep, out.result), out.observed
        groups = group_results(got.consumed, ex.samples, self.specs.prompt)
        batch = Batch(out.plan.step, groups, out.record, ex.outcomes, ex.redispatched, ex.started_at,
                      self.engines.down(), out.restart_s, tuple(o.ref.cuts for o in got.consumed),
                      self.truncated(groups), self.weight_version, got.delays, got.offpolicy, got.dropped)
        if not self.peers.peer.resumes:  # a resumed member's finished sample is older by design (off-policy)
            self.refuse_stale(batch)
        self.pstate = out.state
        self.specs.commit(out.plan)
        return batch


def make_rollout(endpoints: Sequence[str | Endpoint], config: RolloutConfig,
                 prompts: Sequence[PromptRecord] | str | Path, **kw: Any) -> Rollout:
    """The rollout `config.policy` names: a `PeerRollout` for a peer policy (`tailsieve.policy.peers.PEERS`), else a
    `Rollout`; keywords as `Rollout`'s (`state`, `pools`, `reload`)."""
    if config.policy in PEERS:
        return PeerRollout(endpoints, config, prompts, **kw)
    return Rollout(endpoints, config, prompts, **kw)
