"""`rollpacker`: RollPacker's tail batching (on ROLL). Short rounds start N + E fresh groups and keep the first N
complete; the others are deferred and later regenerated from scratch in a *long round* made only of deferred prompts
and run to completion: whenever N deferred prompts wait (default), or every `long_round_period` steps (topped up
with fresh prompts when fewer than N wait). Sources and simplifications: docs/peers.md."""

from __future__ import annotations

from tailsieve.policy.peers.peer_policy import Lineup, PeerPolicy, PeerState, register_peer


@register_peer("rollpacker")
class RollPacker(PeerPolicy):
    """Short rounds over-sample and defer; long rounds run the deferred prompts to completion."""

    def long_round(self, state: PeerState) -> bool:
        """Whether this step is a long round (only deferred prompts, run to completion)."""
        if not state.waiting:
            return False
        period = self.peer.long_round_period
        if period is None:
            return len(state.waiting) >= self.router.groups
        return (state.step + 1) % period == 0

    def lineup(self, state: PeerState) -> Lineup:
        """Long round: the first N deferred prompts (topped up with fresh ones), all complete; short round: N + E
        fresh prompts, N complete, the deferred keep waiting."""
        n = self.router.groups
        if self.long_round(state):
            return Lineup(state.waiting[:n], state.waiting[n:], n, None)
        return Lineup((), state.waiting, n + self.peer.extra(self.router), n)
