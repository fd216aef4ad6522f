"""Weight versions against fake vLLM servers: `Rollout.update_weights` in place, the restart fallback, a framework's
push hook, stale replicas never used until refreshed, versions saved with the state, and the trainer-ready view
(prompt/response ids, logprobs, version, group) of every consumed sample."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from engine_fake import FAKE_PROMPT_IDS, FakeServer, fake_logprob
from tailsieve.engines.rollout.api import Batch, Rollout, RolloutConfig
from tailsieve.engines.rollout.prompts import PromptRecord
from tailsieve.engines.rollout.state import RolloutState
from tailsieve.engines.rollout.weight_sync import StaleBatch, UpdateMethod
from tailsieve.engines.transport.engine_client import Api, Endpoint, EngineError, SamplingParams
from tailsieve.errors import ConfigError, TailSieveError

PROMPTS = tuple(PromptRecord(f"p{i}", f"prompt number {i}") for i in range(60))


@pytest.fixture
def servers() -> Iterator[list[FakeServer]]:
    with FakeServer() as a, FakeServer() as b, FakeServer() as c:
        yield [a, b, c]


def config(**kw: object) -> RolloutConfig:
    base = RolloutConfig(groups=4, group_size=4, rho=0.5, policy="static", q=1, m=1,
                         sampling=SamplingParams(max_tokens=40), logprobs=True)
    return replace(base, **kw)  # type: ignore[arg-type]


def ckpt(tmp_path: Path, name: str) -> Path:
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text("{}")
    return d


def test_in_place_update_versions_every_later_sample(servers: list[FakeServer], tmp_path: Path) -> None:
    async def run() -> tuple[list[int], list[set[int]], RolloutState, list[UpdateMethod]]:
        async with Rollout([s.url for s in servers], config(), PROMPTS) as r:
            versions, seen, methods = [], [], []
            for t in range(4):
                b = await r.step()
                versions.append(b.weight_version)
                seen.append({s.weight_version for g in b.groups for s in g.samples})
                assert b.stale_samples == 0
                up = await r.update_weights(ckpt(tmp_path, f"step{t}"))
                methods = list(up.methods)
            return versions, seen, r.state(), methods

    versions, seen, state, methods = asyncio.run(run())
    assert versions == [0, 1, 2, 3] and seen == [{0}, {1}, {2}, {3}]
    assert methods == [UpdateMethod.IN_PLACE] * 3
    for s in servers:
        assert s.reloads == [str((tmp_path / f"step{t}").resolve()) for t in range(4)]
        assert s.cache_resets == 4 and s.version_label == "4"
    assert state.weight_version == 4
    assert RolloutState.from_json(state.to_json()).weight_version == 4


def test_restored_run_continues_the_version(servers: list[FakeServer], tmp_path: Path) -> None:
    async def run(state: RolloutState | None) -> tuple[int, RolloutState]:
        async with Rollout([s.url for s in servers], config(), PROMPTS, state=state) as r:
            if state is None:
                await r.step()
                await r.update_weights(ckpt(tmp_path, "a"))
            b = await r.step()
            return b.weight_version, r.state()

    v1, st = asyncio.run(run(None))
    v2, _ = asyncio.run(run(st))
    assert v1 == 1 and v2 == 1


def test_an_update_during_a_step_refuses_the_batch_and_keeps_its_groups(servers: list[FakeServer],
                                                                         tmp_path: Path) -> None:
    """update_weights while a step runs: that step's consumed samples predate the new version, so the batch is
    refused with one StaleBatch line, and the state has not moved: the next step is the same step number and the
    refused step's groups are consumed then, exactly once (consumed ∪ waiting = every draw, none twice)."""
    for s in servers:
        s.tpot_s = 0.01  # a step of ~0.4 s: the update lands inside it

    async def run() -> tuple[list[Batch], BaseException | None, dict[str, Any], dict[str, Any], RolloutState]:
        async with Rollout([s.url for s in servers], config(), PROMPTS) as r:
            batches = [await r.step()]
            before = r.state().to_json()

            async def update_soon() -> None:
                await asyncio.sleep(0.05)
                await r.update_weights(ckpt(tmp_path, "mid"))

            refused, _ = await asyncio.gather(r.step(), update_soon(), return_exceptions=True)
            after = r.state().to_json()
            batches += [await r.step(), await r.step()]
            return batches, refused if isinstance(refused, BaseException) else None, before, after, r.state()

    batches, refused, before, after, state = asyncio.run(run())
    assert isinstance(refused, StaleBatch) and isinstance(refused, TailSieveError)
    assert len(str(refused).splitlines()) == 1 and str(refused).startswith("step 1: ")
    assert "update_weights ran during the step" in str(refused)
    assert {k: after[k] for k in ("router", "control", "generation")} == {
        k: before[k] for k in ("router", "control", "generation")}
    assert after["weight_version"] == 1 and before["weight_version"] == 0
    assert [b.step for b in batches] == [0, 1, 2] and [b.weight_version for b in batches] == [0, 1, 1]
    assert all(b.stale_samples == 0 for b in batches)
    consumed = [g.uid for b in batches for g in b.groups]
    waiting = [ref.uid for ref in state.router.waiting]
    assert state.router.stream is not None
    assert len(consumed) == len(set(consumed)) == 3 * 4 == state.router.consumed
    assert sorted(consumed + waiting) == list(range(state.router.stream.position))


def test_unsupported_server_falls_back_to_the_restart_hook(servers: list[FakeServer], tmp_path: Path) -> None:
    servers[1].reload = "404"
    calls: list[tuple[str, list[int]]] = []

    def reload(path: str, ids: Sequence[int]) -> float:
        calls.append((path, list(ids)))
        return 0.0

    async def run() -> list[UpdateMethod]:
        async with Rollout([s.url for s in servers], config(), PROMPTS, reload=reload) as r:
            up = await r.update_weights(ckpt(tmp_path, "w"))
            b = await r.step()
            assert {s.replica for g in b.groups for s in g.samples} <= {0, 1, 2}
            return list(up.methods)

    assert asyncio.run(run()) == [UpdateMethod.IN_PLACE, UpdateMethod.RESTART, UpdateMethod.IN_PLACE]
    assert calls == [(str((tmp_path / "w").resolve()), [1])]


def test_a_stale_replica_is_never_used_until_refreshed(servers: list[FakeServer], tmp_path: Path) -> None:
    servers[0].reload = "500"
    cfg = config(policy="uniform", q=None, m=None)

    async def run() -> tuple[set[int], set[int], tuple[str, ...]]:
        async with Rollout([s.url for s in servers], cfg, PROMPTS) as r:
            await r.step()
            before = servers[0].started
            up = await r.update_weights(ckpt(tmp_path, "w"))
            assert up.methods[0] is UpdateMethod.STALE and up.updated == 2
            b = await r.step()
            assert servers[0].started == before  # nothing sent to the stale replica
            used_stale = {s.replica for g in b.groups for s in g.samples}
            servers[0].reload = "ok"  # fixed: the next step's refresh updates it first
            b2 = await r.step()
            assert {s.weight_version for g in b2.groups for s in g.samples} == {1}
            return used_stale, {s.replica for g in b2.groups for s in g.samples}, up.errors

    used_stale, used_after, errors = asyncio.run(run())
    assert 0 not in used_stale and 0 in used_after
    assert len(errors) == 1 and "reload_weights failed: HTTP 500" in errors[0]
    assert servers[0].reloads == [str((tmp_path / "w").resolve())]


def test_failure_everywhere_is_one_line_and_keeps_the_version(servers: list[FakeServer], tmp_path: Path) -> None:
    for s in servers:
        s.reload = "404"

    async def run() -> int:
        async with Rollout([s.url for s in servers], config(), PROMPTS) as r:
            with pytest.raises(EngineError, match=r"failed on every replica: .*VLLM_SERVER_DEV_MODE=1") as e:
                await r.update_weights(ckpt(tmp_path, "w"))
            assert "\n" not in str(e.value)
            with pytest.raises(ConfigError, match="does not exist"):
                await r.update_weights(tmp_path / "missing")
            with pytest.raises(ConfigError, match="must increase: 0 after 0"):
                await r.update_weights(ckpt(tmp_path, "v"), version=0)
            with pytest.raises(ConfigError, match="exactly one"):
                await r.update_weights()
            return r.weight_version

    assert asyncio.run(run()) == 0


def test_push_hook_is_called_per_replica(servers: list[FakeServer]) -> None:
    pushed: list[tuple[int, str, int]] = []

    async def push(i: int, ep: Endpoint, version: int) -> None:
        pushed.append((i, ep.url, version))

    async def run() -> int:
        async with Rollout([s.url for s in servers], config(), PROMPTS) as r:
            up = await r.update_weights(push=push, version=7)
            assert up.methods == (UpdateMethod.PUSH,) * 3 and up.path is None
            b = await r.step()
            return b.weight_version

    assert asyncio.run(run()) == 7
    assert sorted(pushed) == [(i, s.url, 7) for i, s in enumerate(servers)]
    assert all(not s.reloads for s in servers)


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("api", [Api.COMPLETIONS, Api.CHAT])
def test_trainer_samples_carry_ids_logprobs_version_and_group(servers: list[FakeServer], stream: bool,
                                                              api: Api) -> None:
    async def run() -> None:
        async with Rollout([s.url for s in servers], config(stream=stream, api=api), PROMPTS) as r:
            b = await r.step()
            rows = b.trainer_samples()
            assert len(rows) == 4 * 4
            assert [x.group_uid for x in rows] == [g.uid for g in b.groups for _ in range(4)]
            for x in rows:
                assert x.response_token_ids is not None and x.logprobs is not None
                assert len(x.logprobs) == len(x.response_token_ids)
                assert list(x.logprobs) == pytest.approx([fake_logprob(t) for t in range(len(x.logprobs))])
                assert x.prompt_token_ids == (None if api is Api.CHAT else tuple(FAKE_PROMPT_IDS))
                assert x.weight_version == 0 and x.finish_reason in ("stop", "length")
                assert x.to_json()["pool"] in ("tail", "bulk")
            assert all(b["logprobs"] == (True if api is Api.CHAT else 0) for s in servers for b in s.bodies)

    asyncio.run(run())
