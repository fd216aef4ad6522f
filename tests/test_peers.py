"""The peer policies (`tailsieve.policy.peers`, run by `simulation.runs`): hand-computed steps on constant-τ toy
workloads (APRIL's resumed prefixes and off-policy share, dropped prompts, RollPacker's long rounds and delays, verl's
request split), brute-force least-in-flight placement, exactly-once invariants, knob validation."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pytest
from numpy.typing import NDArray

from conftest import make_curve
from tailsieve.analysis.fidelity import batch_fidelity
from tailsieve.analysis.metrics import summarize
from tailsieve.cli import main
from tailsieve.errors import ConfigError
from tailsieve.policy.control_state import ControllerConfig
from tailsieve.policy.peers import PEERS, PeerConfig, make_peer
from tailsieve.policy.router import RouterConfig
from tailsieve.policy.step import GroupRef, InvariantError
from tailsieve.simulation.executor import SimExecutor
from tailsieve.simulation.runs import SimConfig, check_policy, policy_names, run_policies, run_policy
from tailsieve.workloads import ReplayMode, Workload
from test_sim import fake_workload

FLAT = make_curve(batch=(1, 2), tpot_ms=(10.0, 10.0))  # τ(b) = 10 ms for every b: a request takes L / 100 s
STEEP = make_curve(batch=(1, 2), tpot_ms=(10.0, 20.0))  # τ(1) = 10 ms, τ(2) = 20 ms


@dataclass(frozen=True, slots=True)
class Fixed:
    """Every generation of prompt p{i} has the same lengths: `table[i % len(table)]`."""

    table: tuple[tuple[int, ...], ...]

    def lengths(self, prompt_id: str, generation: int, step: int, group_size: int) -> NDArray[np.int64]:
        return np.array(self.table[int(prompt_id[1:]) % len(self.table)][:group_size], dtype=np.int64)


def toy(table: tuple[tuple[int, ...], ...], n_prompts: int = 40) -> Workload:
    return Workload("toy", tuple(f"p{i}" for i in range(n_prompts)), None, ReplayMode.RESAMPLE, 0, Fixed(table))


def one_group(steps: int, **peer: object) -> SimConfig:
    """R = 2, N = 1 group of G = 1, E = 1: two groups start, one is kept."""
    return SimConfig(router=RouterConfig(groups=1, group_size=1, replicas=2, rho=1.0), steps=steps,
                     peers=PeerConfig(**peer))  # type: ignore[arg-type]


ALTERNATING = ((100,), (300,))  # p even: 100 tokens (1 s), p odd: 300 tokens (3 s)


def test_april_partial_resumes_prefixes_by_hand() -> None:
    # step 0: p0 | p1 → p0 done at 1 s, p1 cut with 100.  step 1: p1 (100 + 200 left) | p2 → p2 at 1 s, p1 at 200.
    # step 2: p1 (100 left) | p3 → p1 done at 1 s: 300 tokens, 200 of them from earlier steps; p3 cut at 100.
    # step 3: p3 (200 left) | p4 → p4.  step 4: p3 (100 left) | p5 → p3 (200 off-policy).
    run = run_policy("april-partial", toy(ALTERNATING), FLAT, one_group(5))
    assert [s.makespan_s for s in run.steps] == pytest.approx([1.0] * 5)
    assert [int(b[0, 0]) for b in run.batch_lengths] == [100, 100, 300, 100, 300]
    assert [int(o[0]) for o in run.batch_offpolicy] == [0, 0, 200, 0, 200]
    assert [int(d[0]) for d in run.batch_delays] == [0, 0, 2, 0, 2]
    assert [s.note for s in run.steps] == ["", "resumed 1", "resumed 1", "resumed 1", "resumed 1"]
    fid = batch_fidelity(run, skip=0)
    assert fid.off_policy_token_share == pytest.approx(400 / 900)
    assert fid.delayed_prompt_share == pytest.approx(2 / 5)
    assert fid.dropped_prompt_share == 0.0
    means = np.array([100, 100, 300, 100, 300], dtype=float)
    assert fid.batch_length_cv == pytest.approx(means.std() / means.mean())
    assert all(s.wasted_tokens == 0 for s in run.steps)  # a resumed prefix is not wasted


def test_april_partial_finished_members_stay_finished() -> None:
    # G = 2, request dispatch: member j of every group on replica j. Step 0: p0 = (100, 100) done at 1 s; p1 =
    # (100, 300) is cut at 1 s with (100, 100): its first member has finished.
    cfg = SimConfig(router=RouterConfig(groups=1, group_size=2, replicas=2, rho=1.0), steps=2)
    run = run_policy("april-partial", toy(((100, 100), (100, 300))), FLAT, cfg)
    # step 1: p1 resumes with prefix (100, 100): 200 tokens left on one member, 2 s; p2 = (100, 100) done at 1 s.
    assert [s.makespan_s for s in run.steps] == pytest.approx([1.0, 1.0])
    assert int(run.batch_offpolicy[1][0]) == 0  # p2 consumed, p1 cut again
    run3 = run_policy("april-partial", toy(((100, 100), (100, 300))), FLAT,
                      SimConfig(router=cfg.router, steps=3))
    # step 2: p1 (100, 200 generated) needs 100 more: done at 1 s with 100 + 200 = 300 off-policy tokens of 400
    assert run3.batch_lengths[2].tolist() == [[100, 300]]
    assert int(run3.batch_offpolicy[2][0]) == 300


def test_april_drop_drops_the_cut_prompts() -> None:
    run = run_policy("april-drop", toy(ALTERNATING), FLAT, one_group(4))
    assert [int(b[0, 0]) for b in run.batch_lengths] == [100] * 4  # every long prompt is dropped
    assert run.step_dropped == (1, 1, 1, 1)
    assert [s.wasted_tokens for s in run.steps] == [100] * 4  # the dropped prompt's tokens at the 1 s cut
    fid = batch_fidelity(run, skip=0)
    assert fid.dropped_prompt_share == pytest.approx(0.5)
    assert fid.off_policy_token_share == 0.0 and fid.delayed_prompt_share == 0.0


def test_rollpacker_long_rounds_by_hand() -> None:
    # default trigger: a long round as soon as N = 1 deferred prompt waits → short, long, short, long …
    run = run_policy("rollpacker", toy(ALTERNATING), FLAT, one_group(4))
    assert [s.makespan_s for s in run.steps] == pytest.approx([1.0, 3.0, 1.0, 3.0])
    assert [s.note for s in run.steps] == ["", "long round", "", "long round"]
    assert [int(d[0]) for d in run.batch_delays] == [0, 1, 0, 1]  # regenerated the next step: not delayed > 1
    # every 3 steps: steps 0, 1 short (p1, p3 deferred), step 2 long (p1, delay 2), 3, 4 short, 5 long (p3, delay 4)
    run = run_policy("rollpacker", toy(ALTERNATING), FLAT, one_group(6, long_round_period=3))
    assert [s.note for s in run.steps] == ["", "", "long round", "", "", "long round"]
    assert [int(d[0]) for d in run.batch_delays] == [0, 0, 2, 0, 0, 4]
    assert [int(b[0, 0]) for b in run.batch_lengths] == [100, 100, 300, 100, 100, 300]
    assert [s.candidates for s in run.steps] == [1, 2, 1, 2, 3, 2]  # deferred prompts waiting after each step
    fid = batch_fidelity(run, skip=0)
    assert fid.delayed_prompt_share == pytest.approx(2 / 6) and fid.off_policy_token_share == 0.0


def test_verl_lif_splits_a_group_and_openrlhf_keeps_it() -> None:
    # one group (300, 100) on R = 2: uniform / openrlhf-group decode both on one replica: 100 tokens at τ(2) = 20 ms
    # (2 s) then 200 at τ(1) (2 s) = 4 s; verl-lif sends each request to its own replica: 300 at 10 ms = 3 s.
    cfg = SimConfig(router=RouterConfig(groups=1, group_size=2, replicas=2), steps=2)
    runs = run_policies(["verl-lif", "openrlhf-group"], toy(((300, 100),)), STEEP, cfg)
    assert [s.makespan_s for s in runs["uniform"].steps] == pytest.approx([4.0, 4.0])
    assert [s.makespan_s for s in runs["openrlhf-group"].steps] == pytest.approx([4.0, 4.0])
    assert [s.makespan_s for s in runs["verl-lif"].steps] == pytest.approx([3.0, 3.0])


def brute_least_in_flight(units: int, size: int, replicas: int) -> list[int]:
    """Replica of each unit, assigned one by one to the replica with the fewest in-flight requests (lowest id)."""
    load = [0] * replicas
    out = []
    for _ in range(units):
        k = min(range(replicas), key=lambda r: (load[r], r))
        load[k] += size
        out.append(k)
    return out


@pytest.mark.parametrize(("n", "g", "r"), [(5, 3, 4), (7, 8, 3), (2, 1, 5)])
def test_fewest_in_flight_at_t0_is_round_robin(n: int, g: int, r: int) -> None:
    rc = RouterConfig(groups=n, group_size=g, replicas=r)
    prompts = tuple(f"p{i}" for i in range(n))
    lif = make_peer("verl-lif", rc, prompts=prompts).plan(make_peer("verl-lif", rc, prompts=prompts).initial_state())
    flat = [k for ref in lif.bulk for k in lif.placement[ref.uid]]
    assert flat == brute_least_in_flight(n * g, 1, r)  # request by request
    grp = make_peer("openrlhf-group", rc, prompts=prompts)
    plan = grp.plan(grp.initial_state())
    assert [plan.placement[ref.uid][0] for ref in plan.bulk] == brute_least_in_flight(n, g, r)
    assert all(len(set(plan.placement[ref.uid])) == 1 for ref in plan.bulk)  # a group stays on one engine


def test_openrlhf_group_equals_uniform_on_a_heavy_tail() -> None:
    cfg = SimConfig(router=RouterConfig(groups=16, group_size=4, replicas=4), steps=5)
    runs = run_policies(["openrlhf-group"], fake_workload(), make_curve(), cfg)
    assert [s.makespan_s for s in runs["openrlhf-group"].steps] == [s.makespan_s for s in runs["uniform"].steps]


@pytest.mark.parametrize("name", PEERS)
def test_every_prompt_consumed_once_or_dropped(name: str) -> None:
    cfg = SimConfig(router=RouterConfig(groups=16, group_size=4, replicas=4, rho=0.25), steps=12,
                    peers=PeerConfig(long_round_period=4 if name == "rollpacker" else None))
    run = run_policy(name, fake_workload(60), make_curve(), cfg)
    assert all(b.shape == (16, 4) for b in run.batch_lengths)  # exactly N complete groups every step
    assert len(set(run.consumed_uids)) == len(run.consumed_uids) == 16 * 12
    dropped = sum(run.step_dropped)
    waiting = run.steps[-1].candidates
    drawn = max(run.consumed_uids) + 1 if name in ("verl-lif", "openrlhf-group") else None
    assert drawn is None or drawn == len(run.consumed_uids)
    assert (dropped > 0) == (name == "april-drop")
    assert waiting >= 0
    offp = int(sum(int(o.sum()) for o in run.batch_offpolicy))
    assert (offp > 0) == (name == "april-partial")
    assert run.own_routing


def test_observe_rejects_a_lost_group() -> None:
    rc = RouterConfig(groups=2, group_size=1, replicas=2, rho=0.5)
    pol = make_peer("april-partial", rc, prompts=("p0", "p1", "p2"))
    state = pol.initial_state()
    plan = pol.plan(state)
    result = SimExecutor(toy(ALTERNATING, 3), FLAT, rc).execute(plan)
    broken = type(result)(result.step, result.outcomes[1:], result.tail_s, result.bulk_s, result.makespan_s)
    with pytest.raises(InvariantError, match="lost or duplicated"):
        pol.observe(state, plan, broken)


def test_resuming_a_group_that_was_not_cut_is_refused() -> None:
    rc = RouterConfig(groups=1, group_size=1, replicas=2, rho=1.0)
    pol = make_peer("april-partial", rc, prompts=("p0", "p1"))
    plan = pol.plan(pol.initial_state())
    bogus = type(plan)(**{f: getattr(plan, f) for f in plan.__slots__} | {"resume": {plan.bulk[0].uid: (5,)}})
    with pytest.raises(InvariantError, match="was not cut"):
        SimExecutor(toy(ALTERNATING, 2), FLAT, rc).execute(bogus)


@pytest.mark.parametrize(("kw", "msg"), [
    ({"oversample": -0.1}, "oversample must lie in \\[0, 4\\], got -0.1"),
    ({"oversample": float("nan")}, "oversample must lie in \\[0, 4\\], got nan"),
    ({"long_round_period": 1}, "long_round_period must be an integer >= 2 or None, got 1"),
    ({"long_round_period": True}, "got True"),
])
def test_peer_config_names_the_bad_value(kw: dict[str, object], msg: str) -> None:
    with pytest.raises(ConfigError, match=msg):
        PeerConfig(**kw)  # type: ignore[arg-type]


def test_oversample_sets_e() -> None:
    rc = RouterConfig(groups=64, rho=0.1)
    assert PeerConfig().extra(rc) == 7 and PeerConfig(oversample=0.25).extra(rc) == 16
    assert PeerConfig(oversample=0.0).extra(rc) == 0


def test_registry_lists_and_validates_the_peers() -> None:
    assert policy_names()[-len(PEERS):] == tuple(PEERS) == ("april-partial", "april-drop", "verl-lif", "rollpacker",
                                                           "openrlhf-group")
    for name in PEERS:
        check_policy(name, 1)  # every replica bulk: one replica is enough
    with pytest.raises(ConfigError, match="unknown peer policy 'slime'"):
        make_peer("slime", RouterConfig())
    assert GroupRef(0, "p0").cuts == 0


SMALL = ["--groups", "8", "--group-size", "2", "--replicas", "2", "--steps", "4", "--workload", "synthetic-math"]


def test_simulate_json_has_fidelity_for_every_policy(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", *SMALL, "--policy", "tailsieve," + ",".join(PEERS), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert list(doc["policies"]) == ["uniform", "tailsieve", *PEERS]
    assert doc["peers"] == {"oversample": None, "extra": 1, "long_round_period": None}
    for name, pol in doc["policies"].items():
        assert set(pol["fidelity"]) == {"off_policy_token_share", "dropped_prompt_share", "delayed_prompt_share",
                                        "batch_length_cv"}, name
        assert "speedup" in pol and "bias" in pol
    assert doc["policies"]["uniform"]["fidelity"]["off_policy_token_share"] == 0.0
    assert doc["policies"]["tailsieve"]["fidelity"]["off_policy_token_share"] == 0.0
    assert doc["policies"]["tailsieve"]["fidelity"]["dropped_prompt_share"] == 0.0


@pytest.mark.parametrize(("args", "msg"), [
    (["--policy", "verl-lif", "--oversample", "0.2"], "--oversample sets april-partial"),
    (["--policy", "april-drop", "--long-round-period", "3"], "--long-round-period sets rollpacker"),
    (["--policy", "rollpacker", "--long-round-period", "1"], "--long-round-period: long_round_period must be"),
    (["--policy", "april-partial", "--oversample", "9"], "--oversample: oversample must lie in \\[0, 4\\], got 9"),
])
def test_simulate_rejects_bad_peer_flags(args: list[str], msg: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", *SMALL, *args]) != 0
    assert pytest.importorskip("re").search(msg, capsys.readouterr().err)


def test_tailsieve_delays_are_at_most_one_step_at_the_default_redraw_limit() -> None:
    """Started in a split (m0 = R/2: isolation does not pay on this workload, so from the uniform boundary the
    controller would never cut a group), every cut group is regenerated the very next step, and the return to
    uniform runs the waiting candidates at once: no group waits two steps."""
    runs = run_policies(["tailsieve"], fake_workload(60), make_curve(),
                        SimConfig(router=RouterConfig(groups=16, group_size=4, replicas=4, rho=0.25), steps=12,
                                  controller=ControllerConfig(m0=2)))
    assert any(r.m > 0 for r in runs["tailsieve"].steps)
    delays = np.concatenate(runs["tailsieve"].batch_delays)
    assert delays.max() == 1  # cut groups are regenerated the step after, never later
    s = summarize(runs)["tailsieve"]
    assert s.batch is not None and s.batch.off_policy_token_share == 0.0 and s.batch.dropped_prompt_share == 0.0
    assert s.batch.delayed_prompt_share == pytest.approx(float((np.concatenate(
        runs["tailsieve"].batch_delays[2:]) >= 2).mean()))
