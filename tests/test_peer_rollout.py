"""Peers on (fake) real replicas: `PeerRollout` through the engine executor, `tailsieve rollout --policy a,b,c`
interleaving peers with TailSieve on one prompt stream, the fidelity columns from real outcomes, exactly-once
consumption, and the plans the executor refuses (a resumed prefix) with one line before anything is sent. The same
on real vLLM servers: tests/test_real_vllm.py::test_peers_and_tailsieve_interleave_on_real_replicas."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from engine_fake import FakeServer
from tailsieve.cli import main
from tailsieve.engines.rollout.api import Batch, RolloutConfig
from tailsieve.engines.rollout.engine_executor import PlanNotRunnable
from tailsieve.engines.rollout.peer_rollout import PeerRollout, make_rollout
from tailsieve.engines.rollout.prompts import PromptRecord
from tailsieve.engines.transport.engine_client import SamplingParams
from tailsieve.errors import ConfigError
from tailsieve.policy.peers import make_peer
from tailsieve.policy.step import GroupStatus
from tailsieve.workloads import load_workload

PROMPTS = tuple(PromptRecord(f"p{i}", f"prompt number {i}") for i in range(40))
FIDELITY = {"off_policy_token_share", "dropped_prompt_share", "delayed_prompt_share", "batch_length_cv"}


@pytest.fixture
def two() -> Iterator[list[FakeServer]]:
    with FakeServer() as a, FakeServer() as b:
        yield [a, b]


def test_make_rollout_gives_a_peer_config_a_peer_rollout_that_consumes_exactly_once(two: list[FakeServer]) -> None:
    cfg = RolloutConfig(groups=4, group_size=3, rho=0.5, policy="rollpacker", sampling=SamplingParams(max_tokens=40))

    async def go() -> list[tuple[int, ...]]:
        async with make_rollout([s.url for s in two], cfg, PROMPTS) as r:
            assert isinstance(r, PeerRollout)
            out = []
            for _ in range(4):
                b = await r.step()
                assert len(b.groups) == 4 and all(len(g.samples) == 3 for g in b.groups)
                cut = [o for o in b.outcomes if o.status is GroupStatus.ABORTED]
                assert len(b.outcomes) in (4, 6) and (b.record.note == "long round") == (len(b.outcomes) == 4)
                assert b.record.wasted_tokens == sum(o.tokens for o in cut)  # rollpacker regenerates: all wasted
                out.append(tuple(g.uid for g in b.groups))
            return out

    batches = asyncio.run(go())
    uids = [u for b in batches for u in b]
    assert len(uids) == len(set(uids)) == 16


def test_the_same_peer_plans_the_same_steps_as_in_simulation(two: list[FakeServer]) -> None:
    """Step 0 of verl-lif on the engines: the peer's own plan (request round-robin), every group consumed."""
    cfg = RolloutConfig(groups=4, group_size=3, rho=0.5, policy="verl-lif", sampling=SamplingParams(max_tokens=20))
    plan = make_peer("verl-lif", cfg.router(2), prompts=[p.prompt_id for p in PROMPTS]).plan(
        make_peer("verl-lif", cfg.router(2), prompts=[p.prompt_id for p in PROMPTS]).initial_state())

    async def go() -> tuple[int, ...]:
        async with make_rollout([s.url for s in two], cfg, PROMPTS) as r:
            b = await r.step()
            assert all(s.replica == plan.placement[g.uid][j] for g in b.groups for j, s in enumerate(g.samples))
            return tuple(g.uid for g in b.groups)

    assert asyncio.run(go()) == tuple(ref.uid for ref in plan.bulk) == (0, 1, 2, 3)


def test_a_resumed_prefix_the_executor_cannot_run_is_refused_before_anything_is_sent(two: list[FakeServer]) -> None:
    with pytest.raises(ConfigError, match=r"^peer april-partial resumes cut requests from their text, which needs "
                                          r"streamed completions with one request per member \(docs/peers.md\)$"):
        RolloutConfig(policy="april-partial", stream=False)
    cfg = RolloutConfig(groups=4, group_size=3, rho=0.5, policy="april-drop", sampling=SamplingParams(max_tokens=20))

    async def go() -> None:
        async with make_rollout([s.url for s in two], cfg, PROMPTS) as r:
            assert r.executor is not None and not r.executor.partial
            plan = make_peer("april-drop", r.rc, prompts=[p.prompt_id for p in PROMPTS]).plan(r.pstate)
            before = sum(s.started for s in two)
            with pytest.raises(PlanNotRunnable, match=r"^step 0: the plan resumes 1 cut group\(s\) from their tokens, "
                                                      r"which this executor cannot run \(the executor does not keep "
                                                      r"cut requests' output \(EngineExecutor.partial\)\); nothing "
                                                      r"was sent$"):
                await r.executor.execute(replace(plan, resume={plan.bulk[0].uid: (3, 3, 3)}))
            r.executor.partial = True  # on, but the group was not cut last step
            with pytest.raises(PlanNotRunnable, match=r"group 0 was not cut last step with the tokens the plan"):
                await r.executor.execute(replace(plan, resume={plan.bulk[0].uid: (3, 3, 3)}))
            assert sum(s.started for s in two) == before

    asyncio.run(go())


def test_april_partial_resumes_cut_members_from_their_text_on_the_replicas(two: list[FakeServer],
                                                                          tmp_path: Path) -> None:
    """Fixed-length replay (every generation of prompt p is L_p tokens): a resumed member is sent its prompt plus its
    text so far with max_tokens = L_p − its tokens so far, ends at exactly L_p tokens with the prefix in its text, and
    the batch reports those prefix tokens as off-policy; finished members of a cut group are not sent again."""
    trace = tmp_path / "lengths.csv"
    lens = {f"p{i}": 400 if i % 3 == 1 else 20 + i for i in range(40)}
    trace.write_text("prompt_id,response_tokens\n" + "".join(f"{p},{n}\n{p},{n}\n" for p, n in lens.items()))
    cfg = RolloutConfig(groups=4, group_size=3, rho=0.5, policy="april-partial", replay=load_workload(str(trace)),
                        sampling=SamplingParams(max_tokens=500))

    async def go() -> list[Batch]:
        async with make_rollout([s.url for s in two], cfg, PROMPTS) as r:
            assert r.executor is not None and r.executor.partial
            return [await r.step() for _ in range(4)]

    batches = asyncio.run(go())
    uids = [g.uid for b in batches for g in b.groups]
    assert len(uids) == len(set(uids)) == 16
    assert all(s.tokens == lens[g.prompt_id] for b in batches for g in b.groups for s in g.samples)
    resumed = [(b, g, o) for b in batches for g, o in zip(b.groups, b.offpolicy, strict=True) if o > 0]
    assert resumed  # some cut group was resumed and consumed
    bodies = [body for s in two for body in s.bodies]
    rids = [next(v for k, v in h.items() if k.lower() == "x-request-id") for s in two for h in s.headers]
    sent = [(rid.split("-"), x) for rid, x in zip(rids, [x for s in two for x in s.bodies], strict=True)]
    for b, g, off in resumed:
        prompt, n = render_prompt(g.prompt_id), lens[g.prompt_id]
        cont = [x for x in bodies if x["prompt"].startswith(prompt + "x") and set(x["prompt"][len(prompt):]) == {"x"}]
        assert cont and all(x["prompt"] == prompt + "x" * (n - x["max_tokens"]) for x in cont)
        # its off-policy tokens: all but those decoded in the step that consumed it (each of that step's requests for
        # it ran to its max_tokens); a member that had finished, or was cut with its whole budget streamed, is not
        # sent again (ts-{step}-{uid}-{member}-{attempt})
        now = [x["max_tokens"] for rid, x in sent if rid[1:3] == [str(b.step), str(g.uid)]]
        assert off == 3 * n - sum(now)
        assert all(s.text == "x" * n for s in g.samples)
        assert b.record.wasted_tokens == 0
    assert sum(o for b in batches for o in b.offpolicy) == sum(o for _, _, o in resumed)


def render_prompt(prompt_id: str) -> str:
    return next(p.text for p in PROMPTS if p.prompt_id == prompt_id)


def test_rollout_interleaves_peers_and_tailsieve_with_fidelity_columns(two: list[FakeServer], tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    policies = ["uniform", "verl-lif", "rollpacker", "april-drop", "openrlhf-group", "tailsieve"]
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"question_id": f"q{i}", "question": f"what is {i}+{i}?"}) + "\n"
                               for i in range(40)))
    assert main(["rollout", "--endpoints", ",".join(s.url for s in two), "--prompts", str(prompts), "--groups", "4",
                 "--group-size", "3", "--rho", "0.5", "--max-tokens", "30", "--stall-timeout", "2", "--steps", "4",
                 "--policy", ",".join(policies), "--out", str(out)]) == 0
    rep = json.loads((out / "report.json").read_text())
    assert list(rep["policies"]) == policies
    for name in policies:
        pol = rep["policies"][name]
        assert set(pol["fidelity"]) >= FIDELITY, name
        lines = [json.loads(x) for x in (out / name / "steps.jsonl").read_text().splitlines()]
        uids = [u for line in lines for u in line["uids"]]
        assert len(uids) == len(set(uids)) == 16, name  # exactly once
        assert all(len(line["delays"]) == len(line["uids"]) for line in lines)
        # the report's shares, from the step lines by hand (window: all steps but the first 2)
        win = lines[2:]
        dropped = sum(line["dropped"] for line in win)
        consumed = sum(len(line["uids"]) for line in win)
        assert pol["fidelity"]["dropped_prompt_share"] == pytest.approx(dropped / (consumed + dropped))
        delayed = sum(d >= 2 for line in win for d in line["delays"])
        assert pol["fidelity"]["delayed_prompt_share"] == pytest.approx(delayed / consumed)
        means = [np.mean(line["lengths"]) for line in win]
        assert pol["fidelity"]["batch_length_cv"] == pytest.approx(np.std(means) / np.mean(means))
        assert pol["fidelity"]["off_policy_token_share"] == 0.0
    printed = capsys.readouterr().out
    assert all(col in printed for col in ("off-policy", "dropped", "delayed", "CV"))  # simulate's fidelity columns
    drops = [json.loads(x)["dropped"] for x in (out / "april-drop" / "steps.jsonl").read_text().splitlines()]
    assert drops == [2, 2, 2, 2]  # E = ⌈0.5·4⌉ groups started beyond N, all cut and dropped every step
    assert json.loads((out / "rollpacker" / "state.json").read_text())["resumable"] is False
    code = main(["rollout", "--endpoints", ",".join(s.url for s in two), "--prompts", str(prompts), "--groups", "4",
                 "--group-size", "3", "--steps", "5", "--policy", "rollpacker", "--resume", "--out", str(out)])
    assert code != 0
    assert "rollpacker cannot be resumed yet; choose another --out" in capsys.readouterr().err
