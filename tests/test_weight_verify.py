"""Weight versions that cannot be verified, and samples that carry an older one (issue 41), generated:

- how a replica's `/weight_info` fails × when it is read (after an update; when a saved run resumes): only "does not
  report" (404, or an answer without `weight_version`) is trusted; a timeout, an error status, a dropped
  connection, a reply that is not a JSON object or is over the byte cap leaves the replica stale (it serves
  nothing) until a later read answers the run's version, without reloading it again;
- the version a replica stamps on its samples × stream/full: another version than the one the sample was sent under
  excludes the replica like a stale `/weight_info` (its work moves to the others) instead of failing every step
  with `StaleBatch`.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from bad_fake import BadFake
from engine_fake import FakeServer
from reply_harness import PROMPTS, cfg, check_complete
from tailsieve.engines.rollout.api import Batch, Rollout, RolloutConfig
from tailsieve.engines.rollout.state import RolloutState
from tailsieve.engines.rollout.weight_sync import UpdateMethod
from tailsieve.engines.transport import backends
from tailsieve.engines.transport.reply_bounds import CONTROL_REPLY_BYTES

HANG_S = 3.0


@dataclass
class VersionFake(FakeServer):
    """A `FakeServer` whose `/weight_info` fails in the way `info` names (`ok`: it answers its label)."""

    info: str = "ok"

    async def _weight_info(self, request: web.Request) -> web.StreamResponse:
        if self.info == "ok":
            return await super()._weight_info(request)
        if self.info == "timeout":
            await asyncio.sleep(HANG_S)
        if self.info == "drop":
            assert request.transport is not None
            request.transport.close()
            return web.Response()
        replies = {"404": (404, ""), "no-field": (200, "{}"), "500": (500, '{"detail": "engine dead"}'),
                   "not-json": (200, "<html>ok</html>"), "list": (200, '["1"]'),
                   "object-version": (200, '{"weight_version": {"v": 1}}'),
                   "oversize": (200, json.dumps({"weight_version": self.version_label,
                                                 "pad": "p" * CONTROL_REPLY_BYTES}))}
        status, text = replies.get(self.info, (200, "{}"))
        return web.Response(status=status, text=text, content_type="application/json")


TRUSTED = ("404", "no-field")  # the server does not report a version: it cannot be checked, and is used
UNVERIFIED = ("timeout", "500", "drop", "not-json", "list", "object-version", "oversize")


def config() -> RolloutConfig:
    return replace(cfg(True), policy="uniform", q=None, m=None)


def ckpt(tmp_path: Path, name: str) -> Path:
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text("{}")
    return d


def used(b: Batch) -> set[int]:
    return {s.replica for g in b.groups for s in g.samples}


@pytest.fixture(autouse=True)
def short_version_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backends, "VERSION_TIMEOUT_S", 0.3)


@pytest.mark.parametrize("info", UNVERIFIED + TRUSTED)
def test_a_version_that_cannot_be_read_back_after_an_update_serves_nothing_until_it_can(info: str,
                                                                                          tmp_path: Path) -> None:
    with VersionFake(info=info) as flaky, FakeServer() as good:
        async def run() -> tuple[Any, set[int], set[int]]:
            async with Rollout([flaky.url, good.url], config(), PROMPTS) as r:
                up = await r.update_weights(ckpt(tmp_path, "w1"))
                first = used(await r.step())
                flaky.info = "ok"  # it answers again: the next step's refresh reads "1" back
                second = await r.step()
                assert second.stale_samples == 0 and {s.weight_version for g in second.groups
                                                      for s in g.samples} == {1}
                return up, first, used(second)

        up, first, second = asyncio.run(run())
        reloads = len(flaky.reloads)
    if info in TRUSTED:
        assert up.methods == (UpdateMethod.IN_PLACE,) * 2 and up.errors == () and 0 in first
        return
    assert up.methods == (UpdateMethod.STALE, UpdateMethod.IN_PLACE) and up.updated == 1
    assert len(up.errors) == 1 and up.errors[0].startswith(f"{flaky.url}: weight version not read back after the "
                                                           "update to 1: "), up.errors
    assert "\n" not in up.errors[0]
    assert first == {1} and 0 in second
    assert reloads == 1  # verified by reading it back, not by reloading it again


@pytest.mark.parametrize("info", UNVERIFIED + TRUSTED)
def test_a_version_that_cannot_be_read_when_a_run_resumes_serves_nothing_until_it_can(info: str) -> None:
    with VersionFake() as flaky, FakeServer() as good:
        async def saved() -> RolloutState:
            async with Rollout([flaky.url, good.url], config(), PROMPTS) as r:
                await r.step()
                return replace(r.state(), weight_version=5)

        state = asyncio.run(saved())
        flaky.version_label = good.version_label = "5"
        flaky.info = info

        async def run() -> tuple[Any, set[int], set[int]]:
            async with Rollout([flaky.url, good.url], config(), PROMPTS, state=state) as r:
                check = r.version_check
                first = used(await r.step())
                flaky.info = "ok"
                return check, first, used(await r.step())

        check, first, second = asyncio.run(run())
    assert check is not None and check.reported[1] == "5"
    if info in TRUSTED:
        assert check.stale == () and 0 in first
        return
    assert check.stale == (0,) and check.reported[0] is None
    assert len(check.errors) == 1 and check.errors[0].startswith(f"{flaky.url}: ") and "\n" not in check.errors[0]
    assert first == {1} and 0 in second


def stamped(label: str, stream: bool) -> Any:
    """A well-formed reply whose every choice says it was generated by weight version `label` (SGLang's
    `meta_info.weight_version`, as the transport reads it)."""
    def make(b: dict[str, Any]) -> str | list[str]:
        n = int(b.get("n", 1))
        if not stream:
            return json.dumps({"choices": [{"index": i, "text": "xx", "token_ids": [1, 2], "finish_reason": "stop",
                                            "weight_version": label} for i in range(n)],
                               "usage": {"prompt_tokens": 3, "completion_tokens": 2 * n}})
        return [json.dumps({"choices": [{"index": i, "text": "x", "token_ids": [t], "weight_version": label,
                                         "finish_reason": "stop" if t else None}]}) for i in range(n) for t in (0, 1)]

    return make


STAMPS = ("0", "default", "2", "1")  # "1": the run's version after the update (the control)


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "full"])
@pytest.mark.parametrize("label", STAMPS)
def test_a_replica_whose_samples_carry_another_version_is_excluded_not_fatal(label: str, stream: bool,
                                                                             tmp_path: Path) -> None:
    """Its /weight_info says "1" like the others; only its samples tell. Every step completes on the replica that
    serves version 1, and the excluded one is updated again (and checked again) at the next step."""
    with BadFake(custom=stamped(label, stream)) as bad, FakeServer() as good:
        async def run() -> tuple[list[Batch], list[tuple[int, bool, str]]]:
            async with Rollout([bad.url, good.url], cfg(stream), PROMPTS) as r:
                up = await r.update_weights(ckpt(tmp_path, "w1"))
                assert up.methods == (UpdateMethod.IN_PLACE,) * 2
                batches = [await r.step() for _ in range(3)]
                assert r.replicas is not None
                return batches, [(e.replica, e.up, e.reason) for e in r.replicas.events]

        batches, events = asyncio.run(run())
        reloads = len(bad.reloads)
    assert [b.step for b in batches] == [0, 1, 2]
    assert all(b.stale_samples == 0 and b.weight_version == 1 for b in batches)
    if label == "1":
        assert not events and all(0 in used(b) for b in batches) and reloads == 1
        return
    for b in batches:
        check_complete(b)  # every sample from replica 1
    stale = [why for i, up, why in events if i == 0 and not up]
    assert len(stale) == 3 and all(why.startswith("stale-version: ") for why in stale), events
    assert f"carry weight version {label!r}, sent under 1" in stale[0]
    assert all(i == 0 for i, _, _ in events)
    assert reloads == 3  # updated again before each later step
