"""What `tailsieve launch` starts: R local replicas of one engine kind (`launch.kind`: vllm, sglang, … from
`engines/kinds/`), where each runs (CPU cores or GPU ids), its port and memory share, the model, and each pool's
server flags (its speculative decoding, as the kind's server half spells it, e.g. vLLM's `--speculative-config`).

Read from the `[launch]`, `[launch.tail]` and `[launch.bulk]` tables of the config file whose `[spec.tail]` and
`[spec.bulk]` tables hold the pools' speculative decoding (docs/launch.md).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tailsieve.engines.kinds.kind import DEFAULT_KIND, Device, EngineKind, get_kind
from tailsieve.engines.kinds.vllm import CPU_DEFAULT_ARGS, NEEDS_DRAFT_MODEL, VLLM_SERVER
from tailsieve.engines.launch.bounds import BOUNDS, CPU_MEMORY, check_bounds, check_cores, check_no_nul
from tailsieve.errors import ConfigError
from tailsieve.inputs import MAX_REPLICAS, excerpt
from tailsieve.model.spec_parse import load_config_file, read_config
from tailsieve.model.speculative import SpecConfig

__all__ = ["CPU_DEFAULT_ARGS", "LAUNCH_KEYS", "NEEDS_DRAFT_MODEL", "POOL_KEYS", "VLLM_SERVER", "Device",
           "LaunchConfig", "PoolEngine", "check_model", "kind_named", "launch_from_mapping", "load_launch_config",
           "pool_engine"]
_CORES = re.compile(r"\d+(-\d+(:\d+)?)?(,\d+(-\d+(:\d+)?)?)*")
_GPUS = re.compile(r"[A-Za-z0-9:_-]+(,[A-Za-z0-9:_-]+)*")
_HOST = re.compile(r"[A-Za-z0-9._:\[\]-]+")


def kind_named(name: Any, where: str, *, flag: bool = False) -> EngineKind:
    """The engine kind `[where] kind = name` (or the flag `where`) names; else one line naming the key (or flag) and
    the valid kinds. A registered name, a plugin `pkg.module:KIND` or an entry point (`KINDS.resolve`)."""
    try:
        return get_kind(name if isinstance(name, str) else repr(name))
    except ConfigError as exc:
        raise ConfigError(f"{where if flag else f'{where}.kind'}: {exc}") from None


@dataclass(frozen=True, slots=True)
class PoolEngine:
    """One pool's server flags on one engine kind: speculative decoding (+ extra speculative keys, e.g. vLLM's
    `speculative_config` keys) and extra CLI flags. The kind's server half checks the pool and spells its flags."""

    spec: SpecConfig = field(default_factory=SpecConfig)
    speculative: tuple[tuple[str, Any], ...] = ()  # the kind's extra speculative keys, e.g. prompt_lookup_max
    args: tuple[str, ...] = ()
    kind: str = DEFAULT_KIND  # the engine kind (set by `LaunchConfig` to its own)

    def __post_init__(self) -> None:
        keys = dict(self.speculative)
        if keys and not self.spec.enabled:
            raise ConfigError(f"speculative options {', '.join(sorted(keys))} given for a pool without speculation")
        get_kind(self.kind).server.check_pool(self.spec, keys, self.kind)

    def speculative_config(self) -> dict[str, Any] | None:
        """The pool's speculation as one object: `method`, `num_speculative_tokens` and the extra keys (None when the
        pool does not speculate); vLLM takes it as is."""
        base = self.spec.vllm_config()
        return None if base is None else base | dict(self.speculative)

    def flags(self) -> tuple[str, ...]:
        """The pool's server flags; two pools with equal flags share a running server (no restart)."""
        return (*get_kind(self.kind).server.spec_flags(self.spec, dict(self.speculative)), *self.args)

    @property
    def label(self) -> str:
        """Short description for tables."""
        return self.spec.label + (f" +{len(self.args)} flags" if self.args else "")


@dataclass(frozen=True, slots=True)
class LaunchConfig:
    """R replicas of one model on one engine kind: placement, ports, memory share, the pools' flags and process
    handling."""

    model: str
    replicas: int = 2
    device: Device = Device.CPU
    places: tuple[str, ...] = ()  # per replica: taskset core list (cpu) or CUDA_VISIBLE_DEVICES (gpu)
    ports: tuple[int, ...] = ()  # per replica; empty: base_port + i, or free ports
    base_port: int | None = None
    memory: float | None = None  # cpu: KV cache GiB per replica (integer); gpu: --gpu-memory-utilization share
    served_model_name: str | None = None
    tail_replicas: int = 0  # m at launch: the last m replicas start with the tail pool's flags
    tail: PoolEngine = field(default_factory=PoolEngine)
    bulk: PoolEngine = field(default_factory=PoolEngine)
    args: tuple[str, ...] = ()  # flags for every replica
    env: tuple[tuple[str, str], ...] = ()  # extra environment for every replica
    command: tuple[str, ...] = ()  # the server command before its flags; empty: the kind's (vLLM: VLLM_SERVER)
    cpu_defaults: bool = True  # add the kind's CPU defaults (vLLM: CPU_DEFAULT_ARGS) unless `args` already sets them
    host: str = "127.0.0.1"
    startup_timeout_s: float = 600.0
    grace_s: float = 20.0  # SIGTERM → SIGKILL
    warmup_tokens: int = 16  # one generation of this many tokens after /health, counted in the start-up (0: none)
    weight_reload: bool = False  # the server accepts in-place weight reloads (vLLM: development-mode endpoints)
    restart_retries: int = 3  # a replica that dies while serving is restarted up to this many times in a row
    restart_backoff_s: float = 1.0  # restart try 1 at once, try k ≥ 2 after restart_backoff_s · 2^(k−2) s (≤ 30 s)
    ray: str | None = None  # Ray cluster address (`auto` or HOST:PORT): replicas run as Ray actors (docs/multinode.md)
    kind: str = DEFAULT_KIND  # the engine kind (engines/kinds/): its server command, environment and pool flags

    def __post_init__(self) -> None:
        server = kind_named(self.kind, "launch").server
        for pool in ("tail", "bulk"):
            engine = getattr(self, pool)
            if engine.kind != self.kind:
                try:
                    object.__setattr__(self, pool, replace(engine, kind=self.kind))
                except ConfigError as exc:
                    raise ConfigError(f"launch.{pool}: {exc}") from None
        check_bounds({k: getattr(self, k) for k in BOUNDS})
        check_no_nul(self._texts())
        r = self.replicas
        if isinstance(r, bool) or not isinstance(r, int) or not 1 <= r <= MAX_REPLICAS:
            raise ConfigError(f"launch.replicas must be an integer in 1..{MAX_REPLICAS}, got {excerpt(r)}")
        if not isinstance(self.device, Device):
            raise ConfigError(f"launch.device must be cpu or gpu, got {excerpt(self.device)}")
        if not 0 <= self.tail_replicas <= max(r - 1, 0):
            raise ConfigError(f"launch.tail_replicas must lie in [0, {max(r - 1, 0)}], got "
                              f"{excerpt(self.tail_replicas)}")
        what = "cores" if self.device is Device.CPU else "gpus"
        if self.places and len(self.places) != r:
            raise ConfigError(f"launch.{what} lists {len(self.places)} entries for {r} replicas")
        if any(not p.strip() for p in self.places):
            raise ConfigError(f"launch.{what}: empty entry")
        pattern = _CORES if self.device is Device.CPU else _GPUS
        bad = next((p for p in self.places if not pattern.fullmatch(p.strip())), None)
        if bad is not None:
            form = ("a taskset core list like 0, 0-3 or 0,2,4" if self.device is Device.CPU
                    else "CUDA_VISIBLE_DEVICES ids like 0 or 0,1")
            raise ConfigError(f"launch.{what}: {excerpt(bad)} is not {form}")
        if self.device is Device.CPU:
            for p in self.places:
                check_cores(p)
        if self.ray is not None and (not isinstance(self.ray, str) or not _HOST.fullmatch(self.ray)):
            raise ConfigError(f"launch.ray must be auto or a Ray cluster address HOST:PORT, got {excerpt(self.ray)}")
        if not isinstance(self.host, str) or not _HOST.fullmatch(self.host):
            raise ConfigError(f"launch.host must be a host name or IP address, got {excerpt(self.host)}")
        if self.ports:
            if len(self.ports) != r:
                raise ConfigError(f"launch.ports lists {len(self.ports)} ports for {r} replicas")
            if len(set(self.ports)) != r:
                raise ConfigError(f"launch.ports repeats a port: {list(self.ports)}")
            if self.base_port is not None:
                raise ConfigError("give launch.ports or launch.base_port, not both")
        for p in (*self.ports, *(() if self.base_port is None else (self.base_port, self.base_port + r - 1))):
            if not 1 <= p <= 65535:
                raise ConfigError(f"launch port {p} is outside 1..65535")
        if self.memory is not None:
            if self.device is Device.CPU:
                CPU_MEMORY.check(self.memory, "launch.memory on cpu")
            elif isinstance(self.memory, bool) or not isinstance(self.memory, int | float) or not 0 < self.memory <= 1:
                raise ConfigError("launch.memory on gpu is a share of GPU memory in (0, 1], got "
                                  f"{excerpt(self.memory)}")
            server.check_memory(self.device, self.memory)

    def _texts(self) -> list[tuple[str, Any]]:
        """Every text that becomes part of a server's argv or environment, with its key (for the NUL check)."""
        out: list[tuple[str, Any]] = [("launch.model", self.model),
                                      ("launch.served_model_name", self.served_model_name)]
        for key, seq in (("args", self.args), ("command", self.command), ("tail.args", self.tail.args),
                         ("bulk.args", self.bulk.args)):
            out += [(f"launch.{key}[{i}]", v) for i, v in enumerate(seq)]
        for pool in ("tail", "bulk"):
            out += [(f"launch.{pool}.speculative.{k}", v) for k, v in getattr(self, pool).speculative]
        out += [(f"launch.env key {excerpt(k)}", k) for k, _ in self.env]
        return out + [(f"launch.env.{k}", v) for k, v in self.env]

    def place(self, i: int) -> str | None:
        """Replica i's cores (cpu) or GPU ids (gpu); default: core i mod the core count, or GPU i."""
        if self.places:
            return self.places[i]
        if self.device is Device.CPU:
            return str(i % (os.cpu_count() or 1)) if self.replicas > 1 else None
        return str(i)

    @property
    def engine_kind(self) -> EngineKind:
        """The engine kind the replicas run (its client backend and server half)."""
        return get_kind(self.kind)

    def engine(self, tail: bool) -> PoolEngine:
        """The tail or the bulk pool's flags."""
        return self.tail if tail else self.bulk

    @property
    def restart_free(self) -> bool:
        """True when both pools run identical servers (moving a replica never restarts it)."""
        return self.tail.flags() == self.bulk.flags()


def check_model(model: str) -> None:
    """A local model folder must exist and hold config.json; hub ids (`name`, `org/name`) pass (the server
    resolves them)."""
    path = Path(model).expanduser()
    if path.exists():
        if not path.is_dir() or not (path / "config.json").is_file():
            raise ConfigError(f"model path {model} is not a model folder (no config.json)")
        return
    looks_local = model.startswith(("/", ".", "~")) or model.count("/") > 1 or "\\" in model
    if looks_local:
        raise ConfigError(f"model path {model} does not exist")


def _strs(v: Any, where: str) -> tuple[str, ...]:
    if isinstance(v, str) or not isinstance(v, list) or not all(isinstance(x, str | int) for x in v):
        raise ConfigError(f"{where} must be a list of strings, got {excerpt(v)}")
    return tuple(str(x) for x in v)


POOL_KEYS = ("speculative", "args")
LAUNCH_KEYS = ("model", "replicas", "device", "cores", "gpus", "ports", "base_port", "memory", "served_model_name",
               "tail_replicas", "args", "env", "command", "cpu_defaults", "host", "startup_timeout_s", "grace_s",
               "warmup_tokens", "weight_reload", "restart_retries", "restart_backoff_s", "ray", "kind", "tail", "bulk")


def pool_engine(spec: SpecConfig, obj: Any, where: str, kind: str = DEFAULT_KIND) -> PoolEngine:
    """A `PoolEngine` from a `[launch.tail]`/`[launch.bulk]` table."""
    if not isinstance(obj, dict):
        raise ConfigError(f"{where} must be a table with keys {', '.join(POOL_KEYS)}")
    unknown = sorted(set(obj) - set(POOL_KEYS))
    if unknown:
        raise ConfigError(f"unknown key {where}.{unknown[0]} (valid: {', '.join(POOL_KEYS)})")
    sp = obj.get("speculative", {})
    if not isinstance(sp, dict):
        raise ConfigError(f"{where}.speculative must be a table of the engine's speculative keys, got {excerpt(sp)}")
    try:
        return PoolEngine(spec, tuple(sorted(sp.items())), _strs(obj.get("args", []), f"{where}.args"), kind)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def launch_from_mapping(obj: Any, tail: SpecConfig, bulk: SpecConfig, where: str = "launch") -> LaunchConfig:
    """A `LaunchConfig` from the `[launch]` table, with the pools' speculative configurations."""
    if not isinstance(obj, dict):
        raise ConfigError(f"{where} must be a table")
    unknown = sorted(set(obj) - set(LAUNCH_KEYS))
    if unknown:
        raise ConfigError(f"unknown key {where}.{unknown[0]} (valid: {', '.join(LAUNCH_KEYS)})")
    if "model" not in obj or not isinstance(obj["model"], str) or not obj["model"]:
        raise ConfigError(f"{where}.model (the model folder or hub id) is required")
    try:
        device = Device(str(obj.get("device", "cpu")).lower())
    except ValueError:
        raise ConfigError(f"{where}.device must be cpu or gpu, got {excerpt(obj.get('device'))}") from None
    wrong = "gpus" if device is Device.CPU else "cores"
    if wrong in obj:
        raise ConfigError(f"{where}.{wrong} does not apply to device {device.value}")
    places = _strs(obj.get("cores" if device is Device.CPU else "gpus", []), f"{where}.places")
    env = obj.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(v, str | int | float) for v in env.values()):
        raise ConfigError(f"{where}.env must be a table of strings")
    bad_env = next((k for k in env if not k or "=" in k or "\0" in k), None)
    if bad_env is not None:
        raise ConfigError(f"{where}.env: {excerpt(bad_env)} is not an environment variable name")
    kw: dict[str, Any] = {}
    for key, typ in (("replicas", int), ("base_port", int), ("memory", float), ("served_model_name", str),
                     ("tail_replicas", int), ("cpu_defaults", bool), ("host", str), ("startup_timeout_s", float),
                     ("grace_s", float), ("warmup_tokens", int), ("weight_reload", bool),
                     ("restart_retries", int), ("restart_backoff_s", float), ("ray", str), ("kind", str)):
        if key in obj:
            v = obj[key]
            ok = isinstance(v, typ) if typ is not float else isinstance(v, int | float) and not isinstance(v, bool)
            if key not in BOUNDS and (not ok or (typ is int and isinstance(v, bool))):  # bounds check their own
                raise ConfigError(f"{where}.{key} must be {typ.__name__}, got {excerpt(v)}")
            kw[key] = v
    ports = obj.get("ports", [])
    if not isinstance(ports, list) or not all(isinstance(p, int) and not isinstance(p, bool) for p in ports):
        raise ConfigError(f"{where}.ports must be a list of integers, got {excerpt(ports)}")
    kind = str(kw.get("kind", DEFAULT_KIND))
    kind_named(kind, where)  # a plugin `pkg.module:KIND` stays named as written (its object may name itself else)
    return LaunchConfig(
        model=obj["model"], device=device, places=places, ports=tuple(ports),
        tail=pool_engine(tail, obj.get("tail", {}), f"{where}.tail", kind),
        bulk=pool_engine(bulk, obj.get("bulk", {}), f"{where}.bulk", kind),
        args=_strs(obj.get("args", []), f"{where}.args"), env=tuple((str(k), str(v)) for k, v in env.items()),
        command=_strs(obj.get("command", []), f"{where}.command"), **kw)


def load_launch_config(path: Path) -> LaunchConfig:
    """The `[launch]` tables of a config file (TOML, or JSON by suffix) with its `[spec.*]` pools."""
    spec = load_config_file(path)
    doc = read_config(path)
    if "launch" not in doc:
        raise ConfigError(f"config {path}: no [launch] table (docs/launch.md)")
    try:
        return launch_from_mapping(doc["launch"], spec.tail, spec.bulk)
    except ConfigError as exc:
        raise ConfigError(f"config {path}: {exc}") from None
