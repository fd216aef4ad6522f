"""slime's `Sample`: the real class when slime is importable, else a stand-in with the fields this integration
reads and writes (the names and meaning of `slime.utils.types.Sample`). Mutable like slime's own: slime fills in
rewards and loss masks after the rollout function returns."""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any


class SampleStatus(Enum):
    """slime's `Sample.Status` values."""

    PENDING = "pending"
    COMPLETED = "completed"
    TRUNCATED = "truncated"
    ABORTED = "aborted"
    FAILED = "failed"


@dataclass
class SlimeSample:
    """Stand-in for `slime.utils.types.Sample` (the fields a rollout function fills)."""

    Status = SampleStatus

    group_index: int | None = None
    index: int | None = None
    prompt: str | list[dict[str, str]] = ""
    tokens: list[int] = field(default_factory=list)  # prompt ids, then prompt + response ids after generation
    response: str = ""
    response_length: int = 0
    label: str | None = None
    reward: float | dict[str, Any] | None = None
    loss_mask: list[int] | None = None
    weight_versions: list[str] = field(default_factory=list)
    rollout_log_probs: list[float] | None = None
    rollout_top_p_token_ids: list[int] | None = None  # with --rollout-top-p < 1: the kept ids, CSR by token
    rollout_top_p_token_offsets: list[int] | None = None  # response_length + 1 entries
    status: SampleStatus = SampleStatus.PENDING
    metadata: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (status as its value), as slime's `Sample.to_dict`."""
        out = asdict(self)
        out["status"] = self.status.value
        return out

    @staticmethod
    def from_dict(data: dict[str, Any]) -> SlimeSample:
        """Inverse of `to_dict` (unknown keys dropped)."""
        known = {k: v for k, v in data.items() if k in SlimeSample.__dataclass_fields__}
        known["status"] = SampleStatus(known.get("status", "pending"))
        return SlimeSample(**known)


def sample_class() -> Any:
    """slime's `Sample` when importable, else `SlimeSample`."""
    try:
        from slime.utils.types import Sample  # type: ignore[import-not-found]
    except ImportError:
        return SlimeSample
    return Sample


def sample_to_dict(sample: Any) -> dict[str, Any]:
    """A sample (slime's or the stand-in) as a dict."""
    out: dict[str, Any] = sample.to_dict()
    return out


def sample_from_dict(data: dict[str, Any]) -> Any:
    """A sample of `sample_class()` from `sample_to_dict`'s output."""
    return sample_class().from_dict(copy.deepcopy(data))


def status_for(sample: Any, finish_reason: str | None) -> Any:
    """slime's status for a finish reason: length → TRUNCATED, abort → ABORTED, anything else → COMPLETED."""
    status = type(sample).Status
    if finish_reason == "length":
        return status.TRUNCATED
    if finish_reason == "abort":
        return status.ABORTED
    return status.COMPLETED
