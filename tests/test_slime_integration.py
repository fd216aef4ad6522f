"""`tailsieve.integrations.slime` against slime's documented hooks, with a stand-in `args` namespace (slime's argument
names) and fake SGLang servers behind a fake sglang-router: N groups per call, every drawn prompt consumed exactly
once, cut groups regenerated from scratch, aborts landing on the servers, token ids and logprobs, save → fresh
objects → load continuing identically, and one-line errors for bad setups."""

from __future__ import annotations

import json
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from sglang_fake import FakeFleet, FakeSGLang, logprob, token
from tailsieve.errors import TailSieveError
from tailsieve.integrations.slime import (
    SampleStatus,
    SlimeIntegrationError,
    SlimeSample,
    TailSieveDataSource,
    close_sessions,
    generate_rollout,
    session_for,
)
from tailsieve.integrations.slime.data_source import state_path

N, G, PROMPTS = 4, 2, 40
LONG = {1000 + i for i in range(0, PROMPTS, 5)}  # every fifth prompt runs to max_new_tokens: a tail


@pytest.fixture
def fleet() -> Iterator[FakeFleet]:
    f = FakeFleet([FakeSGLang(tpot_s=0.002, long_prompts=LONG, incremental=i == 1) for i in range(3)]).start()
    yield f
    close_sessions()
    f.stop()


def write_prompts(tmp_path: Path) -> Path:
    path = tmp_path / "prompts.jsonl"
    rows = [{"input": f"question {i}", "label": str(i), "tokens": [1000 + i, 7, 8]} for i in range(PROMPTS)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def make_args(tmp_path: Path, fleet: FakeFleet, **kw: Any) -> SimpleNamespace:
    """slime's argument names (the ones the integration reads)."""
    base: dict[str, Any] = dict(
        sglang_router_ip="127.0.0.1", sglang_router_port=fleet.router_port, rollout_batch_size=N,
        n_samples_per_prompt=G, over_sampling_batch_size=N, rollout_max_response_len=40, rollout_temperature=1.0,
        rollout_top_p=1.0, rollout_top_k=-1, rollout_stop=None, rollout_stop_token_ids=None,
        rollout_skip_special_tokens=False, rollout_seed=42, rollout_global_dataset=True, rollout_shuffle=False,
        prompt_data=str(write_prompts(tmp_path)), input_key="input", label_key="label", hf_checkpoint=None,
        save=str(tmp_path / "ckpt"), load=None, tailsieve_rho=0.5, tailsieve_stream=True,
        tailsieve_policy="static", tailsieve_q=2, tailsieve_m=1)  # fixed pools: cuts happen at this toy scale
    return SimpleNamespace(**(base | kw))


def run(args: SimpleNamespace, ds: TailSieveDataSource, steps: int, start: int = 0) -> list[list[list[Any]]]:
    return [generate_rollout(args, start + k, ds) for k in range(steps)]


def labels(batches: list[list[list[Any]]]) -> list[str]:
    return [g[0].label for b in batches for g in b]


@pytest.mark.parametrize("policy", ["static", "tailsieve"])
def test_n_groups_each_prompt_once_and_trainer_ready(tmp_path: Path, fleet: FakeFleet, policy: str) -> None:
    args = make_args(tmp_path, fleet, tailsieve_policy=policy)
    ds = TailSieveDataSource(args)
    batches = run(args, ds, 5)
    assert all(len(b) == N and all(len(g) == G for g in b) for b in batches)
    consumed = labels(batches)
    assert len(consumed) == len(set(consumed))  # nothing duplicated
    _, state = session_for(args, ds)
    waiting = [g[0].label for g in state.carry.values()]
    drawn = ds.source.group_index
    assert sorted(map(int, consumed + waiting)) == list(range(drawn))  # nothing lost: consumed + carried = drawn
    for g in (g for b in batches for g in b):
        for s in g:
            assert isinstance(s, SlimeSample) and s.status in (SampleStatus.COMPLETED, SampleStatus.TRUNCATED)
            key = json.dumps(s.tokens[:3])
            assert s.tokens[:3] == [1000 + int(s.label), 7, 8] and s.response_length == len(s.tokens) - 3
            assert s.tokens[3:] == [token(key, t) for t in range(s.response_length)]
            assert s.rollout_log_probs == [logprob(t) for t in range(s.response_length)]
            meta = s.metadata["tailsieve"]
            assert meta["pool"] in ("tail", "bulk") and meta["uid"] == s.group_index
    assert fleet.wait_idle() and fleet.running == 0


def test_cut_groups_are_regenerated_from_scratch_with_new_rids(tmp_path: Path, fleet: FakeFleet) -> None:
    args = make_args(tmp_path, fleet)
    ds = TailSieveDataSource(args)
    batches = run(args, ds, 4)
    carried = [g for b in batches for g in b if g[0].metadata["tailsieve"]["cuts"] > 0]
    assert carried, "some long group was cut and carried"
    rids = [r for s in fleet.servers for r in s.rids]
    assert len(rids) == len(set(rids))  # every attempt a new request id
    aborted = {r for s in fleet.servers for r in s.aborts}
    assert aborted and aborted <= set(rids)
    assert any(int(g[0].label) % 5 == 0 for g in carried)  # a long prompt among them
    for g in carried:
        uid = g[0].metadata["tailsieve"]["uid"]
        steps = {r.split("-")[1] for r in rids if r.split("-")[2] == str(uid)}
        assert len(steps) >= 2  # sent again in a later step under new rids
        assert all(s.response_length == (40 if int(s.label) % 5 == 0 else len(s.tokens) - 3) for s in g)
        assert all(s.status in (SampleStatus.COMPLETED, SampleStatus.TRUNCATED) for s in g)  # complete, from scratch
        assert all(s.rollout_log_probs == [logprob(t) for t in range(s.response_length)] for s in g)
    assert fleet.wait_idle() and fleet.running == 0  # aborted requests stopped on the servers


def test_save_then_fresh_objects_load_and_continue_identically(tmp_path: Path, fleet: FakeFleet) -> None:
    args = make_args(tmp_path, fleet)
    ds = TailSieveDataSource(args)
    before = labels(run(args, ds, 2))
    ds.save(1)
    assert state_path(args.save, 1).exists()
    saved = ds.tailsieve.to_json()
    assert saved["carry"]  # a cut group waits to be regenerated
    session, state = session_for(args, ds)
    assert state.loop is not None
    plan = session.steps.plan(state.loop)
    close_sessions()  # the job ends; a new process-equivalent set of objects resumes
    args2 = make_args(tmp_path, fleet, load=args.save, save=str(tmp_path / "ckpt2"))
    ds2 = TailSieveDataSource(args2)
    ds2.load(1)
    assert ds2.tailsieve.to_json() == saved and ds2.source.group_index == ds.source.group_index
    session2, state2 = session_for(args2, ds2)
    assert state2.loop is not None
    plan2 = session2.steps.plan(state2.loop)
    assert (plan2.tail, plan2.bulk, plan2.placement, plan2.bulk_quota) == (plan.tail, plan.bulk, plan.placement,
                                                                          plan.bulk_quota)
    after = labels(run(args2, ds2, 3, start=2))
    waiting = [g[0].label for g in state2.carry.values()]
    drawn = ds2.source.group_index
    assert sorted(map(int, before + after + waiting)) == list(range(drawn))  # each prompt once across the resume


def test_evaluation_is_uniform_and_leaves_the_carry_alone(tmp_path: Path, fleet: FakeFleet) -> None:
    args = make_args(tmp_path, fleet)
    args.eval_prompt_data = ["toy", args.prompt_data]
    args.n_samples_per_eval_prompt = 2
    ds = TailSieveDataSource(args)
    run(args, ds, 1)
    _, state = session_for(args, ds)
    before = dict(state.carry)
    out = generate_rollout(args, 1, ds, evaluation=True)
    assert list(out) == ["toy"] and len(out["toy"]["samples"]) == 2 * PROMPTS
    assert sum(out["toy"]["truncated"]) == 2 * len(LONG)
    assert state.carry == before and ds.source.group_index == len(before) + N


def test_router_answer_shapes_and_explicit_workers(tmp_path: Path, fleet: FakeFleet) -> None:
    from tailsieve.integrations.slime import discover_workers

    urls = [s.url for s in fleet.servers]
    assert [e.url for e in discover_workers(make_args(tmp_path, fleet))] == urls
    explicit = make_args(tmp_path, fleet, sglang_router_ip=None, tailsieve_engines=",".join(urls[:2]))
    assert [(e.url, e.kind) for e in discover_workers(explicit)] == [(u, "sglang-native") for u in urls[:2]]


@pytest.mark.parametrize(("change", "message"), [
    ({"sglang_router_port": 1}, "sglang-router http://127.0.0.1:1 unreachable"),
    ({"sglang_router_ip": None}, "no SGLang workers: set sglang_router_ip/port or TAILSIEVE_ENGINES"),
    ({"tailsieve_engines": "http://127.0.0.1:1"},
     "policy static needs at least 2 replicas (a tail and a bulk pool), got R=1"),
    ({"tailsieve_engines": "http://127.0.0.1:1,http://127.0.0.1:2"}, "no SGLang worker answers /health"),
    ({"rollout_batch_size": None}, "slime args lack rollout_batch_size"),
    ({"tailsieve_rho": "lots"}, "bad TailSieve setting"),
])
def test_bad_setups_are_one_line(tmp_path: Path, fleet: FakeFleet, change: dict[str, Any], message: str) -> None:
    args = make_args(tmp_path, fleet, **change)
    with pytest.raises(SlimeIntegrationError) as err:
        generate_rollout(args, 0, TailSieveDataSource(args))
    assert isinstance(err.value, TailSieveError) and message in str(err.value)
    assert "\n" not in str(err.value) and err.value.__cause__ is None and err.value.__suppress_context__


def test_the_modules_import_without_slime() -> None:
    import importlib.util

    assert importlib.util.find_spec("slime") is None  # the stand-ins are what this test run exercises
    from tailsieve.integrations.slime import sample_class

    assert sample_class() is SlimeSample


def test_every_sample_carries_the_weight_version_its_worker_reported(tmp_path: Path, fleet: FakeFleet) -> None:
    args = make_args(tmp_path, fleet)
    batches = run(args, TailSieveDataSource(args), 2, start=3)
    for k, b in enumerate(batches):
        for s in (s for g in b for s in g):
            assert s.weight_versions == ["7"]  # the fake workers' meta_info.weight_version
            assert s.metadata["tailsieve"]["weight_version"] == 3 + k  # what TailSieve stamped: the rollout id


def test_top_p_below_one_fills_the_kept_token_ids_slime_asserts_on(tmp_path: Path, fleet: FakeFleet) -> None:
    """With --rollout-top-p 0.9 every request asks for the top-p kept ids (custom_params), and every sample gets
    `rollout_top_p_token_ids` / `rollout_top_p_token_offsets` exactly as the worker sent them: offsets one per
    response token and one more, ending at the number of ids (slime/ray/rollout.py's assertions)."""
    from sglang_fake import top_p_kept

    for s in fleet.servers:
        s.top_p_patch = True
    args = make_args(tmp_path, fleet, rollout_top_p=0.9)
    batches = run(args, TailSieveDataSource(args), 3)
    assert all(b["sampling_params"]["custom_params"] == {"return_top_p_token_ids": True}
               and b["sampling_params"]["top_p"] == 0.9 for s in fleet.servers for b in s.bodies)
    for s in (s for b in batches for g in b for s in g):
        key = json.dumps(s.tokens[:3])
        kept = [top_p_kept(key, t) for t in range(s.response_length)]
        assert s.rollout_top_p_token_ids == [k for ids in kept for k in ids]
        offsets = s.rollout_top_p_token_offsets
        assert offsets is not None and len(offsets) == s.response_length + 1
        assert offsets[0] == 0 and offsets[-1] == len(s.rollout_top_p_token_ids)
        assert [b - a for a, b in pairwise(offsets)] == [len(ids) for ids in kept]


def test_top_p_on_unpatched_sglang_is_one_line_and_loses_no_group(tmp_path: Path, fleet: FakeFleet) -> None:
    """Stock SGLang ignores custom_params: the rollout is one line naming what is missing, the carry state has not
    moved (no group consumed, the carried prompt samples untouched), and once the workers answer, the same step
    runs again and every draw is consumed or carried exactly once."""
    args = make_args(tmp_path, fleet, rollout_top_p=0.9)
    ds = TailSieveDataSource(args)
    with pytest.raises(SlimeIntegrationError) as e:
        generate_rollout(args, 0, ds)
    text = str(e.value)
    assert text.startswith("TailSieve rollout 0: --rollout-top-p 0.9 < 1 needs the top-p kept token ids, and ")
    assert text.endswith("(it needs slime's SGLang patch, which answers custom_params return_top_p_token_ids)")
    assert "\n" not in text and e.value.__cause__ is None
    _, state = session_for(args, ds)
    assert state.loop is None and len(state.carry) == ds.source.group_index > 0
    assert all(s.tokens == [1000 + int(s.label), 7, 8] and s.response_length == 0
               for g in state.carry.values() for s in g)  # the failed batch was built on copies
    for server in fleet.servers:
        server.top_p_patch = True
    batch = generate_rollout(args, 0, ds)
    consumed = [g[0].label for g in batch]
    waiting = [g[0].label for g in state.carry.values()]
    assert len(batch) == N and state.loop is not None and state.loop.router.step == 1
    assert sorted(map(int, consumed + waiting)) == list(range(ds.source.group_index))


STUB = {  # the slime modules the reward path imports, reduced to their contract (no slime on the registries)
    "slime/__init__.py": "",
    "slime/utils/__init__.py": "",
    "slime/utils/async_utils.py": """
import asyncio, threading
LOOP = asyncio.new_event_loop()  # slime's persistent rollout loop (slime.utils.async_utils.run)
threading.Thread(target=LOOP.run_forever, name="stub-slime-loop", daemon=True).start()
def run(coro):
    return asyncio.run_coroutine_threadsafe(coro, LOOP).result()
""",
    "slime/rollout/__init__.py": "",
    "slime/rollout/rm_hub/__init__.py": """
import asyncio
CALLS, FAIL, BOUND = [], [], []
def _get_shared_session():  # slime's shared aiohttp session: bound to the loop it was created on
    loop = asyncio.get_running_loop()
    BOUND.append(loop) if not BOUND else None
    if loop is not BOUND[0]:
        raise RuntimeError("Timeout context manager should be used inside a task")  # aiohttp, on a foreign loop
async def async_rm(args, sample, **kw):
    _get_shared_session()
    if FAIL:
        raise FAIL.pop()
    CALLS.append(("one", sample.label))
    return float(len(sample.response))
async def batched_async_rm(args, samples, **kw):
    _get_shared_session()
    CALLS.append(("group", [s.label for s in samples]))
    return [float(i) for i in range(len(samples))]
""",
    "slime/rollout/sglang_rollout.py": """
from types import SimpleNamespace
from slime.rollout.rm_hub import async_rm
from slime.utils.async_utils import run
def generate_rollout(args, rollout_id, data_source, evaluation=False):  # slime's eval: its loop, its session
    return {"eval": {"rewards": [run(async_rm(args, SimpleNamespace(label="e", response="abc")))]}}
""",
}


@pytest.fixture
def stub_slime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    import importlib
    import sys

    for rel, text in STUB.items():
        (tmp_path / "stub" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "stub" / rel).write_text(text, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path / "stub"))
    hub = importlib.import_module("slime.rollout.rm_hub")
    yield hub
    loop = importlib.import_module("slime.utils.async_utils").LOOP
    loop.call_soon_threadsafe(loop.stop)
    for name in [m for m in sys.modules if m == "slime" or m.startswith("slime.")]:
        del sys.modules[name]


def test_rewards_run_on_slimes_loop_so_its_eval_can_reuse_the_rm_session(tmp_path: Path, fleet: FakeFleet,
                                                                         stub_slime: Any) -> None:
    """slime's reward hub (`--rm-type remote_rm`) keeps one HTTP session bound to the loop it first ran on: the
    training rewards run on slime's loop, so slime's own eval rollout (on that loop) uses the same session."""
    args = make_args(tmp_path, fleet)
    ds = TailSieveDataSource(args)
    batch = generate_rollout(args, 0, ds)
    flat = [s for g in batch for s in g]
    assert all(s.reward == float(len(s.response)) for s in flat)
    assert [("one", s.label) for s in flat] == stub_slime.CALLS  # slime's per-sample async_rm, once each
    assert generate_rollout(args, 0, ds, evaluation=True) == {"eval": {"rewards": [3.0]}}  # no foreign-loop error
    assert stub_slime.BOUND[0] is sys_modules("slime.utils.async_utils").LOOP


def test_group_rm_scores_each_whole_group(tmp_path: Path, fleet: FakeFleet, stub_slime: Any) -> None:
    args = make_args(tmp_path, fleet, group_rm=True)
    batch = generate_rollout(args, 0, TailSieveDataSource(args))
    assert [("group", [s.label for s in g]) for g in batch] == stub_slime.CALLS
    assert all([s.reward for s in g] == [0.0, 1.0] for g in batch)


def test_a_failing_reward_model_is_one_line_and_loses_no_group(tmp_path: Path, fleet: FakeFleet,
                                                               stub_slime: Any) -> None:
    args = make_args(tmp_path, fleet)
    ds = TailSieveDataSource(args)
    stub_slime.FAIL.append(ConnectionError("reward server refused the connection\nsecond line"))
    with pytest.raises(SlimeIntegrationError) as e:
        generate_rollout(args, 0, ds)
    assert str(e.value) == ("TailSieve rollout 0: reward model failed (ConnectionError: reward server refused the "
                            "connection); the step was not consumed and runs again on the next call")
    _, state = session_for(args, ds)
    assert state.loop is None and all(s.reward is None for g in state.carry.values() for s in g)
    batch = generate_rollout(args, 0, ds)
    consumed, waiting = [g[0].label for g in batch], [g[0].label for g in state.carry.values()]
    assert sorted(map(int, consumed + waiting)) == list(range(ds.source.group_index))
    assert all(s.reward is not None for g in batch for s in g)


def sys_modules(name: str) -> Any:
    import sys

    return sys.modules[name]
