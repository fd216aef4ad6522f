"""`april-drop`: slime's APRIL without `--partial-rollout`: as `april-partial`, but the aborted groups' prompts are
dropped (never consumed; `PeerState.dropped`, the `dropped_prompt_share` column) and their tokens wasted."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tailsieve.policy.peers.april_partial import AprilPartial
from tailsieve.policy.peers.peer_policy import Carry, register_peer
from tailsieve.policy.step import GroupOutcome


@register_peer("april-drop")
class AprilDrop(AprilPartial):
    """Over-sample E groups; drop the cut ones."""

    resumes = False

    def carry(self, cut: Sequence[GroupOutcome], first: Mapping[int, int], step: int) -> Carry:
        """Nothing waits; every cut prompt is dropped."""
        return Carry((), len(cut))
