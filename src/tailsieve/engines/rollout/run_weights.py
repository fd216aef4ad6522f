"""The weight version a `Rollout`'s replicas serve and the rule that no step consumes older samples: 0 at the start,
+1 per `update_weights` (or the version a framework names), saved with the run's state. Before `open` it is a
number; `attach` hands it to a `WeightSync` over the opened replicas (`engines/rollout/weight_sync.py`: in-place
reload, the restart fallback, a framework's push, stale replicas) and stamps it on the executor, whose replicas must
then serve it (a replica reporting another version is made stale and its work moves); a resumed run verifies that
the servers really serve the saved version. Before each step the stale replicas are updated again, and a batch with
a consumed sample older than the step's weights is refused (`StaleBatch`) before the run's state moves."""

from __future__ import annotations

from pathlib import Path

from tailsieve.engines.rollout.batch import Batch
from tailsieve.engines.rollout.engine_executor import EngineExecutor
from tailsieve.engines.rollout.weight_sync import (
    ReloadHook,
    StaleBatch,
    VersionCheck,
    WeightPush,
    WeightSync,
    WeightUpdate,
)
from tailsieve.engines.transport.health import Replicas
from tailsieve.errors import ConfigError

__all__ = ["RunWeights", "refuse_stale"]


def refuse_stale(batch: Batch) -> None:
    """StaleBatch when a consumed sample predates the weights (refused before the state moves: the next step runs
    these groups again)."""
    if batch.stale_samples:
        why = (f"{batch.served_stale} were served under another version than the run's (a replica's weights "
               "changed outside update_weights)" if batch.served_stale else "update_weights ran during the step")
        raise StaleBatch(f"step {batch.step}: {batch.stale_samples} consumed sample(s) predate weight version "
                         f"{batch.weight_version} ({why}); the step was not consumed, run it again")


class RunWeights:
    """The run's weight version, and its `WeightSync` once the replicas are open (see the module docstring)."""

    def __init__(self, reload: ReloadHook | None = None, version: int = 0) -> None:
        self.reload = reload  # restart-on-checkpoint fallback of `update` (a launcher's `reload`)
        self.sync: WeightSync | None = None  # set by `attach`
        self._version = version

    @property
    def version(self) -> int:
        """The weights the replicas serve: 0 at the start, +1 per update (saved with the state)."""
        return self.sync.version if self.sync is not None else self._version

    @property
    def check(self) -> VersionCheck | None:
        """What the replicas last reported serving (`WeightSync.verify`: at `attach` of a resumed run); None before."""
        return None if self.sync is None else self.sync.last_check

    def restore(self, version: int) -> None:
        """Continue at a saved version."""
        self._version = version
        if self.sync is not None:
            self.sync.version = version

    async def attach(self, replicas: Replicas, executor: EngineExecutor) -> WeightSync:
        """Sync the opened replicas: the executor stamps the version on every sample and excludes a replica whose
        samples report another; a resumed run (version > 0) verifies what the servers serve."""
        self.sync = WeightSync(replicas, self.reload, self._version)
        executor.weight_version = self._version
        executor.exclude_other_versions = True  # the servers' versions are the run's
        if self._version > 0:
            await self.sync.verify()
        return self.sync

    async def update(self, executor: EngineExecutor | None, path: str | Path | None = None, *,
                     version: int | None = None, push: WeightPush | None = None) -> WeightUpdate:
        """Make every replica serve new weights before the next step (`WeightSync.update`); every later sample
        carries the new version. ConfigError before `attach`."""
        if self.sync is None or executor is None:
            raise ConfigError("Rollout is not open: use `async with Rollout(...) as r`")
        done = await self.sync.update(path, version=version, push=push)
        self._version = executor.weight_version = done.version
        return done

    async def before_step(self, *, require_fresh: bool = True) -> None:
        """Update the stale replicas again; with `require_fresh`, refuse to step while none serves the version."""
        if self.sync is not None:
            await self.sync.refresh()
            if require_fresh:
                self.sync.require_fresh()
