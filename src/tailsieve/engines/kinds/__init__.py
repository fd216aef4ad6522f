"""Engine kinds: one module per server flavour, each a client backend plus its server half (docs/engines.md,
"Engine kinds"). Importing this package registers the built-in kinds `vllm`, `sglang` and `sglang-native`."""

from tailsieve.engines.kinds import sglang, vllm
from tailsieve.engines.kinds.kind import (
    DEFAULT_KIND,
    KINDS,
    Device,
    EngineKind,
    ServerHalf,
    ServerLaunch,
    SpecCounterNames,
    get_kind,
    kind_names,
    register_kind,
)

__all__ = ["DEFAULT_KIND", "KINDS", "Device", "EngineKind", "ServerHalf", "ServerLaunch", "SpecCounterNames",
           "get_kind", "kind_names", "register_kind", "sglang", "vllm"]
