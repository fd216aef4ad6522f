"""The replica-launcher seam: `ReplicaLauncher`, what every launcher (local processes today, Ray actors next) does
for the step loop, and the registry that `tailsieve launch` and `rollout --launch` build launchers from.

A launcher owns R replicas of one `LaunchConfig`. Concerns, one required method each: `start()`, `stop()`,
`endpoints` (base URLs, replica 0 first), `healthy(i)`, and `_relaunch(indices)` (stop these replicas and start
them again with their slots' current flags, waiting for health). Everything about pools is shared here: the
initial pools come from the router's `pool_split`; `assign(tail_replicas)` makes exactly those replica ids the
tail pool and restarts only the replicas whose flags change; `pool_hook(plan)` is `assign(plan.tail_replicas)`,
the pool hook the step loop calls before each step. Hooks with defaults: `request_stop`, `failure`,
`drain_events`, `dry_run`.
"""

from __future__ import annotations

import abc
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar, Self, TypeVar

from tailsieve.engines.launch.config import LaunchConfig, PoolEngine
from tailsieve.errors import TailSieveError
from tailsieve.inputs import excerpt
from tailsieve.policy.router import pool_split
from tailsieve.policy.step import Pool, StepPlan
from tailsieve.redact import shown_args
from tailsieve.registry import Registry

DEFAULT_LAUNCHER = "local"


class LaunchError(TailSieveError):
    """A replica could not be started, restarted or stopped; the message names it and the server's error."""


@dataclass(slots=True, kw_only=True)
class ReplicaSlot:
    """A launcher's bookkeeping for one replica: its pool and flags, last start-up seconds and restart count."""

    index: int
    pool: Pool
    engine: PoolEngine
    boot_s: float = 0.0  # last start-up time (launch → /health → warm-up)
    restarts: int = 0

    def describe(self) -> dict[str, Any]:
        """JSON row for launch.json and tables (launchers add their own keys)."""
        return {"index": self.index, "pool": self.pool.value, "flags": list(self.engine.flags()),
                "boot_s": round(self.boot_s, 3), "restarts": self.restarts}


def initial_pools(config: LaunchConfig) -> tuple[Pool, ...]:
    """Each replica's pool at start-up: the router's split for `config.tail_replicas`."""
    tail, _ = pool_split(config.replicas, config.tail_replicas)
    return tuple(Pool.TAIL if i in tail else Pool.BULK for i in range(config.replicas))


class ReplicaLauncher(abc.ABC):
    """R replicas of one model with per-pool flags (see the module docstring); `with make_launcher(...) as la:`."""

    name: ClassVar[str] = ""  # set by @register_launcher

    def __init__(self, config: LaunchConfig, log_dir: Path) -> None:
        self.config = config
        self.log_dir = log_dir
        self.restart_s_total = 0.0

    # ---- required: one method per concern ----------------------------------------------------------------------
    @abc.abstractmethod
    def start(self) -> Self:
        """Start every replica and wait until all are healthy; on failure stop all and raise `LaunchError`."""

    @abc.abstractmethod
    def stop(self) -> None:
        """Stop every replica (idempotent; safe during a start-up or restart in another thread)."""

    @property
    @abc.abstractmethod
    def endpoints(self) -> list[str]:
        """Base URLs, replica 0 first (the order `rollout --endpoints` takes)."""

    @abc.abstractmethod
    def healthy(self, i: int) -> bool:
        """Replica i answers its health check now."""

    @property
    @abc.abstractmethod
    def slots(self) -> Sequence[ReplicaSlot]:
        """Every replica's bookkeeping, replica 0 first."""

    @abc.abstractmethod
    def _relaunch(self, indices: Sequence[int]) -> None:
        """Stop these replicas and start them again (in parallel, same places and ports) with their slots' current
        flags; return once all are healthy, or raise `LaunchError`."""

    # ---- hooks (defaults) ------------------------------------------------------------------------------------------
    def request_stop(self) -> None:
        """Make any wait for start-up give up (signal-safe: no waiting); `stop` follows. Default: nothing."""
        return

    def failure(self) -> str | None:
        """One line when the launcher can serve no more (every replica died and could not be restarted), None while
        some replica runs or is being restarted. Default: None."""
        return None

    def drain_events(self) -> list[str]:
        """Status lines since the last call (a replica died, is restarting, is back); each names the replica.
        Default: none."""
        return []

    def dry_run(self) -> list[str]:
        """Lines saying what `start` would run, starting nothing. Default: each replica's pool and URL."""
        return [f"# replica {s.index} ({s.pool.value}) {url}" for s, url in zip(self.slots, self.endpoints,
                                                                                strict=True)]

    # ---- shared --------------------------------------------------------------------------------------------------
    def health(self) -> list[bool]:
        """`healthy(i)` of every replica, replica 0 first."""
        return [self.healthy(i) for i in range(len(self.slots))]

    @property
    def pools(self) -> tuple[Pool, ...]:
        """Each replica's current pool."""
        return tuple(s.pool for s in self.slots)

    @property
    def tail_replicas(self) -> tuple[int, ...]:
        """The replica ids now in the tail pool."""
        return tuple(s.index for s in self.slots if s.pool is Pool.TAIL)

    @property
    def m(self) -> int:
        """Replicas currently in the tail pool."""
        return len(self.tail_replicas)

    def assign(self, tail_replicas: Sequence[int]) -> float:
        """Make exactly these replica ids the tail pool (the rest bulk), each with its pool's flags; restart only the
        replicas whose flags change. Returns the restart seconds (0.0 when none)."""
        r = len(self.slots)
        ids = list(tail_replicas)
        bad = [i for i in ids if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < r]
        if bad:
            raise LaunchError(f"tail replica {excerpt(bad[0])} is not a replica id in [0, {r - 1}]")
        if len(set(ids)) != len(ids):
            raise LaunchError(f"tail replicas repeat an id: {ids}")
        if len(ids) > max(r - 1, 0):
            raise LaunchError(f"tail pool of {len(ids)} replica(s) leaves no bulk replica (at most {max(r - 1, 0)} "
                              f"of {r})")
        pools = [Pool.TAIL if i in ids else Pool.BULK for i in range(r)]
        return self.configure(pools, [self.config.engine(p is Pool.TAIL) for p in pools])

    def pool_hook(self, plan: StepPlan) -> float:
        """The step loop's pool hook: `assign(plan.tail_replicas)` before the plan runs; returns restart seconds."""
        return self.assign(plan.tail_replicas)

    def configure(self, pools: Sequence[Pool], engines: Sequence[PoolEngine]) -> float:
        """Give replica i pool `pools[i]` and flags `engines[i]`, restarting (in parallel) only the replicas whose
        flags change; returns the wall seconds of the restarts (0.0 when none)."""
        slots = self.slots
        if len(pools) != len(slots) or len(engines) != len(slots):
            raise LaunchError(f"configure: need {len(slots)} pools and engines")
        moved = [s.index for s, e in zip(slots, engines, strict=True) if e.flags() != s.engine.flags()]
        for s, pool, e in zip(slots, pools, engines, strict=True):
            s.pool, s.engine = pool, e
        return self._timed_relaunch(moved)

    def restart(self, indices: Sequence[int], pools: Sequence[Pool] | None = None) -> float:
        """Restart these replicas now (in parallel), each into `pools[k]` (default: its current pool) with that
        pool's flags from the config, even when the flags do not change; returns the wall seconds."""
        r = len(self.slots)
        if any(not 0 <= i < r for i in indices) or len(set(indices)) != len(indices):
            raise LaunchError(f"restart: replica ids must be distinct and in [0, {r - 1}], got {list(indices)}")
        if pools is not None and len(pools) != len(indices):
            raise LaunchError(f"restart: {len(indices)} replica(s) but {len(pools)} pool(s)")
        for k, i in enumerate(indices):
            s = self.slots[i]
            s.pool = s.pool if pools is None else pools[k]
            s.engine = self.config.engine(s.pool is Pool.TAIL)
        return self._timed_relaunch(indices)

    def reload(self, model: str, indices: Sequence[int] | None = None) -> float:
        """Serve the checkpoint `model` from now on: restart these replicas (default: all) on it, keeping the served
        model name and the first model's tokenizer (a trainer's checkpoint may hold weights only), and start any later
        restart on it too; the weight-update fallback when a server cannot reload in place. Returns the wall seconds
        of the restarts."""
        c = self.config
        flag = c.engine_kind.server.tokenizer_flag
        args = c.args if flag in c.args else (*c.args, flag, c.model)
        self.config = replace(c, model=str(model), served_model_name=c.served_model_name or c.model, args=args)
        return self.restart(list(range(len(self.slots))) if indices is None else indices)

    def _timed_relaunch(self, indices: Sequence[int]) -> float:
        if not indices:
            return 0.0
        t0 = time.monotonic()
        for i in indices:
            self.slots[i].restarts += 1
        self._relaunch(indices)
        spent = time.monotonic() - t0
        self.restart_s_total += spent
        return spent

    def describe(self) -> dict[str, Any]:
        """JSON for launch.json and reports: the launcher, the config's essentials and every replica."""
        c = self.config
        return {"launcher": self.name, "model": c.model, "device": c.device.value,
                "replicas": [s.describe() for s in self.slots], "endpoints": self.endpoints,
                "tail_replicas": self.m, "tail_ids": list(self.tail_replicas), "memory": c.memory,
                "tail": {"speculative_config": c.tail.speculative_config(), "args": shown_args(c.tail.args)},
                "bulk": {"speculative_config": c.bulk.speculative_config(), "args": shown_args(c.bulk.args)},
                "restart_free": c.restart_free}

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _launcher_class(obj: object) -> str | None:
    return None if isinstance(obj, type) and issubclass(obj, ReplicaLauncher) else "not a subclass of ReplicaLauncher"


def _named(name: str, cls: type[ReplicaLauncher]) -> None:
    cls.name = name


L = TypeVar("L", bound=ReplicaLauncher)
# replica launchers (`tailsieve.registry.Registry`; plugins: `pkg.module:Class`, group tailsieve.launchers)
LAUNCHERS: Registry[type[ReplicaLauncher]] = Registry("launcher", "tailsieve.launchers", check=_launcher_class,
                                                      on_add=_named)


def register_launcher(name: str) -> Callable[[type[L]], type[L]]:
    """Class decorator: make a `ReplicaLauncher` subclass buildable by `make_launcher(name, ...)` (a name taken by
    another class is refused)."""
    return LAUNCHERS.register(name)


def launcher_for(config: LaunchConfig) -> str:
    """The launcher a config asks for: `ray` when it names a Ray cluster (`launch.ray`, `--ray`), else the default."""
    return "ray" if config.ray else DEFAULT_LAUNCHER


def make_launcher(name: str, config: LaunchConfig, log_dir: Path) -> ReplicaLauncher:
    """The launcher registered as `name` for `config`, logging under `log_dir` (not started)."""
    return LAUNCHERS.resolve(name)(config, log_dir)
