"""What `Rollout.step` returns: `Batch` (N complete groups, the step record, fidelity numbers) of `GroupResult`s, and
the trainer-ready view of it (`TrainerSample`: prompt and response token ids, per-token logprobs, finish reason,
weight version, group id), the same for every engine backend; the consumed groups' results from a step's samples
(`group_results`) and which samples hit the length cap (`truncated`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tailsieve.engines.rollout.engine_executor import Sample
from tailsieve.engines.rollout.prompts import Messages
from tailsieve.engines.rollout.rollout_config import RolloutConfig
from tailsieve.engines.rollout.weight_sync import disagrees
from tailsieve.loop import StepRecord
from tailsieve.policy.step import GroupOutcome, Pool


@dataclass(frozen=True, slots=True)
class TrainerSample:
    """One consumed response as a trainer takes it (the RL framework's sample): ids, logprobs, version, group."""

    group_uid: int
    prompt_id: str
    index: int  # member within the group
    prompt_token_ids: tuple[int, ...] | None
    response_token_ids: tuple[int, ...] | None
    logprobs: tuple[float, ...] | None
    text: str
    finish_reason: str | None
    weight_version: int
    pool: Pool

    def to_json(self) -> dict[str, Any]:
        """Plain JSON-able dict (lists for the id and logprob tuples)."""
        return {"group_uid": self.group_uid, "prompt_id": self.prompt_id, "index": self.index,
                "prompt_token_ids": _list(self.prompt_token_ids), "response_token_ids": _list(self.response_token_ids),
                "logprobs": _list(self.logprobs), "text": self.text, "finish_reason": self.finish_reason,
                "weight_version": self.weight_version, "pool": self.pool.value}


def _list(t: tuple[Any, ...] | None) -> list[Any] | None:
    return None if t is None else list(t)


@dataclass(frozen=True, slots=True)
class GroupResult:
    """One complete group: prompt, pool it ran in, completion time and its G samples."""

    uid: int
    prompt_id: str
    prompt: str | Messages
    pool: Pool
    finish_s: float
    samples: tuple[Sample, ...]
    weight: float | None = None  # bias-correction weight (mean 1 over the batch); None when off

    @property
    def texts(self) -> tuple[str, ...]:
        """Generated texts."""
        return tuple(s.text for s in self.samples)

    @property
    def lengths(self) -> tuple[int, ...]:
        """Generated tokens per sample."""
        return tuple(s.tokens for s in self.samples)

    @property
    def finish_reasons(self) -> tuple[str | None, ...]:
        """Finish reason per sample (stop, length, …)."""
        return tuple(s.finish_reason for s in self.samples)


@dataclass(frozen=True, slots=True)
class Batch:
    """What `Rollout.step` returns: N complete groups (tail pool first), the step record, every outcome, and the
    step's fidelity numbers that need no uniform reference (redraws, truncation, wasted tokens)."""

    step: int
    groups: tuple[GroupResult, ...]
    record: StepRecord
    outcomes: tuple[GroupOutcome, ...]
    redispatched: int
    started_at: float
    down: tuple[int, ...]  # replicas down when the step ended
    restart_s: float = 0.0  # replica restarts before the step (pool moves); included in record.makespan_s
    redraws: tuple[int, ...] = ()  # per group: times its prompt draw was cut before this step (GroupRef.cuts)
    truncated: tuple[tuple[bool, ...], ...] | None = None  # per group and sample: hit the length cap; None: unknown
    weight_version: int = 0  # the weights the replicas served during the step (`Rollout.update_weights`)
    # batch fidelity per consumed group (docs/peers.md): steps since its prompt was first dispatched, tokens made in
    # earlier steps (resumed prefixes); and the prompts dropped unconsumed this step
    delays: tuple[int, ...] = ()
    offpolicy: tuple[int, ...] = ()
    dropped: int = 0

    @property
    def weights(self) -> tuple[float, ...] | None:
        """Bias-correction weight per group (mean 1), None when the run has it off."""
        ws = tuple(g.weight for g in self.groups)
        return None if any(w is None for w in ws) else tuple(float(w or 0.0) for w in ws)

    @property
    def redraws_max(self) -> int:
        """Most redraws of a consumed group (0 when none was cut before)."""
        return max(self.redraws, default=0)

    @property
    def redraws_mean(self) -> float:
        """Mean redraws over the consumed groups."""
        return sum(self.redraws) / len(self.redraws) if self.redraws else 0.0

    @property
    def truncated_share(self) -> float | None:
        """Share of the step's responses at the length cap (None when unknown)."""
        if self.truncated is None:
            return None
        flat = [t for g in self.truncated for t in g]
        return sum(flat) / len(flat) if flat else 0.0

    @property
    def wasted_tokens(self) -> int:
        """Tokens of the groups cut this step (the record's)."""
        return self.record.wasted_tokens

    @property
    def stale_samples(self) -> int:
        """Consumed samples generated under weights older than the step's `weight_version`, or whose server reported
        another version than the one they were sent under (`served_stale`); 0: on-policy."""
        return sum(s.weight_version < self.weight_version or disagrees(s.served_version, s.weight_version)
                   for g in self.groups for s in g.samples)

    @property
    def served_stale(self) -> int:
        """Consumed samples whose server reported (with the sample: SGLang's `meta_info.weight_version`) another
        version than the run's when they were sent."""
        return sum(disagrees(s.served_version, s.weight_version) for g in self.groups for s in g.samples)

    def trainer_samples(self) -> tuple[TrainerSample, ...]:
        """Every consumed sample, group by group (tail pool first), as the trainer takes it."""
        return tuple(TrainerSample(g.uid, g.prompt_id, j, s.prompt_token_ids, s.token_ids, s.logprobs, s.text,
                                   s.finish_reason, s.weight_version, g.pool)
                     for g in self.groups for j, s in enumerate(g.samples))


def group_results(consumed: Sequence[GroupOutcome], samples: Mapping[int, Sequence[Sample | None]],
                  prompt: Callable[[str], str | Messages],
                  weights: Sequence[float | None] | None = None) -> tuple[GroupResult, ...]:
    """The consumed groups (in order) with their finished samples, prompt as sent and bias weight (None: off)."""
    ws = weights if weights is not None else [None] * len(consumed)
    return tuple(GroupResult(o.ref.uid, o.ref.prompt_id, prompt(o.ref.prompt_id), o.pool, float(o.finish_s or 0.0),
                             tuple(s for s in samples[o.ref.uid] if s is not None), w)
                 for o, w in zip(consumed, ws, strict=True))


def truncated(groups: Sequence[GroupResult], config: RolloutConfig) -> tuple[tuple[bool, ...], ...] | None:
    """Which samples hit the length cap: finish_reason "length" when every sample has one (exact), else tokens
    >= max_tokens; with length replay (every request ends at its replayed max_tokens) tokens >= the workload's
    cap × length_scale, None when the workload has no cap."""
    if config.replay is not None:
        w = config.replay
        if w.max_length is None:
            return None
        cap = max(1, round(w.max_length * config.length_scale))
        return tuple(tuple(s.tokens >= cap for s in g.samples) for g in groups)
    if all(s.finish_reason is not None for g in groups for s in g.samples):
        return tuple(tuple(s.finish_reason == "length" for s in g.samples) for g in groups)
    cap = config.sampling.max_tokens
    return tuple(tuple(s.tokens >= cap for s in g.samples) for g in groups)
