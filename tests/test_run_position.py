"""`RunPosition` (engines/rollout/run_position.py): where a rollout stands between steps. Its fingerprint (the run
shape a saved state must match), the `RolloutState` it snapshots, the restore that takes this run's state and refuses
another's in one line without changing anything, and the first-dispatch steps that give a consumed group its delay.
Steps are the shared step loop's on the simulator (the rollout runs the same loop on replicas:
tests/test_engine_rollout.py, tests/test_resume.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from conftest import make_curve
from tailsieve.engines.rollout.prompts import PromptRecord
from tailsieve.engines.rollout.rollout_config import RolloutConfig
from tailsieve.engines.rollout.run_position import RunPosition, fingerprint
from tailsieve.engines.transport.engine_client import SamplingParams
from tailsieve.errors import ConfigError
from tailsieve.hashing import stable_hash
from tailsieve.loop import StepLoop, build_loop
from tailsieve.simulation.executor import SimExecutor
from test_sim import fake_workload

PROMPTS = tuple(PromptRecord(f"p{i}", f"prompt {i}") for i in range(30))
CFG = RolloutConfig(groups=4, group_size=2, rho=0.5, policy="static", q=1, m=1, sampling=SamplingParams(max_tokens=8))
WL = fake_workload(30)


def position(cfg: RolloutConfig = CFG) -> tuple[RunPosition, StepLoop]:
    loop = build_loop(cfg.policy_spec(3), [p.prompt_id for p in PROMPTS])
    return RunPosition(loop.initial(), cfg.policy, fingerprint(loop.router.config, cfg, PROMPTS)), loop


def test_the_fingerprint_is_the_run_shape() -> None:
    pos, loop = position(replace(CFG, seed=5, shuffle=True))
    ids = stable_hash("\n".join(f"p{i}" for i in range(30)))
    assert pos.fingerprint == {"groups": 4, "group_size": 2, "replicas": 3, "rho": 0.5, "prompts": 30,
                               "prompt_ids": f"{ids:016x}", "seed": 5, "shuffle": True}
    assert fingerprint(loop.router.config, CFG, PROMPTS[:-1])["prompt_ids"] != pos.fingerprint["prompt_ids"]


def test_a_snapshot_restores_the_same_position_and_another_runs_state_is_refused_unchanged() -> None:
    pos, loop = position()
    ex = SimExecutor(WL, make_curve(), loop.router.config)
    for _ in range(3):
        out = loop.step(pos.loop_state, ex)
        pos.advance(out.state, pos.first_dispatch(out.plan), out.consumed)
    saved = pos.snapshot({"p1": 2}, 4)
    assert (saved.policy, saved.fingerprint, saved.router, saved.control, saved.generation, saved.weight_version) == \
        ("static", pos.fingerprint, pos.loop_state.router, pos.loop_state.control, {"p1": 2}, 4)
    assert pos.step == 3
    fresh, _ = position()
    fresh.restore(saved, loop.router)
    assert fresh.loop_state == pos.loop_state and fresh.step == 3
    other, other_loop = position(replace(CFG, groups=3))
    before = other.loop_state
    with pytest.raises(ConfigError, match="^saved rollout state") as err:
        other.restore(saved, other_loop.router)
    assert "\n" not in str(err.value) and other.loop_state is before


def test_a_consumed_group_is_delayed_by_the_steps_since_its_first_dispatch() -> None:
    pos, loop = position()
    ex = SimExecutor(WL, make_curve(), loop.router.config)
    seen: dict[int, int] = {}
    delays: list[int] = []
    for _ in range(6):
        out = loop.step(pos.loop_state, ex)
        first = pos.first_dispatch(out.plan)
        for r in (*out.plan.tail, *out.plan.bulk):
            seen.setdefault(r.uid, out.plan.step)
        assert first == {r.uid: seen[r.uid] for r in (*out.plan.tail, *out.plan.bulk)}
        delays += [out.plan.step - first[o.ref.uid] for o in out.consumed]
        pos.advance(out.state, first, out.consumed)
    assert max(delays) >= 1 and min(delays) == 0  # cut groups regenerated on the tail pool a step later
