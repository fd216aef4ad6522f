"""One policy run's specification, validated once: what `tailsieve.loop.build_loop` turns into router + controller
+ step loop for every driver (`simulate`, `plan`, `rollout`, `Rollout`, the verl and slime adapters).

Each check is written once, here or in the value it belongs to, with one message:
- the policy name is known (`CONTROLLERS.check`: a registered name, a `pkg.module:Class` plugin or an entry point);
- the fleet has the replicas the policy needs (`inputs.check_replicas`: 2 for a tail and a bulk pool, 1 for
  `uniform`; the class's `min_replicas`);
- a static m and the initial m0 name tail replicas: 0 ≤ m < R (`inputs.check_tail_replicas`);
- a static q is ≥ 0; the step shape, ρ, `max_redraws` ≥ 1 and the ranking are `RouterConfig`'s own checks, the
  controller constants `ControllerConfig`'s, and the cost terms `FleetCost`'s.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tailsieve.errors import ConfigError
from tailsieve.inputs import check_replicas, check_tail_replicas
from tailsieve.model.costmodel import CostModel, load_cost_model
from tailsieve.model.curve_names import load_curve
from tailsieve.model.curves import TpotCurve
from tailsieve.model.speculative import PoolSpec
from tailsieve.policy.control_state import ControllerConfig
from tailsieve.policy.controller import CONTROLLERS
from tailsieve.policy.peers import PEERS
from tailsieve.policy.router import RouterConfig
from tailsieve.registry import Registry, resolve_any

__all__ = ["FleetCost", "PolicySpec", "check_loop_policy", "resolve_policy"]


def resolve_policy(name: str, valid: Sequence[str] | None = None) -> Registry[Any]:
    """The registry of policy `name`, resolved the one way every `--policy` is (`registry.resolve_any`): a controller
    on the loop (`CONTROLLERS`) or a peer (`PEERS`, on its `PeerLoop`), each a registered name, a `pkg.module:Class`
    plugin (registered where its class belongs) or an entry point; one message naming both kinds for a plugin that is
    neither, one unknown-name message listing `valid` (default: both registries' names)."""
    return resolve_any(name, (CONTROLLERS, PEERS), valid)


def check_loop_policy(name: str) -> None:
    """A policy a real run can drive: a controller or a peer (`resolve_policy`; the oracles need known lengths and
    exist only in `simulate`)."""
    resolve_policy(name)


@dataclass(frozen=True, slots=True)
class FleetCost:
    """What the controller predicts with: the bulk pool's τ(b), the tail pool's (None: the bulk one), the replicas'
    KV-traffic seconds per context token per iteration and the seconds to prefill one prompt on one replica; and,
    when its model file holds it (`tailsieve profile` reads it from the servers), a replica's KV capacity in tokens
    with the prompts' mean tokens (the KV-pressure term, `predictor.kv_floor`; 0: not priced)."""

    bulk_curve: TpotCurve
    tail_curve: TpotCurve | None = None
    kv_s_per_token: float = 0.0
    prefill_s: float = 0.0
    kv_tokens: int = 0
    prompt_tokens: float = 0.0

    def __post_init__(self) -> None:
        for name in ("kv_s_per_token", "prefill_s", "kv_tokens", "prompt_tokens"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise ConfigError(f"{name} must be finite and >= 0, got {v}")

    @classmethod
    def load(cls, curve: str | Path | TpotCurve | CostModel, *, tail_curve: str | Path | TpotCurve | None = None,
             pools: PoolSpec | None = None, kv_ms_per_1k: float | None = None) -> FleetCost:
        """From a curve or `tailsieve profile` model file (its kv term unless `kv_ms_per_1k` is given), per-pool
        speculation deriving both pools' curves (§3.4), and the tail pool's own measured curve on top."""
        if kv_ms_per_1k is not None and not (math.isfinite(kv_ms_per_1k) and kv_ms_per_1k >= 0):
            raise ConfigError(f"kv_ms_per_1k must be finite and >= 0, got {kv_ms_per_1k}")
        cost = load_cost_model(curve)
        tail, bulk = (pools or PoolSpec()).curves(cost.curve)
        if tail_curve is not None:
            tail = load_curve(tail_curve)
        kv = cost.kv_ms_per_1k if kv_ms_per_1k is None else kv_ms_per_1k
        return cls(bulk, tail, kv / 1e6, kv_tokens=cost.engine.kv_tokens or 0)


@dataclass(frozen=True, slots=True)
class PolicySpec:
    """A policy by name on a step shape and fleet: the router's configuration, the controller's constants, a static
    (q, m), the cost model, and the prompt order (shuffle, seed). Built once, checked once (module docstring)."""

    policy: str
    router: RouterConfig
    cost: FleetCost
    controller: ControllerConfig = field(default_factory=ControllerConfig)
    q: int | None = None  # the static policy's isolated groups (None: its default)
    m: int | None = None  # the static policy's tail replicas (None: its default)
    shuffle: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        cls = CONTROLLERS.resolve(self.policy)
        r = self.router.replicas
        check_replicas(self.policy, cls.min_replicas, r)
        if cls.min_replicas < 2:  # a policy without a tail pool (uniform) never reads q, m or m0
            return
        if self.q is not None and (isinstance(self.q, bool) or not isinstance(self.q, int) or self.q < 0):
            raise ConfigError(f"q must be an integer >= 0, got {self.q!r}")
        check_tail_replicas(self.m, r, "m")
        check_tail_replicas(self.controller.m0, r, "m0")
