"""Against two REAL vLLM CPU servers (tiny local Llama): a TailSieve step whose cutoff aborts on the server (seen on
/metrics), many seeded requests, `profile`, save/restore, peers interleaved with TailSieve, and a server killed
mid-step. The kill test runs last."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path

import pytest

from tailsieve.cli import main
from tailsieve.engines.launch import LocalLauncher
from tailsieve.engines.rollout.api import Batch, Rollout, RolloutConfig
from tailsieve.engines.rollout.prompts import PromptRecord
from tailsieve.engines.rollout.runner import run_policies_real
from tailsieve.engines.rollout.state import RolloutState
from tailsieve.engines.transport.engine_client import ClientOptions, Endpoint, EngineClient, Request, SamplingParams
from tailsieve.engines.transport.health import FaultPolicy
from tailsieve.model.costmodel import load_cost_model
from tailsieve.model.curve_names import load_curve
from tailsieve.policy.controller import ControllerConfig
from tailsieve.policy.step import GroupStatus
from tailsieve.workloads import load_workload
from vllm_fixtures import requires_vllm, tiny_model, vllm_pair  # noqa: F401

pytestmark = [pytest.mark.real_server, pytest.mark.slow, requires_vllm, pytest.mark.timeout(600)]

LONG = {"p2", "p5"}  # two prompts whose groups are long: they are still running at the warm-up cutoff
PROMPTS = tuple(PromptRecord(f"p{i}", f"the model sums {i} and {i * 7} then returns") for i in range(24))


@pytest.fixture(scope="module")
def pair(vllm_pair: LocalLauncher) -> LocalLauncher:  # noqa: F811
    """The two replicas of this module (the last test kills the first one)."""
    return vllm_pair


@pytest.fixture(scope="module")
def workload(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    path = tmp_path_factory.mktemp("trace") / "lengths.csv"
    rows = [f"p{i},{1200 if f'p{i}' in LONG else 120 + 5 * (i % 5)}" for i in range(24) for _ in range(2)]
    path.write_text("prompt_id,response_tokens\n" + "\n".join(rows) + "\n")
    return load_workload(str(path))


def cfg(workload, **kw: object) -> RolloutConfig:  # type: ignore[no-untyped-def]
    base = RolloutConfig(groups=6, group_size=4, rho=0.3, policy="tailsieve",
                         controller=ControllerConfig(m0=1), replay=workload,
                         faults=FaultPolicy(stall_timeout_s=30, backoff_s=0.05, probe_interval_s=0.5))
    return replace(base, **kw)  # type: ignore[arg-type]


async def running(urls: list[str]) -> list[float]:
    async with EngineClient() as c:
        return [(await c.metrics(Endpoint(u))).get("vllm:num_requests_running", -1.0) for u in urls]


def test_tailsieve_step_cutoff_really_aborts(pair: LocalLauncher, workload) -> None:  # type: ignore[no-untyped-def]
    urls = pair.endpoints
    seen: list[list[float]] = []

    async def go() -> tuple[list[Batch], list[float]]:
        async with Rollout(urls, cfg(workload), PROMPTS) as r:
            stop = asyncio.Event()

            async def watch() -> None:
                while not stop.is_set():
                    seen.append(await running(urls))
                    await asyncio.sleep(0.05)

            w = asyncio.create_task(watch())
            warm = await r.step()
            stop.set()
            await w
            await asyncio.sleep(0.3)
            after = await running(urls)
            return [warm, await r.step()], after

    (warm, steady), after = asyncio.run(go())
    cut = [o for o in warm.outcomes if o.status is GroupStatus.ABORTED]
    assert warm.record.warmup and len(cut) == 2 and {o.ref.prompt_id for o in cut} == LONG
    assert all(0 < t < 1200 for o in cut for t in o.lengths)  # cut mid-generation, progress recorded
    assert max(sum(x) for x in seen) >= 8 and after == [0.0, 0.0]  # unfinished requests aborted on the server
    assert len(warm.groups) == 6 and all(set(g.finish_reasons) == {"length"} for g in warm.groups)
    # next step: the cut long groups are the candidates; the q isolated ones run on the tail replica (R − 1)
    q = steady.record.q
    assert 1 <= q <= 2 and steady.record.m == 1 and {g.prompt_id for g in steady.groups[:q]} <= LONG
    assert all({s.replica for s in g.samples} == {1} and g.lengths == (1200,) * 4 for g in steady.groups[:q])
    assert len(steady.groups) == 6 and steady.record.tail_s > 0 and steady.record.bulk_s > 0


def test_replicas_run_vllm_through_the_amx_requesting_entry_point(pair: LocalLauncher) -> None:
    """Issue 23: every replica's process is `python -m tailsieve.engines.launch.vllm_server` (the AMX permission
    is requested there before vLLM imports) and it serves bf16 generations (the attention path AMX hosts fault in)."""
    for rep in pair.replicas:
        assert rep.proc is not None
        argv = Path(f"/proc/{rep.proc.pid}/cmdline").read_bytes().split(b"\0")
        k = argv.index(b"-m")
        assert argv[k + 1] == b"tailsieve.engines.launch.vllm_server" and b"bfloat16" in argv
        assert "AmxPermissionError" not in rep.log.read_text(errors="replace")

    async def go() -> list[int]:
        async with EngineClient(ClientOptions(stream=True)) as c:
            return [(await c.complete(Endpoint(u), "tiny", Request(f"amx{i}", "the model", max_tokens=8),
                                      SamplingParams(ignore_eos=True))).choices[0].tokens
                    for i, u in enumerate(pair.endpoints)]

    assert asyncio.run(go()) == [8, 8]


def test_many_seeded_requests_at_once(pair: LocalLauncher) -> None:
    long_prompt = " ".join(["the model sums integers and returns the answer"] * 6)

    async def go() -> list[int]:
        async with EngineClient(ClientOptions(stream=False)) as c:
            ep = Endpoint(pair.endpoints[0])
            comps = await asyncio.gather(*(
                c.complete(ep, "tiny", Request(f"s{i}", f"{i} {long_prompt}", seed=i, max_tokens=4),
                           SamplingParams(ignore_eos=True)) for i in range(136)))
            return [ch.tokens for comp in comps for ch in comp.choices]

    assert asyncio.run(go()) == [4] * 136  # > 2048 prefill tokens in one go: no chunked-prefill seed crash
    assert pair.healthy(0)


def test_profile_cli(pair: LocalLauncher, tmp_path: Path) -> None:
    out = tmp_path / "curve.json"
    assert main(["profile", "--endpoint", pair.endpoints[1], "--batches", "1,4,16", "--max-tokens", "48",
                 "--contexts", "0", "--out", str(out)]) == 0
    curve = load_curve(str(out))
    assert curve.batch == (1, 4, 16) and all(0 < t < 1000 for t in curve.tpot_ms)
    doc = json.loads(out.read_text())
    assert doc["points"][2]["tokens_per_s"] > 0
    # a real server reports its KV cache: the engine keys go in the file's cost_model, with no fitted terms (one
    # context), and the file still reads as the plain curve
    terms = doc["cost_model"]
    assert terms["kv_ms_per_1k"] == terms["prefill_ms_per_token"] == 0 and terms["kv_tokens"] > 0
    assert "fit" not in doc and load_cost_model(str(out)).engine.kv_tokens == terms["kv_tokens"]


def test_profile_cli_fits_the_cost_model(pair: LocalLauncher, tmp_path: Path) -> None:
    """A short real profile at three context lengths writes a model file (curve + terms + residuals) and its plot."""
    out, plot = tmp_path / "model.json", tmp_path / "fit.png"
    assert main(["profile", "--endpoint", pair.endpoints[1], "--batches", "1,8", "--max-tokens", "32",
                 "--contexts", "0,512,1536", "--out", str(out), "--plot", str(plot)]) == 0
    model = load_cost_model(str(out))
    assert model.curve.batch == (1, 8) and all(0 < t < 1000 for t in model.curve.tpot_ms)
    assert 0 <= model.kv_ms_per_1k < 100 and 0 < model.prefill_ms_per_token < 10
    doc = json.loads(out.read_text())
    assert len(doc["fit"]["decode"]) == 6 and len(doc["fit"]["prefill"]) == 3
    ctx = sorted({round(p["prompt_tokens"], -2) for p in doc["points"]})
    assert len(ctx) == 3 and 400 <= ctx[1] <= 600 and 1400 <= ctx[2] <= 1700  # sized on the server's tokenizer
    assert load_curve(str(out)).tpot_ms == model.curve.tpot_ms and plot.stat().st_size > 0


def test_save_restore_against_real_servers(pair: LocalLauncher, workload, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    urls = pair.endpoints
    c = cfg(workload, groups=4, group_size=2, rho=0.5)
    path = tmp_path / "state.json"

    async def first() -> list[Batch]:
        async with Rollout(urls, c, PROMPTS) as r:
            out = [await r.step(), await r.step()]
            r.save(path)
            return out

    async def second() -> tuple[list[Batch], RolloutState]:
        async with Rollout(urls, c, PROMPTS, state=path) as r:
            return [await r.step()], r.state()

    a = asyncio.run(first())
    b, final = asyncio.run(second())
    assert b[0].step == 2
    consumed = [g.uid for x in (*a, *b) for g in x.groups]
    pending = [g.uid for g in (*final.router.candidates, *final.router.requeue)]
    assert final.router.stream is not None and len(consumed) == len(set(consumed)) == 12
    assert sorted(consumed + pending) == list(range(final.router.stream.position))


def test_peers_and_tailsieve_interleave_on_real_replicas(pair: LocalLauncher, workload, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Two peers and tailsieve, interleaved step by step on the same prompt stream (`run_policies_real`, what
    `rollout --policy rollpacker,april-partial,tailsieve` runs): each consumes every draw at most once, N groups per
    step, the report carries simulate's fidelity columns from the real outcomes, and april-partial's cut groups are
    resumed on the servers from their text (progress never goes back, every consumed sample ends at its replayed
    length)."""
    names = ("rollpacker", "april-partial", "tailsieve")
    configs = {n: cfg(workload, groups=4, group_size=2, rho=0.5, policy=n, length_scale=0.5) for n in names}
    out = tmp_path / "run"
    seen: dict[str, list[Batch]] = {n: [] for n in names}
    runs = asyncio.run(run_policies_real(pair.endpoints, PROMPTS, configs, 2, out,
                                         on_step=lambda n, b: seen[n].append(b)))
    rep = json.loads((out / "report.json").read_text())
    assert list(rep["policies"]) == list(names)
    for n in names:
        assert len(runs[n].steps) == 2 and len(set(runs[n].consumed_uids)) == len(runs[n].consumed_uids) == 8
        assert set(rep["policies"][n]["fidelity"]) >= {"off_policy_token_share", "dropped_prompt_share",
                                                       "delayed_prompt_share", "batch_length_cv"}
        lines = [json.loads(x) for x in (out / n / "steps.jsonl").read_text().splitlines()]
        assert all(len(x["delays"]) == len(x["uids"]) == 4 and x["dropped"] == 0 for x in lines)
        assert all(s.tokens == (600 if g.prompt_id in LONG else round((120 + 5 * (int(g.prompt_id[1:]) % 5)) / 2))
                   for b in seen[n] for g in b.groups for s in g.samples)
    rp = [json.loads(x) for x in (out / "rollpacker" / "steps.jsonl").read_text().splitlines()]
    assert rp[0]["wasted_tokens"] > 0 and rp[0]["candidates"] == 2  # E = 2 groups deferred at step 0
    first, second = seen["april-partial"]
    cut = {o.ref.uid: o.lengths for o in first.outcomes if o.status is GroupStatus.ABORTED}
    assert len(cut) == 2 and first.record.wasted_tokens == 0
    again = {o.ref.uid: o.lengths for o in second.outcomes if o.ref.uid in cut}
    assert set(again) == set(cut) and all(b >= a for u in cut for a, b in zip(cut[u], again[u], strict=True))
    assert sum(second.offpolicy) == sum(sum(cut[g.uid]) for g in second.groups if g.uid in cut)


def test_server_killed_mid_step_still_delivers_n_groups(pair: LocalLauncher, workload) -> None:  # type: ignore[no-untyped-def]
    urls = pair.endpoints
    c = cfg(workload, policy="uniform", replay=None, groups=6, group_size=4,
            sampling=SamplingParams(max_tokens=1500, ignore_eos=True))

    async def go() -> Batch:
        async with Rollout(urls, c, PROMPTS) as r:
            step = asyncio.create_task(r.step())
            await asyncio.sleep(1.0)
            assert (await running(urls))[0] > 0
            await asyncio.get_running_loop().run_in_executor(None, pair.kill, 0)
            return await step

    batch = asyncio.run(go())
    assert len(batch.groups) == 6 and all(len(g.samples) == 4 for g in batch.groups)
    assert all(g.lengths == (1500,) * 4 for g in batch.groups)
    assert batch.redispatched > 0 and 0 in batch.down and 1 not in batch.down
    moved = [s for g in batch.groups for s in g.samples if s.attempts > 1]
    assert moved and all(s.replica == 1 for s in moved)
