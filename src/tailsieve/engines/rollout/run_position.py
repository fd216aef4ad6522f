"""Where a `Rollout` stands between steps: the router and controller state after its last completed step, the run
shape a saved state must match (`fingerprint`: N, G, R, ρ, the prompt ids, seed and shuffle), the `RolloutState` it
saves (with the generation counters and weight version it is given) and the checked restore (`resume.check_state`:
a state of another run is one ConfigError and nothing changes), and the step each planned group was first dispatched
in, whose difference to the step that consumes it is its delay (not saved: it restarts after a resume)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tailsieve.engines.rollout.prompts import PromptRecord
from tailsieve.engines.rollout.resume import check_state
from tailsieve.engines.rollout.rollout_config import RolloutConfig
from tailsieve.engines.rollout.state import RolloutState
from tailsieve.hashing import stable_hash
from tailsieve.loop import LoopState
from tailsieve.policy.router import Router, RouterConfig
from tailsieve.policy.step import GroupOutcome, StepPlan

__all__ = ["RunPosition", "fingerprint"]


def fingerprint(rc: RouterConfig, config: RolloutConfig, prompts: Sequence[PromptRecord]) -> dict[str, Any]:
    """The run shape a saved state must match."""
    ids = "\n".join(p.prompt_id for p in prompts)
    return {"groups": rc.groups, "group_size": rc.group_size, "replicas": rc.replicas, "rho": rc.rho,
            "prompts": len(prompts), "prompt_ids": f"{stable_hash(ids):016x}", "seed": config.seed,
            "shuffle": config.shuffle}


class RunPosition:
    """Router and controller state of a run, its fingerprint, and first-dispatch steps (see the module docstring)."""

    def __init__(self, start: LoopState, policy: str, shape: dict[str, Any]) -> None:
        self.loop_state = start
        self.policy = policy
        self.fingerprint = shape
        self._first: dict[int, int] = {}  # uid → step its draw was first dispatched

    @property
    def step(self) -> int:
        """Steps completed so far (the next step's index)."""
        return self.loop_state.router.step

    def snapshot(self, generation: dict[str, int], weight_version: int) -> RolloutState:
        """The state after the last completed step, with the run's generation counters and weight version."""
        return RolloutState(self.policy, self.fingerprint, self.loop_state.router, self.loop_state.control,
                            dict(generation), weight_version)

    def restore(self, state: RolloutState, router: Router) -> None:
        """Continue from a saved state of this run (same shape, prompts, seed and policy; its waiting groups and
        counters this run's), else a one-line ConfigError and nothing changes."""
        check_state(state, self.fingerprint, self.policy, router)
        self.loop_state = LoopState(state.router, state.control)

    def first_dispatch(self, plan: StepPlan) -> dict[int, int]:
        """The step each planned group was first dispatched in (this step for a new one)."""
        return {r.uid: self._first.get(r.uid, plan.step) for r in (*plan.tail, *plan.bulk)}

    def advance(self, state: LoopState, first: dict[int, int], consumed: Sequence[GroupOutcome]) -> None:
        """A step succeeded: its loop state is the run's; the consumed groups' first dispatch is forgotten."""
        eaten = {o.ref.uid for o in consumed}
        self.loop_state = state
        self._first = {u: f for u, f in (self._first | first).items() if u not in eaten}
