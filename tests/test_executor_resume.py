"""Partial rollout in `EngineExecutor` (april-partial): what a cut step carries (`Carried`: text, tokens, sample,
and the replica and weight version that generated the text) and how a resumed plan continues it. The executor and
its bookkeeping are the real ones; only the transport is scripted (fault injection: a request can stream its tokens
and then never end, as a stream cut after its last token arrived but before its end), so every case is exact and
independent of timing. The same on fake HTTP servers: tests/test_peer_rollout.py."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from tailsieve.engines.rollout.engine_executor import EngineExecutor, ExecutedStep, GroupSpec
from tailsieve.engines.transport.engine_client import (
    Choice,
    ClientOptions,
    Completion,
    Endpoint,
    EngineClient,
    Request,
    SamplingParams,
)
from tailsieve.engines.transport.health import FaultPolicy, Replicas
from tailsieve.engines.transport.types import Progress
from tailsieve.policy.step import GroupRef, GroupStatus, StepPlan
from tailsieve.policy.stream import StreamState

Script = Callable[[Request], tuple[int, bool]]  # a request -> (tokens it streams, whether its stream then ends)


class ScriptedClient(EngineClient):
    """A transport answering from a script: streams the tokens ("x" each) into the caller's progress, then returns
    (finish "length" at max_tokens, else "stop") or hangs until cancelled. Records every request sent."""

    def __init__(self, script: Script) -> None:
        super().__init__(ClientOptions(api_key_env=None))
        self.script = script
        self.sent: list[Request] = []

    async def complete(self, endpoint: Endpoint, model: str, req: Request, params: SamplingParams,
                       progress: list[int] | None = None) -> Completion:
        """As the real client: progress moves with each token; the completion comes at the stream's end."""
        self.sent.append(req)
        tokens, ends = self.script(req)
        if progress is not None:
            progress[0] = tokens
            if isinstance(progress, Progress):
                progress.texts[0] = ["x"] * tokens
        if not ends:
            await asyncio.Event().wait()  # the last token arrived; the stream never ends (cut here)
        finish = "length" if tokens == req.max_tokens else "stop"
        return Completion((Choice(0, "x" * tokens, tokens, finish, tuple(range(tokens))),), 3, 0.01, 0.001)


def plan(step: int, uids: tuple[int, ...], quota: int, resume: dict[int, tuple[int, ...]] | None = None) -> StepPlan:
    """A bulk-only plan on replicas 0 and 1 (member j of every group on replica j), groups of two."""
    bulk = tuple(GroupRef(u, f"p{u}") for u in uids)
    return StepPlan(step, (), bulk, {u: (0, 1) for u in uids}, (), (0, 1), quota, False,
                    StreamState(len(uids), False, 0, len(uids)), (), frozenset(), resume or {})


BUDGET = {0: (8, 8), 1: (3, 3), 2: (6, 6)}  # per group, each member's max_tokens


def spec(ref: GroupRef) -> GroupSpec:
    return GroupSpec(f"prompt {ref.uid}|", (11, 12), BUDGET[ref.uid])


def run(script: Script, steps: list[tuple[StepPlan, int]]) -> tuple[list[ExecutedStep], list[list[Request]]]:
    """Execute the plans in order on one partial executor (each with its weight version); the requests per step."""
    client = ScriptedClient(script)

    async def go() -> tuple[list[ExecutedStep], list[list[Request]]]:
        reps = Replicas([Endpoint("http://127.0.0.1:9"), Endpoint("http://127.0.0.1:10")], client, FaultPolicy())
        ex = EngineExecutor(reps, "fake", SamplingParams(max_tokens=500), 2)
        ex.partial = True
        out, sent = [], []
        try:
            for p, version in steps:
                ex.weight_version = version
                before = len(client.sent)
                out.append(await ex.execute(p, spec))
                sent.append(client.sent[before:])
        finally:
            await reps.close()
        return out, sent

    return asyncio.run(go())


def member(req: Request) -> tuple[int, int, int]:
    """(step, group uid, member) of a request id `ts-{step}-{uid}-{member}-{attempt}`."""
    _, step, uid, j, _ = req.rid.split("-")
    return int(step), int(uid), int(j)


def test_a_member_cut_with_its_whole_budget_streamed_finishes_there_and_is_not_sent_again() -> None:
    """Step 0: group 1 completes (the quota) while group 0's member 0 has streamed all 8 tokens of its budget but
    not its end, and member 1 has 5. Step 1 (weights updated to version 1) resumes group 0: member 0 is finished at
    its budget ("length", its text, the replica and weight version 0 that generated it), no request is sent for it
    (a resent one would decode a 9th token); member 1 is sent its prompt + 5 tokens with max_tokens 3."""

    def script(req: Request) -> tuple[int, bool]:
        step, uid, j = member(req)
        if step == 0 and uid == 0:
            return (8, False) if j == 0 else (5, False)
        return int(req.max_tokens or 0), True

    (first, second), (_, sent) = run(script, [(plan(0, (0, 1), 1), 0), (plan(1, (0,), 1, {0: (8, 5)}), 1)])
    cut = {o.ref.uid: o for o in first.outcomes}
    assert cut[0].status is GroupStatus.ABORTED and cut[0].lengths == (8, 5)
    assert [(r.rid, r.prompt, r.max_tokens) for r in sent] == [("ts-1-0-1-0", "prompt 0|xxxxx", 3)]
    (done,) = second.outcomes
    assert done.status is GroupStatus.DONE and done.lengths == (8, 8)
    at_cap, resumed = second.samples[0]
    assert at_cap is not None and resumed is not None
    assert (at_cap.text, at_cap.tokens, at_cap.finish_reason, at_cap.replica, at_cap.weight_version) == \
        ("x" * 8, 8, "length", 0, 0)
    assert at_cap.token_ids is None and at_cap.logprobs is None  # the carried text's ids are not kept
    assert (resumed.text, resumed.tokens, resumed.replica, resumed.weight_version) == ("x" * 8, 8, 1, 1)


def test_a_resumed_group_with_nothing_left_to_send_is_complete_at_once_and_counts_for_the_cutoff() -> None:
    """Group 0 was cut with member 0 at its budget and member 1 finished (4 tokens, "stop"): resuming it sends
    nothing, it is DONE at dispatch and meets the quota of 1, so the fresh group 2 of the same plan is cut before
    it is sent (the cutoff rule: the first `quota` complete groups are kept)."""

    def script(req: Request) -> tuple[int, bool]:
        step, uid, j = member(req)
        if step == 0 and uid == 0:
            return (8, False) if j == 0 else (4, True)
        return int(req.max_tokens or 0), True

    (first, second), (_, sent) = run(script, [(plan(0, (0, 1), 1), 0), (plan(1, (0, 2), 1, {0: (8, 4)}), 0)])
    assert {o.ref.uid: o.lengths for o in first.outcomes}[0] == (8, 4)
    assert sent == []
    outs = {o.ref.uid: o for o in second.outcomes}
    assert outs[0].status is GroupStatus.DONE and outs[0].lengths == (8, 4)
    assert outs[2].status is GroupStatus.ABORTED and outs[2].lengths == (0, 0)
    assert [s.finish_reason for s in second.samples[0] if s is not None] == ["length", "stop"]
    assert second.bulk_s == outs[0].finish_s and second.bulk_s is not None and second.bulk_s < 1.0


def test_a_resumed_member_below_its_budget_decodes_only_the_rest() -> None:
    """The unchanged path beside the fix: a member cut at 2 of 6 tokens is resent with its text and max_tokens 4 and
    ends at exactly its budget, under the version it was resent with."""

    def script(req: Request) -> tuple[int, bool]:
        step, uid, _ = member(req)
        if step == 0 and uid == 2:
            return 2, False
        return int(req.max_tokens or 0), True

    (_, second), (_, sent) = run(script, [(plan(0, (2, 1), 1), 0), (plan(1, (2,), 1, {2: (2, 2)}), 3)])
    assert sorted((r.prompt, r.max_tokens) for r in sent) == [("prompt 2|xx", 4)] * 2
    assert [(s.tokens, s.text, s.weight_version) for s in second.samples[2] if s is not None] == [(6, "x" * 6, 3)] * 2
