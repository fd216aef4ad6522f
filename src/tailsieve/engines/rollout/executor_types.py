"""The values `EngineExecutor` (`engines/rollout/engine_executor.py`) takes and returns: what to send for a group
(`GroupSpec`, `RequestMode`), one finished member (`Sample`), a cut member kept for a resumed plan (`Carried`), a
step's result with its samples (`ExecutedStep`), and the refusal of a plan it cannot run (`PlanNotRunnable`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from tailsieve.engines.transport.types import EngineError, TopPTokens
from tailsieve.policy.step import GroupRef, StepPlan, StepResult

__all__ = ["Carried", "ExecutedStep", "GroupSpec", "GroupSpecFn", "PlanNotRunnable", "RequestMode", "Sample"]


class PlanNotRunnable(EngineError):
    """A plan this executor cannot run (refused before anything is sent)."""


class RequestMode(StrEnum):
    """How a group's members become HTTP requests."""

    SPLIT = "split"  # one request per member (per-member seed and max_tokens)
    N = "n"  # one request per (group, replica, max_tokens) with n = members there


@dataclass(frozen=True, slots=True)
class GroupSpec:
    """What to send for one group: the prompt, and per member its seed and max_tokens (None: the default)."""

    prompt: str | tuple[tuple[str, str], ...]
    seeds: tuple[int | None, ...]
    max_tokens: tuple[int | None, ...]


@dataclass(frozen=True, slots=True)
class Sample:
    """One finished member, trainer-ready: text, response token ids (when the server returns them), tokens, finish
    reason, where/when, per-token logprobs (when asked for), prompt token ids, and the weight version it was
    generated under (`Rollout.update_weights`)."""

    text: str
    tokens: int
    finish_reason: str | None
    token_ids: tuple[int, ...] | None
    replica: int
    finish_s: float  # since the step started
    attempts: int  # 1 = first try
    logprobs: tuple[float, ...] | None = None
    prompt_token_ids: tuple[int, ...] | None = None
    weight_version: int = 0
    served_version: str | None = None  # the version its server reported with it (SGLang), None where not told
    top_p: TopPTokens | None = None  # top-p kept token ids per generated token (SGLang with slime's patch)


@dataclass(frozen=True, slots=True)
class Carried:
    """One member of a group cut last step: the text and tokens it had generated, its sample if it had finished, and
    the replica and weight version of the request that generated its text (a member cut with its whole budget
    streamed finishes from them: `EngineExecutor._resumed`)."""

    text: str
    tokens: int
    sample: Sample | None
    replica: int = -1  # -1: never sent
    weight_version: int = 0


GroupSpecFn = Callable[[GroupRef, StepPlan], GroupSpec]  # what to send for a group of a plan


@dataclass(frozen=True, slots=True)
class ExecutedStep(StepResult):
    """A step's `StepResult` plus every member's sample (None where unfinished) and fault counts."""

    samples: dict[int, tuple[Sample | None, ...]]
    redispatched: int
    started_at: float  # wall clock (time.time()) at dispatch

    @property
    def result(self) -> StepResult:
        """The plain `StepResult` (0.1 API: `ExecutedStep.result`)."""
        return StepResult(self.step, self.outcomes, self.tail_s, self.bulk_s, self.makespan_s)
