"""`LocalLauncher` with two REAL vLLM CPU servers (tiny local Llama): the tail replica runs `ngram` speculation (its
acceptance seen on /metrics and by `profile`), a real rollout moves it to the bulk pool and back (two restarts,
counted in the steps), and every process is gone afterwards. About 2 minutes."""

from __future__ import annotations

import asyncio
import json
import os
import time
import urllib.request
from pathlib import Path

import pytest

from launch_harness import gone
from tailsieve.cli import main
from tailsieve.engines.launch import LaunchError, LocalLauncher
from tailsieve.engines.launch.config import LaunchConfig, PoolEngine
from tailsieve.engines.measure.spec_measure import SpecCounters
from tailsieve.engines.rollout.api import Batch, Rollout, RolloutConfig
from tailsieve.engines.rollout.prompts import PromptRecord
from tailsieve.engines.transport.engine_client import Endpoint, EngineClient, SamplingParams
from tailsieve.model.speculative import PoolSpec, SpecConfig, SpecMethod
from tailsieve.policy.controller import ControllerConfig
from vllm_fixtures import requires_vllm, tiny_model  # noqa: F401

pytestmark = [pytest.mark.real_server, pytest.mark.slow, requires_vllm, pytest.mark.timeout(400)]

NGRAM = SpecConfig(SpecMethod.NGRAM, 3)
PROMPTS = tuple(PromptRecord(f"p{i}", f"the model sums {i} and {i * 7} then returns") for i in range(16))


def counters(url: str) -> SpecCounters | None:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:
        return SpecCounters.parse(r.read().decode())


def complete(url: str, max_tokens: int = 96) -> None:
    body = {"model": "tiny", "prompt": "the model sums 3 and 21 then returns", "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True}
    req = urllib.request.Request(f"{url}/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        assert json.loads(r.read())["usage"]["completion_tokens"] == max_tokens


REAP_S = 10.0  # grace for a real vLLM server's engine core and workers to be reaped (`launch_harness.gone`)


def test_launch_ngram_tail_profile_rollout_moves_and_stop(tiny_model: Path, tmp_path: Path) -> None:  # noqa: F811
    cores = ("0", "1") if (os.cpu_count() or 1) >= 2 else ()
    cfg = LaunchConfig(model=str(tiny_model), replicas=2, places=cores, memory=1, served_model_name="tiny",
                       tail_replicas=1, args=("--max-model-len", "4096", "--max-num-seqs", "64"),
                       tail=PoolEngine(NGRAM, (("prompt_lookup_max", 4), ("prompt_lookup_min", 2))),
                       startup_timeout_s=300, grace_s=20)
    la = LocalLauncher(cfg, tmp_path / "launch")
    pids: list[int] = []
    try:
        try:
            la.start()
        except LaunchError as exc:
            if "speculative" in str(exc):
                pytest.fail(f"this vLLM CPU build cannot run ngram speculation on the tail replica: {exc}")
            raise
        pids += [r.proc.pid for r in la.replicas if r.proc]
        bulk, tail = la.endpoints
        assert counters(bulk) is None  # the bulk replica does not speculate
        complete(tail)
        c = counters(tail)
        assert c is not None and c.drafts > 0 and c.accepted > 0  # greedy on random weights repeats: drafts accepted

        plain = tmp_path / "bulk-curve.json"  # the same model without speculation: the cost fit's reference
        assert main(["profile", "--endpoint", bulk, "--batches", "1,4", "--contexts", "0", "--max-tokens", "48",
                     "--temperature", "0",
                     "--out", str(plain)]) == 0
        assert json.loads(plain.read_text())["speculative"] is None
        out = tmp_path / "tail-curve.json"
        assert main(["profile", "--endpoint", tail, "--batches", "1,4", "--contexts", "0", "--max-tokens", "48",
                     "--temperature", "0",
                     "--out", str(out), "--plain-curve", str(plain), "--method", "ngram"]) == 0
        sp = json.loads(out.read_text())["speculative"]
        assert sp["fit"]["tokens"] == 3 and sp["expected_tokens"] > 1.0 and sp["draft_tokens"] > 0
        fit = sp["fit"]
        assert fit["method"] == "ngram" and fit["points"] == 2 and 0.0 <= fit["verify_cost"] <= 1.0
        assert fit["draft_cost"] >= 0.0 and 0.0 < fit["draft_share"] <= 1.0 and 0.0 < fit["acceptance"] <= 1.0

        rc = RolloutConfig(groups=4, group_size=2, rho=0.5, policy="static", q=1, m=1, seed=None,
                           controller=ControllerConfig(), spec=PoolSpec(tail=NGRAM), curve=str(out),
                           sampling=SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True))

        async def go() -> list[Batch]:
            async with Rollout(la.endpoints, rc, PROMPTS, pools=la.pool_hook) as r:
                return [await r.step(), await r.step()]

        warm, steady = asyncio.run(go())
        # warm-up runs every replica as bulk: replica 1 restarts without speculation, then back with ngram
        assert warm.record.m == 0 and warm.restart_s > 1.0 and warm.record.makespan_s > warm.restart_s
        assert steady.record.m == 1 and steady.restart_s > 1.0 and la.replicas[1].restarts == 2
        assert len(steady.groups) == 4 and all(set(g.lengths) == {48} for g in steady.groups)
        assert la.m == 1 and "--speculative-config" in la.command(la.replicas[1])
        c2 = counters(tail)
        assert c2 is not None and c2.generated > 0 and c2.drafts > 0  # the restarted tail speculates again
        pids += [r.proc.pid for r in la.replicas if r.proc]
    finally:
        la.stop()
    assert pids and all(gone(p, REAP_S) for p in pids)


def test_killed_server_mid_step_is_restarted_while_the_rollout_continues(tiny_model: Path,  # noqa: F811
                                                                          tmp_path: Path) -> None:
    """Issue 12: SIGKILL one replica's API server mid-step (its engine core is left running, as `kill -9 PID`
    leaves it): the step still completes with every group on the other replica, the launcher reaps the dead
    server's whole process group and restarts it in place, and a later step dispatches to it again."""
    from tailsieve.engines.launch.tiny_vllm import tiny_launch_config

    la = LocalLauncher(tiny_launch_config(tiny_model, max_num_seqs=64, grace_s=20, restart_backoff_s=1.0),
                       tmp_path / "launch")
    rc = RolloutConfig(groups=4, group_size=2, rho=0.5, policy="static", q=1, m=1, seed=None,
                       controller=ControllerConfig(),
                       sampling=SamplingParams(temperature=0.0, max_tokens=1500, ignore_eos=True))
    prompts = tuple(PromptRecord(f"p{i}", f"the model sums {i} and {i * 7} then returns") for i in range(400))
    timeline: dict[str, float] = {}
    try:
        la.start()
        old = la.replicas[0].proc
        assert old is not None
        old_pid = old.pid

        async def go() -> list[Batch]:
            out = []
            async with Rollout(la.endpoints, rc, prompts, pools=la.pool_hook) as r:
                task = asyncio.create_task(r.step())
                async with EngineClient() as c:  # kill while replica 0 is generating (its work must move)
                    until = time.monotonic() + 60
                    while (await c.metrics(Endpoint(la.endpoints[0]))).get("vllm:num_requests_running", 0) < 1:
                        assert time.monotonic() < until and not task.done(), "replica 0 never started generating"
                        await asyncio.sleep(0.05)
                await asyncio.sleep(0.3)
                assert not task.done(), "the step ended before the kill: raise max_tokens"
                os.kill(old_pid, 9)  # the API server only
                timeline["kill"] = time.monotonic()
                out.append(await task)
                timeline["step_done"] = time.monotonic()
                deadline = time.monotonic() + 300
                while time.monotonic() < deadline:
                    b = await r.step()
                    out.append(b)
                    if any(s.replica == 0 for g in b.groups for s in g.samples):
                        timeline["served"] = time.monotonic()
                        break
            return out

        batches = asyncio.run(go())
        first = batches[0]
        assert len(first.groups) == 4 and all(set(g.lengths) == {1500} for g in first.groups)
        assert first.redispatched > 0 and first.down == (0,)
        assert "served" in timeline, "replica 0 never served again"
        assert la.replicas[0].restarts == 1 and la.replicas[1].restarts == 0 and la.replicas[0].state == "up"
        assert gone(old_pid, REAP_S)  # the old server's engine core and workers were reaped with it
        rec = la.recoveries[0]
        assert rec["how"] == "killed by signal SIGKILL" and rec["reaped"] and "back_s" in rec
        events = la.drain_events()
        assert any("replica 0 (bulk pool" in e and "killed by signal SIGKILL" in e for e in events), events
        print(f"\nkill → step done {timeline['step_done'] - timeline['kill']:.1f}s; kill → reaped+restart began "
              f"{rec['restart_began_s']:.1f}s; kill → healthy again {rec['back_s']:.1f}s "
              f"(start-up {rec['boot_s']:.1f}s); kill → first sample served by it "
              f"{timeline['served'] - timeline['kill']:.1f}s over "
              f"{len(batches)} steps; events: {events}")
    finally:
        la.stop()
    assert all(gone(r.proc.pid, REAP_S) for r in la.replicas if r.proc)
