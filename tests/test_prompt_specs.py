"""`PromptSpecs` (engines/rollout/prompt_specs.py): what a `Rollout` sends for each planned group: the rendered
prompt (once per prompt), per-member seeds from the run seed, prompt and generation, replayed lengths scaled by
`length_scale`, the sampling params, and the generation counters that only a succeeded step advances (a resumed
group continues the generation it was cut in)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from numpy.typing import NDArray

from tailsieve.engines.rollout.prompt_specs import PromptSpecs, replay_ids
from tailsieve.engines.rollout.prompts import PromptRecord, Template, render
from tailsieve.engines.rollout.rollout_config import RolloutConfig
from tailsieve.engines.transport.engine_client import SamplingParams
from tailsieve.hashing import stable_hash
from tailsieve.policy.step import GroupRef, StepPlan
from tailsieve.policy.stream import StreamState
from tailsieve.workloads import ReplayMode, Workload

PROMPTS = tuple(PromptRecord(f"p{i}", f"what is {i}+{i}?") for i in range(5))
BASE = RolloutConfig(groups=2, group_size=3, rho=0.5, policy="static", q=1, m=1,
                     sampling=SamplingParams(max_tokens=60, stop=("</s>",)))


class Lengths:
    """A length source: generation a of prompt w<k> at step s gives member j 10·k + 100·a + s + j tokens."""

    def lengths(self, prompt_id: str, generation: int, step: int, group_size: int) -> NDArray[np.int64]:
        k = int(prompt_id[1:])
        return np.array([10 * k + 100 * generation + step + j for j in range(group_size)], dtype=np.int64)


WORKLOAD = Workload(name="w", prompts=("w0", "w1", "p3"), max_length=1000, mode=ReplayMode.RECORDED, seed=0,
                    source=Lengths())


def plan(step: int, refs: tuple[GroupRef, ...], resume: dict[int, tuple[int, ...]] | None = None) -> StepPlan:
    return StepPlan(step, refs[:1], refs[1:], {r.uid: (0, 0, 0) for r in refs}, (0,), (1,), 1, False,
                    StreamState(0, False, 0, len(PROMPTS)), (), frozenset(), resume or {})


def test_a_prompt_is_rendered_with_the_runs_template_once() -> None:
    specs = PromptSpecs(PROMPTS, replace(BASE, template=Template.MATH), 3)
    first = specs.prompt("p2")
    assert first == render(PROMPTS[2], Template.MATH) and first != PROMPTS[2].text
    assert specs.prompt("p2") is first
    assert PromptSpecs(PROMPTS, BASE, 3).prompt("p2") == "what is 2+2?"


def test_seeds_follow_the_run_seed_prompt_and_generation_and_are_none_without_a_seed() -> None:
    specs = PromptSpecs(PROMPTS, replace(BASE, seed=7), 3)
    ref = GroupRef(4, "p1")
    h = stable_hash("7|p1|2")
    assert specs.spec(ref, 2, 0).seeds == tuple(int((h + j * 0x9E3779B1) % (2**31 - 1)) for j in range(3))
    assert len(set(specs.spec(ref, 2, 0).seeds)) == 3  # every member its own draw
    assert specs.spec(ref, 2, 0).seeds != specs.spec(ref, 3, 0).seeds
    assert specs.spec(ref, 2, 5).seeds == specs.spec(ref, 2, 0).seeds  # the step does not enter the seed
    unseeded = PromptSpecs(PROMPTS, replace(BASE, seed=None), 3).spec(ref, 0, 0)
    assert unseeded.seeds == (None,) * 3 and unseeded.max_tokens == (None,) * 3 and unseeded.prompt == "what is 1+1?"


def test_replayed_lengths_come_from_the_workload_prompt_each_prompt_replays_scaled() -> None:
    assert replay_ids(PROMPTS, WORKLOAD) == {"p0": "w0", "p1": "w1", "p2": "p3", "p3": "p3", "p4": "w1"}
    assert replay_ids(PROMPTS, None) == {}
    specs = PromptSpecs(PROMPTS, replace(BASE, replay=WORKLOAD), 3)
    assert specs.spec(GroupRef(0, "p1"), 2, 4).max_tokens == (214, 215, 216)  # w1: 10 + 200 + 4 + j
    half = PromptSpecs(PROMPTS, replace(BASE, replay=WORKLOAD, length_scale=0.5), 3)
    assert half.spec(GroupRef(0, "p0"), 0, 1).max_tokens == (1, 1, 2)  # round(0.5), round(1.0), round(1.5); >= 1


def test_under_replay_every_request_ends_at_its_max_tokens() -> None:
    assert PromptSpecs(PROMPTS, BASE, 3).params() is BASE.sampling
    p = PromptSpecs(PROMPTS, replace(BASE, replay=WORKLOAD), 3).params()
    assert p.ignore_eos and p.stop == () and p.max_tokens == 60 and p.temperature == BASE.sampling.temperature


def test_generation_counters_advance_per_draw_and_only_when_a_step_commits() -> None:
    specs = PromptSpecs(PROMPTS, replace(BASE, seed=1), 3)
    p0 = plan(0, (GroupRef(0, "p0"), GroupRef(1, "p1"), GroupRef(2, "p0")))
    assert specs.generations(p0) == ({0: 0, 1: 0, 2: 1}, {"p0": 2, "p1": 1})
    assert specs.group_spec(GroupRef(2, "p0"), p0) == specs.spec(GroupRef(2, "p0"), 1, 0)
    assert specs.generation == {}  # not before the step succeeds
    specs.commit(p0)
    assert specs.generation == {"p0": 2, "p1": 1}
    again = plan(0, (GroupRef(3, "p0"), GroupRef(4, "p1")))  # a failed step 0 run again: its draws were not counted
    specs.restore({})
    assert specs.generations(again) == ({3: 0, 4: 0}, {"p0": 1, "p1": 1})


def test_a_resumed_group_continues_the_generation_it_was_cut_in() -> None:
    specs = PromptSpecs(PROMPTS, replace(BASE, replay=WORKLOAD), 3)
    specs.restore({"p0": 3, "p1": 1})
    p = plan(4, (GroupRef(7, "p1"), GroupRef(5, "p0"), GroupRef(8, "p0")), resume={5: (4, 9, 1)})
    assert specs.generations(p) == ({7: 1, 5: 2, 8: 3}, {"p0": 4, "p1": 2})
    assert specs.group_spec(GroupRef(5, "p0"), p).max_tokens == specs.spec(GroupRef(5, "p0"), 2, 4).max_tokens
