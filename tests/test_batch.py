"""The batch's parts from a step (engines/rollout/batch.py): `group_results` (the consumed groups in order, their
finished samples, prompt as sent and bias weight) and `truncated` (which samples hit the length cap: the finish
reason when every sample has one, else tokens against max_tokens; under length replay against the workload's cap ×
length_scale, unknown without one). The batch's own properties: tests/test_weight_versions.py."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from numpy.typing import NDArray

from tailsieve.engines.rollout.batch import GroupResult, group_results, truncated
from tailsieve.engines.rollout.engine_executor import Sample
from tailsieve.engines.rollout.rollout_config import RolloutConfig
from tailsieve.engines.transport.engine_client import SamplingParams
from tailsieve.policy.step import GroupOutcome, GroupRef, GroupStatus, Pool
from tailsieve.workloads import ReplayMode, Workload

CFG = RolloutConfig(groups=2, group_size=2, rho=0.5, policy="static", q=1, m=1, sampling=SamplingParams(max_tokens=50))


def sample(tokens: int, finish: str | None) -> Sample:
    return Sample("x" * tokens, tokens, finish, None, 0, 0.5, 1)


def group(*samples: Sample) -> GroupResult:
    return GroupResult(0, "p0", "p", Pool.BULK, 1.0, samples)


def test_consumed_groups_keep_their_order_samples_prompt_and_weight() -> None:
    a, b = GroupRef(4, "p4", 1), GroupRef(2, "p2")
    consumed = (GroupOutcome(a, Pool.TAIL, GroupStatus.DONE, 3.5, (5, 7), 2),
                GroupOutcome(b, Pool.BULK, GroupStatus.DONE, None, (1, 2), 2))
    samples = {4: (sample(5, "stop"), sample(7, "length")), 2: (sample(1, "stop"), sample(2, "stop")),
               9: (None, sample(3, None))}
    out = group_results(consumed, samples, lambda pid: f"<{pid}>", [0.5, 1.5])
    assert [(g.uid, g.prompt_id, g.prompt, g.pool, g.finish_s, g.lengths, g.weight) for g in out] == [
        (4, "p4", "<p4>", Pool.TAIL, 3.5, (5, 7), 0.5), (2, "p2", "<p2>", Pool.BULK, 0.0, (1, 2), 1.5)]
    assert [g.weight for g in group_results(consumed, samples, str)] == [None, None]
    partial = GroupOutcome(GroupRef(9, "p9"), Pool.BULK, GroupStatus.DONE, 1.0, (3,), 1)
    assert group_results((partial,), samples, str)[0].samples == (sample(3, None),)  # unfinished members left out


def test_the_finish_reason_decides_when_every_sample_has_one_else_the_token_count() -> None:
    groups = (group(sample(50, "stop"), sample(12, "length")), group(sample(3, "stop"), sample(4, "stop")))
    assert truncated(groups, CFG) == ((False, True), (False, False))
    mixed = (group(sample(50, None), sample(49, "stop")), group(sample(60, "length")))
    assert truncated(mixed, CFG) == ((True, False), (True,))


class Flat:
    def lengths(self, prompt_id: str, generation: int, step: int, group_size: int) -> NDArray[np.int64]:
        return np.full(group_size, 10, dtype=np.int64)


def test_under_replay_the_cap_is_the_workloads_scaled_and_unknown_without_one() -> None:
    capped = Workload("w", ("p0",), 40, ReplayMode.RECORDED, 0, Flat())
    groups = (group(sample(20, "length"), sample(19, "length"), sample(40, "length")),)
    assert truncated(groups, replace(CFG, replay=capped, length_scale=0.5)) == ((True, False, True),)
    uncapped = Workload("w", ("p0",), None, ReplayMode.RECORDED, 0, Flat())
    assert truncated(groups, replace(CFG, replay=uncapped)) is None
