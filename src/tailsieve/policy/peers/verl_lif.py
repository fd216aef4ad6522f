"""`verl-lif`: verl's `GlobalRequestLoadBalancer` (every request to the replica with the fewest in-flight
requests, sticky per request); groups are split over replicas, N groups, nothing cut.

In a synchronous step every request is submitted at t = 0, before any finishes, so "fewest in flight" counts only
what was assigned before it: request k goes to replica k mod R, the router's request round-robin."""

from __future__ import annotations

from tailsieve.policy.peers.peer_policy import PeerPolicy, register_peer
from tailsieve.policy.router import Dispatch


@register_peer("verl-lif")
class VerlLeastInFlight(PeerPolicy):
    """N fresh groups, request round-robin, nothing cut."""

    dispatch = Dispatch.REQUEST
