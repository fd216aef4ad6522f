"""The executor's values (`engines/rollout/executor_types.py`): `ExecutedStep.result`, the request modes, the
refusal's class, and the re-exports from `engine_executor` that older imports use."""

from __future__ import annotations

import dataclasses

import pytest

from tailsieve.engines.rollout import engine_executor, executor_types
from tailsieve.engines.rollout.executor_types import Carried, ExecutedStep, PlanNotRunnable, RequestMode, Sample
from tailsieve.engines.transport.types import EngineError
from tailsieve.policy.step import GroupOutcome, GroupRef, GroupStatus, Pool, StepResult


def _sample(tokens: int) -> Sample:
    return Sample(text="x" * tokens, tokens=tokens, finish_reason="stop", token_ids=None, replica=1, finish_s=2.5,
                  attempts=1)


def test_an_executed_steps_result_is_its_plain_step_result() -> None:
    outcome = GroupOutcome(GroupRef(3, "p3"), Pool.BULK, GroupStatus.DONE, 2.5, (4, 7), 2)
    step = ExecutedStep(5, (outcome,), 0.0, 2.5, 2.5, samples={3: (_sample(4), _sample(7))}, redispatched=1,
                        started_at=1e9)
    plain = step.result
    assert type(plain) is StepResult
    assert plain == StepResult(5, (outcome,), 0.0, 2.5, 2.5)
    assert isinstance(step, StepResult)  # the loop takes it where it takes a StepResult


def test_request_modes_parse_from_their_flag_values() -> None:
    assert [RequestMode(v) for v in ("split", "n")] == [RequestMode.SPLIT, RequestMode.N]
    with pytest.raises(ValueError, match="'group'"):
        RequestMode("group")


def test_the_values_are_frozen_and_a_refusal_is_an_engine_error() -> None:
    carried = Carried("partial text", 12, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        carried.tokens = 13  # type: ignore[misc]
    assert issubclass(PlanNotRunnable, EngineError)


@pytest.mark.parametrize("name", executor_types.__all__)
def test_engine_executor_re_exports_every_value(name: str) -> None:
    assert getattr(engine_executor, name) is getattr(executor_types, name)
