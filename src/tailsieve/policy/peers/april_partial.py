"""`april-partial`: slime's APRIL with partial rollout (`--over-sampling-batch-size`, `--partial-rollout`).

N + E groups start (the buffer first, then fresh prompts: slime pops the buffer before new prompts), the step ends
when N are complete, the rest are aborted and go back to the buffer; next step they run first and *resume from the
tokens they had* (`StepPlan.resume`; members that had finished stay finished). The resumed prefixes were made by an
older policy: off-policy tokens (`PeerStep.offpolicy`). Sources and simplifications: docs/peers.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tailsieve.policy.peers.peer_policy import Carry, Lineup, PeerPolicy, PeerState, Waiting, recut, register_peer
from tailsieve.policy.step import GroupOutcome


@register_peer("april-partial")
class AprilPartial(PeerPolicy):
    """Over-sample E groups; carry the cut ones with their tokens and resume them first next step."""

    resumes = True

    def lineup(self, state: PeerState) -> Lineup:
        """The whole buffer first, then fresh prompts up to N + E; N must complete."""
        n = self.router.groups
        return Lineup(state.waiting, (), n + self.peer.extra(self.router), n)

    def carry(self, cut: Sequence[GroupOutcome], first: Mapping[int, int], step: int) -> Carry:
        """Every cut group waits with the tokens it had (its prefix)."""
        return Carry(tuple(Waiting(recut(o.ref), first.get(o.ref.uid, step), o.lengths) for o in cut))

