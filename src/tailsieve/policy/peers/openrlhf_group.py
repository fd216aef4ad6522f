"""`openrlhf-group`: every group to the engine with the fewest unfinished requests; nothing cut. At t = 0 that is
group round-robin, i.e. exactly `uniform` (docs/peers.md)."""

from __future__ import annotations

from tailsieve.policy.peers.peer_policy import PeerPolicy, register_peer
from tailsieve.policy.router import Dispatch


@register_peer("openrlhf-group")
class OpenRlhfGroup(PeerPolicy):
    """N fresh groups, group round-robin, nothing cut."""

    dispatch = Dispatch.GROUP
