"""Weight versions: every replica serves the trainer's new weights before the next step (the on-policy contract of
§2: every consumed response is generated from scratch under the current weights; a carried tail group is
regenerated, never resumed).

`WeightSync.update(path | push)` moves every replica to version v+1: in place through the engine's own update path
(the backend's `update_weights`: vLLM's development-mode `reload_weights` RPC, SGLang's `/update_weights_from_disk`),
else by restarting it on the checkpoint (a launcher's `reload`), or through a framework's own `push` hook. A replica
that could not be updated (down, or every path failed) is *stale*: the executor never picks it, and `refresh()`
updates it once it answers again. The executor stamps every request with the version current at dispatch.

The version is not only a client-side counter: after every update (and on `verify()`, which `Rollout` runs when
it resumes a saved state) each replica is asked which weight version it serves (the backend's `served_version`:
vLLM's `GET /weight_info`, SGLang's `GET /model_info`), and one that reports another version than the run's is
stale too. Version 0 (the weights the servers started with) is never checked; a server that does not report a
version (no such endpoint: 404, or an answer without `weight_version`) cannot be checked and is trusted. A replica
whose version cannot be read for any other reason (a timeout, an error status, a malformed or oversized answer) is
*unverified*: stale until a later read (`refresh()`, before each step) answers the run's version. A replica moved by
a restart or a framework's push is labelled with the version first (`tag_version`), so for those the read-back
catches a restart that lost the label, not weights the push did not deliver. A replica whose samples carry
another version than they were sent under (SGLang's `meta_info.weight_version`) is made stale by the executor
(`Replicas.mark_stale`) and updated again by `refresh()`.
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
from tailsieve.inputs import excerpt

__all__ = ["ReloadHook", "StaleBatch", "StaleReplicas", "Unverified", "UpdateMethod", "VersionCheck", "WeightPush",
           "WeightSync", "WeightUpdate"]

WeightPush = Callable[[int, Endpoint, int], Awaitable[None]]  # (replica, endpoint, version): a framework's push
ReloadHook = Callable[[str, Sequence[int]], float]  # (checkpoint, replica ids) → restart seconds (launcher.reload)


class StaleBatch(EngineError):
    """A step's consumed samples predate the weights served when it ended (`update_weights` ran during the step):
    the batch is refused and the run's state does not move, so the next `step()` runs the same groups again."""


class StaleReplicas(EngineError):
    """No replica serves the run's weight version (e.g. a state saved at version 5 restored onto servers that
    never received those weights): nothing can be generated until `update_weights` moves them."""


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
    reported: tuple[str | None, ...] = ()  # per replica, the version it reports after the update (None: not told)

    @property
    def updated(self) -> int:
        """Replicas now serving `version`."""
        return sum(m is not UpdateMethod.STALE for m in self.methods)


@dataclass(frozen=True, slots=True)
class VersionCheck:
    """What each replica reports serving, against the run's version (`WeightSync.verify`)."""

    version: int
    reported: tuple[str | None, ...]  # per replica; None where it does not say, is down, was not asked or failed
    stale: tuple[int, ...]  # replicas reporting another version, or whose version could not be read: excluded
    errors: tuple[str, ...] = ()  # one line per replica whose version could not be read (unverified)


def disagrees(reported: str | None, version: int) -> bool:
    """Whether a reported version contradicts the run's (version 0 and unreported versions never do)."""
    return version > 0 and reported is not None and reported != str(version)


@dataclass(frozen=True, slots=True)
class Unverified:
    """A replica's version could not be read (anything but "does not report"): the one-line reason."""

    error: str


Reported = str | None | Unverified  # what a replica's read-back gives


def _said(r: Reported) -> str | None:
    """What a replica said its version is (None: nothing, or it could not be read)."""
    return r if isinstance(r, str) else None


class WeightSync:
    """The run's weight version and which replicas serve it (stale ones live in `replicas.stale`)."""

    def __init__(self, replicas: Replicas, reload: ReloadHook | None = None, version: int = 0) -> None:
        self.replicas = replicas
        self.reload = reload
        self.version = version
        self.path: str | None = None
        self.push: WeightPush | None = None
        self.last_check: VersionCheck | None = None  # the latest `verify`
        self.unverified: set[int] = set()  # stale only because their version could not be read: read again

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
        reported = await self._confirm(ids, methods, errors, v)
        if all(m is UpdateMethod.STALE for m in methods):
            raise EngineError(f"weight update to version {v} failed on every replica: "
                              f"{errors[0] if errors else 'none is up'}")
        self.version, self.path, self.push = v, None if path is None else str(Path(path).resolve()), push
        self.replicas.stale = {i for i, m in zip(ids, methods, strict=True) if m is UpdateMethod.STALE}
        self.unverified = {i for i, r in zip(ids, reported, strict=True) if isinstance(r, Unverified)}
        return WeightUpdate(v, self.path, tuple(methods), time.perf_counter() - t0, tuple(errors),
                            tuple(_said(r) for r in reported))

    async def verify(self) -> VersionCheck:
        """Ask every replica that is up which version it serves: one that reports another version than the run's,
        or whose version cannot be read (at a version > 0), becomes stale; a stale one that reports the run's
        version is usable again."""
        ids = [i for i in range(len(self.replicas)) if self.replicas.up[i]]
        found = dict(zip(ids, await asyncio.gather(*(self._reported(i) for i in ids)), strict=True))
        failed = {i: f"{self.replicas.endpoints[i].url}: weight version {self.version} not verified: {r.error}"[:400]
                  for i, r in found.items() if isinstance(r, Unverified) and self.version > 0}
        bad = {i for i, r in found.items() if isinstance(r, str) and disagrees(r, self.version)} | set(failed)
        good = {i for i, r in found.items() if self.version > 0 and r == str(self.version)}
        self.replicas.stale = (self.replicas.stale - good) | bad
        self.unverified = (self.unverified - good - bad) | set(failed)
        self.last_check = VersionCheck(self.version, tuple(_said(found.get(i)) for i in range(len(self.replicas))),
                                       tuple(sorted(bad)), tuple(failed[i] for i in sorted(failed)))
        return self.last_check

    def require_fresh(self) -> None:
        """A one-line `StaleReplicas` when every replica that is up serves other weights than the run's."""
        up = [i for i, u in enumerate(self.replicas.up) if u]
        if not up or self.replicas.healthy():
            return
        seen = self.last_check.reported if self.last_check is not None else (None,) * len(self.replicas)
        said = ", ".join(f"{self.replicas.endpoints[i].url} " + (f"reports {excerpt(seen[i])}" if seen[i] is not None
                                                                 else "is stale") for i in up)
        raise StaleReplicas(f"no replica serves weight version {self.version} ({said}): push the weights with "
                            "update_weights before stepping")

    async def _reported(self, i: int) -> Reported:
        """The version replica i reports; None when it does not say, `Unverified` when it cannot be read."""
        ep, client = self.replicas.endpoints[i], self.replicas.client
        try:
            return await client.backend(ep).served_version(client.session, ep)
        except (TailSieveError, OSError) as exc:
            return Unverified(_first_line(exc))

    async def _confirm(self, ids: list[int], methods: list[UpdateMethod], errors: list[str],
                       v: int) -> list[Reported]:
        """Read back the version of every replica just moved (labelling restarted and pushed ones first); one that
        reports another version, or whose version cannot be read back, is stale after all (`methods` and `errors`
        are updated in place)."""
        moved = [k for k, m in enumerate(methods) if m is not UpdateMethod.STALE]
        client = self.replicas.client

        async def one(k: int) -> Reported:
            ep = self.replicas.endpoints[ids[k]]
            if methods[k] is not UpdateMethod.IN_PLACE:
                await client.backend(ep).tag_version(client.session, ep, v)
            return await self._reported(ids[k])

        got = await asyncio.gather(*(one(k) for k in moved), return_exceptions=True)
        reported: list[Reported] = [None] * len(ids)
        for k, r in zip(moved, got, strict=True):
            url = self.replicas.endpoints[ids[k]].url
            if isinstance(r, BaseException):
                if not isinstance(r, TailSieveError | OSError):
                    raise r
                methods[k] = UpdateMethod.STALE
                errors.append(_first_line(r))
                continue
            reported[k] = r
            if isinstance(r, Unverified):
                methods[k] = UpdateMethod.STALE
                errors.append(f"{url}: weight version not read back after the update to {v}: {r.error}"[:400])
            elif disagrees(r, v):
                methods[k] = UpdateMethod.STALE
                errors.append(f"{url} reports weight version {excerpt(r)} after the update to {v}")
        return reported

    async def refresh(self) -> list[int]:
        """Make the stale replicas that answer again serve the current version; the ids now fresh. An unverified
        one whose version now reads as the run's (or that no longer reports one) is fresh as it is; the others are
        updated again (when the run has a checkpoint or a push hook) and read back."""
        if not self.replicas.stale or (self.path is None and self.push is None and not self.unverified):
            return []
        ids = sorted(self.replicas.stale)
        alive = await asyncio.gather(*(self.replicas.client.health(self.replicas.endpoints[i]) for i in ids))
        ids = [i for i, ok in zip(ids, alive, strict=True) if ok]
        recheck = [i for i in ids if i in self.unverified]
        found = dict(zip(recheck, await asyncio.gather(*(self._reported(i) for i in recheck)), strict=True))
        still = {i for i, r in found.items() if isinstance(r, Unverified)}
        fresh = [i for i, r in found.items() if r is None or r == str(self.version)]  # None: does not report
        self.unverified = (self.unverified - set(found)) | still
        redo = [i for i in ids if i not in fresh and i not in still]
        if redo and (self.path is not None or self.push is not None):
            methods, errors = await self._apply(redo, self.path, self.version, self.push, probe=False)
            got = await self._confirm(redo, methods, errors, self.version)
            fresh += [i for i, m in zip(redo, methods, strict=True) if m is not UpdateMethod.STALE]
            self.unverified |= {i for i, r in zip(redo, got, strict=True) if isinstance(r, Unverified)}
        self.replicas.stale -= set(fresh)
        self.unverified -= set(fresh)
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
                errors.append(_first_line(res))
                failed.append(i)
            else:
                raise res
        if failed and path is not None and self.reload is not None and push is None:
            try:
                await asyncio.to_thread(self.reload, path, failed)
                out |= dict.fromkeys(failed, UpdateMethod.RESTART)
            except TailSieveError as exc:
                errors.append(f"restart fallback: {_first_line(exc)}")
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


def _first_line(exc: BaseException) -> str:
    """An update error as one short line: its message's first line (300 characters at most), or its type's name
    when it has no message."""
    lines = str(exc).strip().splitlines()
    return lines[0][:300] if lines else type(exc).__name__
