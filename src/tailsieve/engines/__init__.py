"""Real engines: an async OpenAI-compatible client, the engine executor, health/faults, the `Rollout` API,
profiling, prompt templates, state save/restore and local vLLM (CPU) servers. See docs/engines.md."""

from tailsieve.engines.rollout.api import Batch, GroupResult, Rollout, RolloutConfig
from tailsieve.engines.rollout.engine_executor import EngineExecutor, RequestMode, Sample
from tailsieve.engines.rollout.peer_rollout import make_rollout
from tailsieve.engines.rollout.prompts import PromptRecord, Template, load_prompts, paper_sampling, render
from tailsieve.engines.rollout.state import RolloutState
from tailsieve.engines.transport.backends import BACKENDS, EngineBackend, get_backend, register_backend
from tailsieve.engines.transport.engine_client import (
    Api,
    ClientOptions,
    Endpoint,
    EngineClient,
    EngineError,
    NoHealthyReplica,
    ReplicaFault,
    RequestRejected,
    SamplingParams,
    ServerKind,
)
from tailsieve.engines.transport.health import FaultPolicy, Replicas
from tailsieve.engines.transport.sglang_native import SGLangNativeBackend, TokenPrompt

__all__ = [
    "BACKENDS",
    "Api",
    "Batch",
    "ClientOptions",
    "Endpoint",
    "EngineBackend",
    "EngineClient",
    "EngineError",
    "EngineExecutor",
    "FaultPolicy",
    "GroupResult",
    "NoHealthyReplica",
    "PromptRecord",
    "ReplicaFault",
    "Replicas",
    "RequestMode",
    "RequestRejected",
    "Rollout",
    "RolloutConfig",
    "RolloutState",
    "SGLangNativeBackend",
    "Sample",
    "SamplingParams",
    "ServerKind",
    "Template",
    "TokenPrompt",
    "get_backend",
    "load_prompts",
    "make_rollout",
    "paper_sampling",
    "register_backend",
    "render",
]
