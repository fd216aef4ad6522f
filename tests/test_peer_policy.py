"""The peer contract (`policy/peers/peer_policy.py`): a new peer is one registered module, and the token ledger
counts every token a peer throws away, including the ones it did not think of (issue 24's sketched peer that
discards prefixes older than k steps counted them as not wasted); a peer that invents tokens or loses a cut group
is refused with a one-line InvariantError."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace

import pytest

from conftest import make_curve
from tailsieve.policy.peers import PEERS, Carry, Lineup, PeerState, PeerStep, Waiting, make_peer, register_peer
from tailsieve.policy.peers.april_partial import AprilPartial
from tailsieve.policy.router import RouterConfig
from tailsieve.policy.step import GroupOutcome, InvariantError, StepPlan, StepResult
from tailsieve.simulation.executor import SimExecutor
from tailsieve.simulation.runs import SimConfig, policy_names, run_policy
from test_sim import fake_workload

RC = RouterConfig(groups=8, group_size=4, replicas=4, rho=0.5)


class DiscardOld(AprilPartial):
    """The sketched peer: partial rollout, but a prefix older than `k` steps is discarded (its group regenerated
    from scratch). It reports no waste of its own: the ledger must find it."""

    k = 1

    def lineup(self, state: PeerState) -> Lineup:
        line = AprilPartial.lineup(self, state)
        front = tuple(w if state.step - w.first_step <= self.k else replace(w, prefix=()) for w in line.front)
        return replace(line, front=front)


@pytest.fixture
def discard_old() -> Iterator[str]:
    register_peer("discard-old")(DiscardOld)
    try:
        yield "discard-old"
    finally:
        PEERS.pop("discard-old")


def drive(name: str, steps: int = 30) -> list[tuple[PeerState, StepPlan, StepResult, PeerStep]]:
    """(state before, plan, result, observed step) per step of a peer on SimExecutor."""
    w = fake_workload(60)
    pol = make_peer(name, RC, prompts=w.prompts)
    ex = SimExecutor(w, make_curve(), RC)
    state, out = pol.initial_state(), []
    for _ in range(steps):
        plan = pol.plan(state)
        result = ex.execute(plan)
        new, got = pol.observe(state, plan, result)
        out.append((state, plan, result, got))
        state = new
    return out


def test_a_registered_module_is_a_peer_the_simulator_runs(discard_old: str) -> None:
    assert discard_old in policy_names() and isinstance(make_peer(discard_old, RC, prompts=("a",)), DiscardOld)
    run = run_policy(discard_old, fake_workload(60), make_curve(), SimConfig(router=RC, steps=6))
    assert len(run.steps) == 6 and len(set(run.consumed_uids)) == 6 * RC.groups


def test_the_ledger_counts_the_discarded_prefixes_as_wasted(discard_old: str) -> None:
    total_discarded = 0
    for state, _, _, got in drive(discard_old):
        discarded = sum(sum(w.prefix) for w in state.waiting if state.step - w.first_step > DiscardOld.k)
        assert got.wasted_tokens == discarded  # the peer carries every cut group's tokens: only discards are waste
        kept_prefix = {w.ref.uid: sum(w.prefix) for w in state.waiting if state.step - w.first_step <= DiscardOld.k}
        assert got.offpolicy == tuple(kept_prefix.get(o.ref.uid, 0) for o in got.consumed)
        total_discarded += discarded
    assert total_discarded > 0  # the run does discard (else the test shows nothing)


@pytest.mark.parametrize("name", ["april-partial", "april-drop", "rollpacker", "discard-old"])
def test_every_token_generated_is_consumed_wasted_or_still_waiting(name: str, discard_old: str) -> None:
    """Conservation over a whole run, from the executor's outcomes alone: new tokens each step (every outcome's
    tokens minus the prefixes it resumed) = consumed tokens + wasted + the change of the prefix balance.
    april-partial wastes nothing; april-drop and rollpacker waste exactly the cut groups' tokens."""
    steps = drive(name)
    for i, (state, plan, result, got) in enumerate(steps[:-1]):
        new = sum(o.tokens for o in result.outcomes) - sum(sum(p) for p in plan.resume.values())
        consumed = sum(o.tokens for o in got.consumed)  # resumed prefixes included: they leave the balance
        after = steps[i + 1][0].prefix_tokens
        assert new == consumed + got.wasted_tokens + after - state.prefix_tokens
        cut = sum(o.tokens for o in result.outcomes if o not in got.consumed)
        if name == "april-partial":
            assert got.wasted_tokens == 0
        elif name in ("april-drop", "rollpacker"):
            assert got.wasted_tokens == cut
    assert sum(s[3].wasted_tokens for s in steps) > 0 or name == "april-partial"


class Inventor(AprilPartial):
    def carry(self, cut: Sequence[GroupOutcome], first: Mapping[int, int], step: int) -> Carry:
        got = AprilPartial.carry(self, cut, first, step)
        return Carry(tuple(replace(w, prefix=tuple(x + 1 for x in w.prefix)) for w in got.waiting))


class Forgetter(AprilPartial):
    def carry(self, cut: Sequence[GroupOutcome], first: Mapping[int, int], step: int) -> Carry:
        return Carry(AprilPartial.carry(self, cut, first, step).waiting[1:])


class Resumer(AprilPartial):
    def lineup(self, state: PeerState) -> Lineup:
        line = AprilPartial.lineup(self, state)
        return replace(line, front=tuple(Waiting(w.ref, w.first_step, (w.prefix[0] + 1, *w.prefix[1:]))
                                         for w in line.front))


@pytest.mark.parametrize(("cls", "message"), [
    (Inventor, r"^inventor step 0: group \d+ is carried with tokens it did not have at the cut$"),
    (Forgetter, r"^forgetter step 0: \d+ groups cut, \d+ carried and 0 dropped$"),
    (Resumer, r"^resumer step 1: group \d+ resumes a prefix that is not the one it waits with$"),
])
def test_a_peer_that_invents_or_loses_tokens_is_refused(cls: type[AprilPartial], message: str) -> None:
    cls.name = cls.__name__.lower()
    w = fake_workload(60)
    pol = cls(RC, prompts=w.prompts)
    ex = SimExecutor(w, make_curve(), RC)
    state = pol.initial_state()
    with pytest.raises(InvariantError, match=message):
        for _ in range(3):
            plan = pol.plan(state)
            state, _ = pol.observe(state, plan, ex.execute(plan))
