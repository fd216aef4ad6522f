"""Weight versions: every replica serves the trainer's new weights before the next step (the on-policy contract of
§2: every consumed response is generated from scratch under the current weights; a carried tail group is
regenerated, never resumed).

`WeightSync.update(path | push)` moves every replica to version v+1: in place through the engine's own update path
(the backend's `update_weights`: vLLM's development-mode `reload_weights` RPC, SGLang's `/update_weights_from_disk`),
else by restarting it on the checkpoint (a launcher's `reload`), or through a framework's own `push` hook. A replica
that could not be updated (down, or every path failed) is *stale*: the executor never picks it, and `refresh()`
updates it once it answers again. The executor stamps every request with the version current at dispatch.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from tailsieve.engines.transport.health import Replicas
from tailsieve.engines.transport.types import Endpoint, EngineError
from tailsieve.errors import ConfigError, TailSieveError

__all__ = ["ReloadHook", "StaleBatch", "UpdateMethod", "WeightPush", "WeightSync", "WeightUpdate"]

WeightPush = Callable[[int, Endpoint, int], Awaitable[None]]  # (replica, endpoint, version): a framework's push
ReloadHook = Callable[[str, Sequence[int]], float]  # (checkpoint, replica ids) → restart seconds (launcher.reload)


class StaleBatch(EngineError):
    """A step's consumed samples predate the weights served when it ended (`update_weights` ran during the step):
    the batch is refused and the run's state does not move, so the next `step()` runs the same groups again."""


class UpdateMethod(StrEnum):
    """How one replica got (or did not get) the new weights."""

    IN_PLACE = "in-place"
    RESTART = "restart"
    PUSH = "push"
    STALE = "stale"  # not updated: excluded until `refresh` updates it


@dataclass(frozen=True, slots=True)
class WeightUpdate:
    """One update: the new version, its checkpoint, per replica how it was applied, wall seconds, failures."""

    version: int
    path: str | None
    methods: tuple[UpdateMethod, ...]
    seconds: float
    errors: tuple[str, ...] = ()

    @property
    def updated(self) -> int:
        """Replicas now serving `version`."""
        return sum(m is not UpdateMethod.STALE for m in self.methods)


class WeightSync:
    """The run's weight version and which replicas serve it (stale ones live in `replicas.stale`)."""

    def __init__(self, replicas: Replicas, reload: ReloadHook | None = None, version: int = 0) -> None:
        self.replicas = replicas
        self.reload = reload
        self.version = version
        self.path: str | None = None
        self.push: WeightPush | None = None

    async def update(self, path: str | Path | None = None, *, version: int | None = None,
                     push: WeightPush | None = None) -> WeightUpdate:
        """Serve version `version` (default: current + 1) from the checkpoint folder `path`, or through `push`, on
        every replica; raises `EngineError` when no replica could be updated (the version is then unchanged)."""
        v = self.version + 1 if version is None else int(version)
        if v <= self.version:
            raise ConfigError(f"weight version must increase: {v} after {self.version}")
        if (path is None) == (push is None):
            raise ConfigError("update_weights needs a checkpoint folder or a push hook (exactly one)")
        if path is not None and not Path(path).is_dir():
            raise ConfigError(f"weights folder {path} does not exist")
        t0 = time.perf_counter()
        ids = list(range(len(self.replicas)))
        methods, errors = await self._apply(ids, None if path is None else str(Path(path).resolve()), v, push)
        if all(m is UpdateMethod.STALE for m in methods):
            raise EngineError(f"weight update to version {v} failed on every replica: "
                              f"{errors[0] if errors else 'none is up'}")
        self.version, self.path, self.push = v, None if path is None else str(Path(path).resolve()), push
        self.replicas.stale = {i for i, m in zip(ids, methods, strict=True) if m is UpdateMethod.STALE}
        return WeightUpdate(v, self.path, tuple(methods), time.perf_counter() - t0, tuple(errors))

    async def refresh(self) -> list[int]:
        """Update the stale replicas that answer again to the current version; the ids now fresh."""
        if not self.replicas.stale or (self.path is None and self.push is None):
            return []
        ids = sorted(self.replicas.stale)
        alive = await asyncio.gather(*(self.replicas.client.health(self.replicas.endpoints[i]) for i in ids))
        ids = [i for i, ok in zip(ids, alive, strict=True) if ok]
        methods, _ = await self._apply(ids, self.path, self.version, self.push, probe=False)
        fresh = [i for i, m in zip(ids, methods, strict=True) if m is not UpdateMethod.STALE]
        self.replicas.stale -= set(fresh)
        return fresh

    async def _apply(self, ids: list[int], path: str | None, v: int, push: WeightPush | None,
                     probe: bool = True) -> tuple[list[UpdateMethod], list[str]]:
        """Update `ids` concurrently (push, or in place); failures fall back to one launcher restart."""
        up = [i for i in ids if not probe or self.replicas.up[i]]
        out = {i: UpdateMethod.STALE for i in ids}
        errors = [f"{self.replicas.endpoints[i].url}: down" for i in ids if i not in up]
        results = await asyncio.gather(*(self._one(i, path, v, push) for i in up), return_exceptions=True)
        failed: list[int] = []
        for i, res in zip(up, results, strict=True):
            if isinstance(res, UpdateMethod):
                out[i] = res
            elif isinstance(res, TailSieveError | OSError):
                errors.append(str(res).splitlines()[0][:300])
                failed.append(i)
            else:
                raise res
        if failed and path is not None and self.reload is not None and push is None:
            try:
                await asyncio.to_thread(self.reload, path, failed)
                out |= dict.fromkeys(failed, UpdateMethod.RESTART)
            except TailSieveError as exc:
                errors.append(f"restart fallback: {str(exc).splitlines()[0][:300]}")
        return [out[i] for i in ids], errors

    async def _one(self, i: int, path: str | None, v: int, push: WeightPush | None) -> UpdateMethod:
        ep = self.replicas.endpoints[i]
        if push is not None:
            await push(i, ep, v)
            return UpdateMethod.PUSH
        assert path is not None
        client = self.replicas.client
        await client.backend(ep).update_weights(client.session, ep, path, v)
        return UpdateMethod.IN_PLACE
