"""`EngineKind`: one server flavour, both halves. The client half is its `EngineBackend` (request path, body,
abort, health paths, reply mapping, in-place weight reload: engines/transport/backends.py); the server half,
`ServerHalf`, is what a launcher needs to start a replica of it: the command line, the environment, each pool's
speculative flags, the health path, the speculative counter names on /metrics, the tokenizer flag of a weight
reload by restart, and how many GPUs a replica's flags ask for.

A flavour is one module: a `ServerHalf` subclass decorated with `@register_kind(NAME, backend=BackendClass)`
(`engines/kinds/vllm.py`, `engines/kinds/sglang.py`). The decorator registers the `EngineKind` in `KINDS` and the
backend in `BACKENDS` under the same name, so `Endpoint.kind` (the client) and `launch.kind` (the launcher) name
the same thing. Server halves are pure: frozen `ServerLaunch` values in, argument lists and environment out.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar, TypeVar

from tailsieve.engines.transport.backends import BACKENDS, EngineBackend, register_backend
from tailsieve.errors import ConfigError
from tailsieve.model.speculative import SpecConfig, SpecMethod
from tailsieve.registry import Registry

DEFAULT_KIND = "vllm"


class Device(StrEnum):
    """Where replicas run: pinned CPU cores (taskset + OpenMP binding) or GPUs (CUDA_VISIBLE_DEVICES)."""

    CPU = "cpu"
    GPU = "gpu"


@dataclass(frozen=True, slots=True)
class SpecCounterNames:
    """The Prometheus counters on a server's /metrics that count speculative drafts and accepted tokens."""

    drafts: str
    draft_tokens: str
    accepted: str
    per_position: str  # labelled `position=k`, k = 0..d−1
    generated: str


@dataclass(frozen=True, slots=True)
class ServerLaunch:
    """What one replica's server is started with (the launcher fills it in; a server half only reads it)."""

    model: str
    host: str
    port: str  # a string: a dry run on a Ray cluster shows FREE_PORT
    device: Device
    place: str | None  # cpu: taskset core list; gpu: CUDA_VISIBLE_DEVICES
    memory: float | None  # cpu: KV cache GiB; gpu: share of GPU memory
    served_model_name: str | None
    args: tuple[str, ...]  # flags for every replica
    pool_args: tuple[str, ...]  # the pool's extra flags (already inside `pool_flags`)
    pool_flags: tuple[str, ...]  # the pool's speculative flags, then its extra flags (`PoolEngine.flags()`)
    cpu_defaults: bool
    weight_reload: bool  # the server must accept in-place weight reloads
    cache_dir: str  # a scratch folder for the server's own caches


class ServerHalf(ABC):
    """The launch half of an engine kind. Subclasses set the class attributes and implement `command` and
    `spec_flags`; the other hooks have defaults."""

    health_path: ClassVar[str] = "/health"  # GET answers 200 once the server serves
    shown_env: ClassVar[tuple[str, ...]] = ("CUDA_VISIBLE", "HF_")  # prefixes a dry run prints
    spec_counters: ClassVar[SpecCounterNames | None] = None  # None: its /metrics counts no drafts
    tokenizer_flag: ClassVar[str] = "--tokenizer"  # keeps the first model's tokenizer on a reload by restart
    tensor_parallel_flags: ClassVar[tuple[str, ...]] = ()  # flags whose value is the GPUs per replica
    cpu_default_args: ClassVar[tuple[tuple[str, str | None], ...]] = ()  # added on cpu unless the args set them
    methods: ClassVar[frozenset[SpecMethod] | None] = None  # the speculative methods it runs (None: every one)
    needs_draft_model: ClassVar[frozenset[SpecMethod]] = frozenset()  # methods that need `speculative.model`
    own_keys: ClassVar[tuple[str, ...]] = ()  # speculative keys the spec table sets (refused in `speculative`)

    @abstractmethod
    def default_command(self) -> tuple[str, ...]:
        """The server command before its flags, when `launch.command` is empty."""

    @abstractmethod
    def command(self, launch: ServerLaunch, head: tuple[str, ...]) -> list[str]:
        """The whole command line after `head` (the command before the flags)."""

    def env(self, launch: ServerLaunch, environ: Mapping[str, str]) -> dict[str, str]:
        """Variables the server needs on top of `environ` (the launcher's own); none by default."""
        return {}

    @abstractmethod
    def spec_flags(self, spec: SpecConfig, extra: Mapping[str, Any]) -> tuple[str, ...]:
        """A pool's speculative decoding as server flags (() when the pool does not speculate)."""

    def check_pool(self, spec: SpecConfig, extra: Mapping[str, Any], kind: str) -> None:
        """Refuse (`ConfigError`, one line) a pool the server of engine kind `kind` cannot run: a method outside
        `methods`, a method of `needs_draft_model` without `speculative.model`, a key of `own_keys`."""
        if spec.enabled and self.methods is not None and spec.method not in self.methods:
            valid = ", ".join(sorted(m.value for m in self.methods))
            raise ConfigError(f"engine kind {kind} cannot speculate with {spec.method.value} (valid: {valid})")
        if spec.enabled and spec.method in self.needs_draft_model and "model" not in extra:
            raise ConfigError(f"speculative method {spec.method.value} needs a draft model: set "
                              "speculative.model (a folder or hub id) for this pool")
        bad = next((k for k in self.own_keys if k in extra), None)
        if bad is not None:
            raise ConfigError(f"speculative.{bad} comes from the spec table; do not repeat it")

    def check_memory(self, device: Device, memory: float) -> None:
        """Refuse a memory setting this server cannot express (`launch.memory`, given and finite; on gpu already a
        share in (0, 1]); by default any passes."""
        return None

    def cpu_defaults(self, launch: ServerLaunch) -> list[str]:
        """`cpu_default_args` not already set by the replica's flags (cpu only, when `cpu_defaults` is on)."""
        if launch.device is not Device.CPU or not launch.cpu_defaults:
            return []
        given = set(launch.args) | set(launch.pool_args)
        out: list[str] = []
        for flag, value in self.cpu_default_args:
            if flag not in given:
                out += [flag] if value is None else [flag, value]
        return out

    def gpus(self, args: tuple[str, ...]) -> int:
        """GPUs per replica: the value of the first tensor-parallel flag in `args` (`--tp 2` or `--tp=2`), else 1."""
        for k, a in enumerate(args):
            flag, eq, value = a.partition("=")
            if flag in self.tensor_parallel_flags:
                v = value if eq else (args[k + 1] if k + 1 < len(args) else "1")
                return max(1, int(v)) if v.isdigit() else 1
        return 1


@dataclass(frozen=True, slots=True)
class EngineKind:
    """One engine flavour: its name, client backend class and server half."""

    name: str
    backend: type[EngineBackend]
    server: ServerHalf


def _a_kind(obj: object) -> str | None:
    return None if isinstance(obj, EngineKind) else "not an EngineKind"


# the engine kinds (`tailsieve.registry.Registry`; plugins: `pkg.module:KIND`, entry-point group tailsieve.kinds)
KINDS: Registry[EngineKind] = Registry("engine kind", "tailsieve.kinds", check=_a_kind)
S = TypeVar("S", bound=ServerHalf)


def register_kind(name: str, *, backend: type[EngineBackend]) -> Callable[[type[S]], type[S]]:
    """Class decorator on a `ServerHalf`: register `EngineKind(name, backend, cls())` in `KINDS` and `backend` in
    `BACKENDS` under `name`; a name taken by another kind is the registries' one-line `DuplicateName`."""

    def deco(cls: type[S]) -> type[S]:
        old = KINDS.get(name)
        if old is not None and type(old.server) is cls and old.backend is backend:
            return cls  # the same kind again (a module imported twice): a no-op
        if BACKENDS.get(name) is not backend:  # first: a name another backend holds is refused before any kind moves
            register_backend(name)(backend)
        KINDS.add(name, EngineKind(name, backend, cls()))
        return cls

    return deco


def kind_names() -> list[str]:
    """Registered engine kinds (those a launcher can start), sorted."""
    return sorted(KINDS)


def get_kind(name: str) -> EngineKind:
    """The engine kind registered as `name`; an unknown name is a one-line `ConfigError` listing the valid ones."""
    return KINDS.resolve(str(name), kind_names())
