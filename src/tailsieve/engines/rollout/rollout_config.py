"""`RolloutConfig`: what a real run is (step shape, policy, curve for the controller, sampling, template, transport,
faults, replay), checked when it is built; `Rollout` (`engines/rollout/api.py`) takes it, and `tailsieve.loop`
builds the run's router and `PolicySpec` from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tailsieve.engines.rollout.engine_executor import RequestMode
from tailsieve.engines.rollout.prompts import Template
from tailsieve.engines.transport.engine_client import Api, SamplingParams
from tailsieve.engines.transport.health import FaultPolicy
from tailsieve.errors import ConfigError
from tailsieve.model.costmodel import CostModel
from tailsieve.model.curves import TpotCurve
from tailsieve.model.speculative import PoolSpec
from tailsieve.policy.controller import ControllerConfig
from tailsieve.policy.peers import PEERS, PeerConfig
from tailsieve.policy.router import RouterConfig, RouterKnobs
from tailsieve.policy.router_knobs import router_values
from tailsieve.policy.spec import FleetCost, PolicySpec, check_loop_policy
from tailsieve.workloads import Workload

__all__ = ["RolloutConfig"]


@dataclass(frozen=True, slots=True)
class RolloutConfig(RouterKnobs):
    """A real run: step shape, the router's knobs (`RouterKnobs`: `rho`, `dispatch`, `max_redraws`, `ranking`, by
    keyword), policy, curve for the controller, sampling, template, transport, faults, replay."""

    groups: int = 64
    group_size: int = 8
    policy: str = "tailsieve"
    curve: str | Path | TpotCurve | CostModel = "h100-llama3-8b"  # best: the model `tailsieve profile` fitted
    tail_curve: str | Path | TpotCurve | None = None  # the tail pool's measured curve (profile of its server)
    spec: PoolSpec = field(default_factory=PoolSpec)  # per-pool speculation: derives both pools' curves from `curve`
    controller: ControllerConfig = field(default_factory=ControllerConfig)
    q: int | None = None  # static policy
    m: int | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)
    template: Template = Template.NONE
    api: Api = Api.COMPLETIONS
    request_mode: RequestMode = RequestMode.SPLIT
    stream: bool = True
    seed: int | None = 0  # per-request seeds derive from (seed, prompt, generation, member); None: unseeded
    shuffle: bool = False
    replay: Workload | None = None  # fixed-length replay: ignore_eos + per-request max_tokens from the workload
    length_scale: float = 1.0  # replay lengths × this (≥ 1 token)
    faults: FaultPolicy = field(default_factory=FaultPolicy)
    api_key_env: str | None = "TAILSIEVE_API_KEY"
    model: str | None = None  # None: the first model the first healthy endpoint serves
    kv_ms_per_1k: float | None = None  # the controller's KV-traffic term; None: the `curve` model file's (else 0)
    bias_correction: bool = False  # per-group weights (`analysis.weights`) in every batch; opt-in
    logprobs: bool = False  # every sample carries its tokens' log-probabilities (trainer-ready outputs)
    peers: PeerConfig = field(default_factory=PeerConfig)  # a peer policy's knobs (default: over-sample by rho)

    def __post_init__(self) -> None:
        check_loop_policy(self.policy)  # a loop policy or a peer (the oracles need known lengths: `simulate`)
        if self.policy in PEERS and PEERS[self.policy].resumes and not (
                self.stream and self.api is Api.COMPLETIONS and self.request_mode is RequestMode.SPLIT):
            raise ConfigError(f"peer {self.policy} resumes cut requests from their text, which needs streamed "
                              "completions with one request per member (docs/peers.md)")
        if self.policy in PEERS and self.bias_correction:
            raise ConfigError(f"bias correction does not apply to peer {self.policy} (it carries no weights)")
        if not self.length_scale > 0:
            raise ConfigError(f"length_scale must be > 0, got {self.length_scale}")

    def router(self, replicas: int) -> RouterConfig:
        """The router configuration for `replicas` endpoints."""
        return RouterConfig(groups=self.groups, group_size=self.group_size, replicas=replicas, **router_values(self))

    def policy_spec(self, replicas: int) -> PolicySpec:
        """The run's `PolicySpec` on `replicas` endpoints (every policy check, once; `tailsieve.loop.build_loop`)."""
        cost = FleetCost.load(self.curve, tail_curve=self.tail_curve, pools=self.spec, kv_ms_per_1k=self.kv_ms_per_1k)
        # a peer (PeerRollout) plans with its own loop, every replica bulk: its controller state stays uniform's
        name = "uniform" if self.policy in PEERS else self.policy
        return PolicySpec(name, self.router(replicas), cost, self.controller, q=self.q, m=self.m,
                          shuffle=self.shuffle, seed=self.seed or 0)
